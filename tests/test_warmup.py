"""The first compile is visible (numba's compile event), and `quantkit warmup` compiles ahead of time."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numba
import numpy as np
from numba.core import event

from quantkit import jit
from quantkit.formats.locate import bundled_model
from quantkit.pipelines.warmup import warm_codecs
from tests.conftest import run_cli

SAMPLE = Path(__file__).parent / "data" / "perplexity" / "evaluation-sample.txt"


def test_compile_notice_names_the_types(monkeypatch):
    monkeypatch.setenv("QUANTKIT_COMPILE_NOTICE", "1")
    monkeypatch.setattr(jit, "_NOTICE", None)
    buf = io.StringIO()
    notice = jit.announce_compiles(buf)
    try:
        def rowdot__Q4_K_vnni_probe(x):   # a fresh function: numba must compile it
            return x + 1

        assert numba.njit(cache=False)(rowdot__Q4_K_vnni_probe)(np.int64(1)) == 2
        assert notice.count >= 1 and notice.types == ["Q4_K"]
        jit.compiles_done()
    finally:
        event.unregister("numba:compile", jit._LISTENER)
    text = buf.getvalue()
    assert text.startswith("compiling kernels (first run only")          # said when it starts
    assert "compiling kernels for Q4_K (first run only, cached for later runs) -- 1 done" in text
    buf.truncate(0)
    jit.compiles_done()                                                      # nothing compiled since
    assert buf.getvalue() == ""


def test_compile_notice_off(monkeypatch):
    monkeypatch.setenv("QUANTKIT_COMPILE_NOTICE", "0")
    monkeypatch.setattr(jit, "_NOTICE", None)
    assert jit.announce_compiles(io.StringIO()) is None


def test_warm_codecs_runs_each_type():
    assert warm_codecs(types=["Q4_0", "Q6_K"]) == ["Q4_0", "Q6_K"]


# In one fresh process: `quantkit warmup -m MODEL`, then the commands it promises to have warmed. numba
# resolves a kernel the first time a process calls it, through numba.core.caching.Cache.load_overload
# (a load from its cache, or a miss that it then compiles, raising numba:compile): both are counted.
# Prints how many kernels warmup resolved, then every one the later commands still had to.
_AFTER_WARMUP = """
import sys

import quantkit.jit  # noqa: F401  (its own wrapper of Cache.load_overload first; the count wraps that)
from click.testing import CliRunner
from numba.core import caching, event
from quantkit.cli import main

model, text = sys.argv[1:]
resolved = []
load = caching.Cache.load_overload


def counted(self, sig, target_context):
    resolved.append(self._name)
    return load(self, sig, target_context)


class Compiles(event.Listener):
    def on_start(self, ev):
        resolved.append(ev.data["dispatcher"].py_func.__qualname__)

    def on_end(self, ev):
        pass


caching.Cache.load_overload = counted
event.register("numba:compile", Compiles())


def invoke(*args):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    assert res.exit_code == 0, res.output


invoke("warmup", "--no-codecs", "-t", 1, "-m", model)
print(len(resolved))
n = len(resolved)
for prompt in ("Hello there", "one two three four five six"):   # under 4 tokens, and from 4 on
    invoke("run", "-m", model, "-p", prompt, "-n", 2, "--temp", 0, "-t", 1)
invoke("bench", "-m", model, "-p", 32, "-n", 2, "-r", 1, "-t", 1)
invoke("perplexity", "-m", model, "-f", text, "-c", 128, "--chunks", 1, "-t", 1)
for name in resolved[n:]:
    print(name)
"""


def test_warmup_leaves_run_bench_perplexity_nothing_to_build(tmp_path):
    """After `quantkit warmup -m MODEL` the same process's run (a prompt of a few tokens and of more, with
    the decode steps after), bench and perplexity on that model resolve no kernel: warmup built them all,
    so with a cold cache none of them compiles. The timeout only guards against a hang."""
    script = tmp_path / "after_warmup.py"
    script.write_text(_AFTER_WARMUP, encoding="utf-8")
    res = subprocess.run([sys.executable, str(script), bundled_model(), SAMPLE], capture_output=True, text=True,
                         timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    warmed, *missed = res.stdout.splitlines()
    assert int(warmed) > 0                # the count sees warmup's own kernels
    assert missed == [], f"kernels warmup left to {len(missed)} later calls: {missed}"


def test_warmup_missing_model_is_a_usage_error(tmp_path):
    res = run_cli(["warmup", "-m", tmp_path / "nope.gguf"])
    assert res.exit_code == 2
