"""CPU levels (quantkit/isa.py) and the one kernel cache (quantkit/cache.py, jit.specialize's digest,
jit's cross-process compile lock)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from quantkit import __version__, isa
from quantkit.errors import QuantkitError
from quantkit.jit import build_digest, specialize

ROOT = Path(__file__).resolve().parent.parent


def _python(code: str, env: dict, *args, script: Path | None = None, timeout=300):
    """Run ``code`` in a fresh interpreter (from the file ``script`` when given: numba caches only
    functions defined in a file), with os.environ less numba's cache and CPU settings, plus ``env``."""
    full = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "NUMBA_CPU_FEATURES")}
    full.update(env)
    if script is None:
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=full, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
    script.write_text(textwrap.dedent(code))
    return subprocess.Popen([sys.executable, str(script), *args], env=full, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


# -- levels ------------------------------------------------------------------------------------------

def test_runnable_levels_are_in_order_and_end_with_generic():
    order = [lv.name for lv in isa.LEVELS]
    run = isa.runnable()
    assert run[-1] == "generic" and list(run) == sorted(run, key=order.index)
    assert isa.best() == run[0]
    for name in run:   # a level the host runs: everything it requires is there
        assert isa.BY_NAME[name].requires <= isa.host_features()


@pytest.mark.parametrize("value, message", [("avx9000", "is not a kernel level"),
                                            ("neon" if isa.ARCH == "x86" else "avx2", "cannot run it")])
def test_a_level_that_cannot_be_forced_is_one_clear_line(monkeypatch, value, message):
    monkeypatch.setenv("QUANTKIT_KERNELS", value)
    with pytest.raises(QuantkitError, match=message):
        isa.selected()


@pytest.mark.parametrize("level", isa.runnable())
def test_a_forced_level_holds_llvm_to_its_features(monkeypatch, level):
    monkeypatch.setenv("QUANTKIT_KERNELS", level)
    feats = isa.target_features()
    assert isa.BY_NAME[level].requires <= feats
    assert not any(f.startswith(("avx512", "amx")) for f in feats) or level == "avx512vnni"
    spec = isa.numba_cpu_features()
    if spec is None:   # the host's best level, and numba's own view of the host has every feature
        assert level == isa.best()
    else:   # every feature above the level is turned off for numba, every one it uses is on
        off = {f[1:] for f in spec.split(",") if f.startswith("-")}
        on = {f[1:] for f in spec.split(",") if f.startswith("+")}
        assert isa.host_features() - feats <= off and feats <= on


def test_arm_features_llvm_does_not_report_come_from_the_kernel(tmp_path):
    """LLVM's host query on AArch64 Linux never reports the dot product; the kernel's hwcaps do."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nFeatures\t: fp asimd crc32 atomics asimdhp asimddp\n"
                    "CPU implementer\t: 0x41\n")
    got = isa._arm_hwcaps(str(info))
    assert got["dotprod"] and got["fullfp16"] and not got["i8mm"] and not got["sve"]
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2\n")   # an x86 cpuinfo: nothing to add
    assert isa._arm_hwcaps(str(info)) == {}
    assert isa._arm_hwcaps(str(tmp_path / "absent")) == {}


def test_forced_avx2_process_builds_avx2_kernels():
    if "avx2" not in isa.runnable():
        pytest.skip("this CPU cannot run AVX2")
    r = _python("""
        import numba
        from quantkit.kernels import ir
        print(ir.default_variant(), ir.HAS_VNNI, ir.HAS_VNNI512, "-avx512f" in (numba.config.CPU_FEATURES or "-avx512f"))
    """, {"QUANTKIT_KERNELS": "avx2", "NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", "")})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["avx2", "False", "False", "True"]


# -- the cache folder --------------------------------------------------------------------------------

def test_commands_by_hand_use_the_per_user_folder(tmp_path):
    """Without NUMBA_CACHE_DIR, kernels go to the user's cache, one folder per version and level, and
    `quantkit cache` shows and clears it."""
    env = {"XDG_CACHE_HOME": str(tmp_path), "QUANTKIT_COMPILE_NOTICE": "0"}
    want = tmp_path / "quantkit" / __version__ / isa.selected()
    r = _python("""
        import numpy as np
        from quantkit.jit import specialize
        def body(x):
            return x * K
        f = specialize(body, "cache_probe", K=3)
        assert f(np.int64(2)) == 6
        import numba; print(numba.config.CACHE_DIR)
    """, env, script=tmp_path / "probe.py")
    out, err = r.communicate(timeout=300)
    assert r.returncode == 0, err
    assert Path(out.strip()) == want
    assert any(want.rglob("*.nbi")), "the kernel's index was not written there"
    show = subprocess.run([sys.executable, "-m", "quantkit", "cache"], env={**os.environ, **env, "NUMBA_CACHE_DIR": ""},
                          capture_output=True, text=True, cwd=ROOT)
    assert show.returncode == 0 and f"kernel cache: {want}" in show.stdout, show.stdout + show.stderr
    clear = subprocess.run([sys.executable, "-m", "quantkit", "cache", "--clear"],
                           env={**os.environ, **env, "NUMBA_CACHE_DIR": ""}, capture_output=True, text=True, cwd=ROOT)
    assert clear.returncode == 0 and not want.exists(), clear.stdout + clear.stderr


def test_two_processes_compile_a_kernel_once(tmp_path):
    """Two processes that need the same uncached kernel at the same moment: one compiles it, the other
    waits for the compile lock and loads what the first saved."""
    code = """
        import os, sys, time
        import numpy as np
        from quantkit.jit import specialize
        def body(x):
            s = 0.0
            for i in range(x.shape[0]):
                s += np.sin(x[i]) * np.cos(x[i]) + np.exp(-x[i] * x[i])
            return s
        f = specialize(body, "lock_probe", parallel=False)
        open(sys.argv[1] + "." + sys.argv[2], "w").close()
        while not all(os.path.exists(sys.argv[1] + "." + w) for w in ("a", "b")):
            time.sleep(0.01)
        f(np.ones(4))
        print(sum(f.stats.cache_misses.values()), sum(f.stats.cache_hits.values()))
    """
    env = {"NUMBA_CACHE_DIR": str(tmp_path / "cache"), "QUANTKIT_COMPILE_NOTICE": "0"}
    procs = [_python(code, env, str(tmp_path / "go"), w, script=tmp_path / "lock_probe.py") for w in ("a", "b")]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    misses, hits = zip(*(map(int, o[0].split()) for o in outs))
    assert sorted(misses) == [0, 1] and sorted(hits) == [0, 1]


# -- what a kernel's name carries ---------------------------------------------------------------------

def _scale_body(x):
    return x * TABLE[0]  # noqa: F821


def test_the_digest_follows_bound_values_and_reached_files():
    a = specialize(_scale_body, "digest_a", TABLE=np.array([2], np.int64))
    b = specialize(_scale_body, "digest_b", TABLE=np.array([3], np.int64))
    assert a(np.int64(5)) == 10 and b(np.int64(5)) == 15
    tail = lambda f: f.py_func.__name__.rsplit("_", 2)[1]  # noqa: E731  (the digest part of the name)
    assert tail(a) != tail(b)                    # another table, another cache entry
    from quantkit.kernels import ir_rowdot
    from quantkit.quants import kquants
    d_ir = build_digest(ir_rowdot._chunk_q4_k)
    d_q = build_digest(kquants.__dict__[next(n for n, v in vars(kquants).items() if hasattr(v, "py_func"))].py_func)
    assert d_ir[:10] != d_q[:10]                 # the codecs and the IR dots reach different files


def test_kernel_names_are_the_same_in_every_process():
    """A name that changed from run to run would never be found in the cache."""
    code = """
        import json
        from gguf import GGMLQuantizationType as T
        from quantkit import kernels as K
        print(json.dumps([(K.matvec_kernel(t).runner.__name__, K.matvec_kernel(t).fn.py_func.__name__)
                          for t in (T.Q4_K, T.IQ4_XS, T.Q8_0, T.F16)]))
    """
    env = {"NUMBA_CACHE_DIR": os.environ.get("NUMBA_CACHE_DIR", "")}
    runs = [_python(code, env) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), [r.stderr for r in runs]
    assert json.loads(runs[0].stdout) == json.loads(runs[1].stdout)
