"""The first compile is visible (numba's compile event), and `quantkit warmup` compiles ahead of time."""

from __future__ import annotations

import io

import numba
import numpy as np
from numba.core import event

from quantkit import jit
from quantkit.formats.locate import bundled_model
from quantkit.pipelines.warmup import warm_codecs
from tests.conftest import run_cli


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


def test_warmup_command_on_the_bundled_model():
    res = run_cli(["warmup", "--no-codecs", "-t", "1", "-m", bundled_model()])
    assert res.exit_code == 0, res.output
    assert "model kernels ready" in res.output


def test_warmup_missing_model_is_a_usage_error(tmp_path):
    res = run_cli(["warmup", "-m", tmp_path / "nope.gguf"])
    assert res.exit_code == 2
