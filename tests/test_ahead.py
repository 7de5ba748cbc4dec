"""Codec kernels compiled ahead by a helper process (quantkit.quants.ahead) are the very builds the
quantize pipeline then loads: after the helper, quantizing compiles nothing of that codec, with or without
importance weights, and gives gguf-py's bytes."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants as gq

from quantkit.quants import ahead

_PIPELINE_CALLS = """
import json, sys
import numpy as np
from numba.core import event
from gguf import GGMLQuantizationType as T
from quantkit.quants import ahead, traits

built = []
class Listener(event.Listener):
    def on_start(self, ev):
        built.append(ev.data["dispatcher"].py_func.__name__)
    def on_end(self, ev):
        pass
event.register("numba:compile", Listener())
t = T[sys.argv[1]]
cached = ahead.cached(t)
rng = np.random.default_rng(0)
x = rng.standard_normal((64, 512)).astype(np.float32)
cls = traits(t)
y = np.empty((64, cls.row_bytes(512)), np.uint8)
y2 = np.empty_like(y)
cls.quantize_into(x, y, None)                                              # as convert_tensor, no imatrix
cls.quantize_into(x, y2, rng.uniform(0.5, 2.0, 512).astype(np.float32))    # with one
np.save(sys.argv[2], y)
print(json.dumps({"cached": cached, "built": built}))
"""


def _run(args, cache, **kw):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache), "QUANTKIT_COMPILE_NOTICE": "0"}
    res = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=600, **kw)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_helper_builds_what_the_pipeline_loads(tmp_path):
    import json

    cache = tmp_path / "cache"
    script = tmp_path / "calls.py"
    script.write_text(_PIPELINE_CALLS)
    _run(["-m", "quantkit.quants.ahead", "Q4_0"], cache)
    out = json.loads(_run([str(script), "Q4_0", str(tmp_path / "y.npy")], cache).strip().splitlines()[-1])
    assert out["cached"]
    assert not [n for n in out["built"] if "Q4_0" in n or "q4_0" in n], out["built"]
    x = np.random.default_rng(0).standard_normal((64, 512)).astype(np.float32)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), gq.quantize(x, T.Q4_0))


def test_no_helper_for_less_than_two_missing(monkeypatch):
    missing = {T.Q4_K}
    monkeypatch.setattr(ahead, "cached", lambda t: t not in missing)
    assert ahead.start([T.Q4_K, T.Q6_K, T.Q4_K]) is None
    ahead.stop(None)


def test_helper_gets_the_missing_last_needed_first(monkeypatch):
    calls = []

    class Proc:
        def __init__(self, argv, **kw):
            calls.append(argv)

        def poll(self):
            return 0

    monkeypatch.setattr(ahead, "cached", lambda t: t == T.Q8_0)
    monkeypatch.setattr(ahead, "get_threads", lambda: 2)
    monkeypatch.setattr(ahead.subprocess, "Popen", Proc)
    ahead.stop(ahead.start([T.Q8_0, T.Q5_0, T.Q6_K, T.Q5_0, T.Q4_K]))
    assert calls[0][-4:] == ["quantkit.quants.ahead", "Q4_K", "Q6_K", "Q5_0"]
