"""quantkit against bytes and floats written by the real ggml (tests/data/golden, see docs/golden.md).

One set of tests over every golden file: each ``GOLDEN_FILES`` entry names a file and the types it holds,
and every type x case x path of it is checked the same way (bytes of ``quantize``, ``dequantize`` and
gguf-py's against ggml's ``to_float``, 1 vs 2 threads). Parametrized over the types quantkit promises
(not over what happens to be registered), so a type missing from ``quantkit.quants.TRAITS`` fails with
a message instead of being skipped. Only the golden files are read; ggml is never loaded here.
The files' own coverage and their types' special cases are in tests/test_golden_lowbit.py and
tests/test_iq2_iq1.py.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
from pathlib import Path

import numba
import numpy as np
import pytest

import quantkit.quants as Q
from quantkit.errors import QuantError, QuantkitError

GOLDEN_DIR = Path(__file__).parent / "data" / "golden"

#: each golden file and the types it holds (made by tools/make_golden.py, make_golden_iq2.py and
#: make_golden_lowbit.py respectively)
GOLDEN_FILES = {
    "ggml_golden.npz": ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS"],
    "ggml_golden_iq2.npz": ["IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M"],
    "ggml_golden_lowbit.npz": ["TQ1_0", "TQ2_0", "MXFP4", "Q1_0", "IQ3_XXS", "IQ3_S"],
}
_FILE_OF = {t: f for f, types in GOLDEN_FILES.items() for t in types}
#: the first file's types: the bad-input promises below are checked for these
REQUIRED = GOLDEN_FILES["ggml_golden.npz"]


# -- the golden file -----------------------------------------------------------------------------
class Golden:
    """Read-only view of ggml_golden.npz that resolves the deduplication aliases."""

    def __init__(self, path: Path):
        self._z = np.load(path, allow_pickle=False)
        self.meta = json.loads(str(self._z["meta"]))
        self._aliases = self.meta.get("aliases", {})

    def __getitem__(self, key: str) -> np.ndarray:
        a = self._z[self._aliases.get(key, key)]
        want = np.uint8 if key.startswith("q:") else np.float32
        return np.ascontiguousarray(a).view(want)

    def __contains__(self, key: str) -> bool:
        return key in self._aliases or key in self._z.files

    def paths(self, t: str) -> list[str]:
        return self.meta["paths"].get(t, ["ref", "imatrix"])


@functools.lru_cache(maxsize=None)
def golden(name: str = "ggml_golden.npz") -> Golden:
    path = GOLDEN_DIR / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: see docs/golden.md for the script that makes it")
    return Golden(path)


def golden_of(t: str) -> Golden:
    """The golden file that holds type ``t``."""
    return golden(_FILE_OF[t])


def _params():
    """(type, case, path) for every type of every golden file, each with its file's cases and its paths
    (Q8_K: ggml's reference only; IQ2_XXS, IQ2_XS, IQ1_S: the imatrix only)."""
    return [pytest.param(t, c, p, id=f"{t}-{c}-{p}")
            for t, f in _FILE_OF.items() for c in golden(f).meta["cases"] for p in golden(f).paths(t)]


def _type_paths():
    return [pytest.param(t, p, id=f"{t}-{p}") for t, f in _FILE_OF.items() for p in golden(f).paths(t)]


def _traits_or_fail(t: str):
    if Q.resolve_type(t) not in Q.TRAITS:
        pytest.fail(f"{t} is required but not registered in quantkit.quants.TRAITS "
                    f"(registered: {', '.join(x.name for x in Q.TRAITS)})")
    return Q.traits(t)


def _gold_entry(t: str, case: str, path: str):
    g = golden_of(t)
    key = f"q:{t}:{case}:{path}"
    if key not in g:
        x = g[f"x:{case}"]
        bs = _traits_or_fail(t).block_size
        if x.shape[1] % bs:
            pytest.skip(f"case {case} has rows of {x.shape[1]}, not a multiple of {t}'s block of {bs}")
        pytest.fail(f"{_FILE_OF[t]} lacks {key}: regenerate it (docs/golden.md)")
    return g[f"x:{case}"], g[f"w:{case}"], g[key], g[f"d:{t}:{case}:{path}"]


def _describe_block_diff(t: str, got: np.ndarray, want: np.ndarray, type_size: int) -> str:
    nrow = want.shape[0]
    gb = got.reshape(nrow, -1, type_size)
    wb = want.reshape(nrow, -1, type_size)
    bad = np.any(gb != wb, axis=2)
    r, b = np.argwhere(bad)[0]
    return (f"{t}: {int(bad.sum())} of {bad.size} blocks differ in {int(bad.any(axis=1).sum())} of {nrow} "
            f"rows; first: row {r} block {b}\n  quantkit {gb[r, b].tobytes().hex()}\n"
            f"  ggml     {wb[r, b].tobytes().hex()}")


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _describe_float_diff(who: str, got: np.ndarray, want: np.ndarray) -> str:
    bad = _bits(got) != _bits(want)
    r, j = np.argwhere(bad)[0]
    return (f"{who}: {int(bad.sum())} of {bad.size} floats differ in {int(bad.any(axis=1).sum())} of "
            f"{bad.shape[0]} rows; first [{r}, {j}]: got {got[r, j]!r} want {want[r, j]!r}")


# -- provenance ----------------------------------------------------------------------------------
def test_golden_file_has_provenance_and_every_required_type():
    m = golden().meta
    for k in ("llama_cpp_python", "date", "command", "cases", "types"):
        assert m.get(k), f"golden meta lacks {k!r}"
    missing = [t for t in REQUIRED if t not in m["types"]]
    assert not missing, f"golden file has no data for {missing}: regenerate with `make golden`"


# -- quantkit == ggml ----------------------------------------------------------------------------
@pytest.mark.parametrize("t,case,path", _params())
def test_quantize_matches_ggml_bytes(t, case, path):
    x, w, want, _ = _gold_entry(t, case, path)
    tr = _traits_or_fail(t)
    got = Q.quantize(x, t, imatrix=w if path == "imatrix" else None)
    assert got.dtype == np.uint8 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    if not np.array_equal(got, want):
        pytest.fail(_describe_block_diff(t, got, want, tr.type_size))


@pytest.mark.parametrize("t,case,path", _params())
def test_dequantize_matches_ggml_to_float(t, case, path):
    _, _, y, want = _gold_entry(t, case, path)
    _traits_or_fail(t)
    got = Q.dequantize(y, t)
    assert got.dtype == np.float32 and got.shape == want.shape, (got.dtype, got.shape, want.shape)
    if not np.array_equal(_bits(got), _bits(want)):
        pytest.fail(_describe_float_diff(f"quantkit dequantize {t}", got, want))


@pytest.mark.parametrize("t,case,path", _params())
def test_gguf_py_dequantize_matches_ggml_to_float(t, case, path):
    """Validates the third-party reference the other differential tests lean on."""
    import gguf
    from gguf.quants import dequantize as gguf_dequantize

    _, _, y, want = _gold_entry(t, case, path)
    try:
        got = gguf_dequantize(y, gguf.GGMLQuantizationType[t])
    except NotImplementedError:
        pytest.skip(f"gguf-py {importlib.metadata.version('gguf')} cannot dequantize {t}")
    got = np.asarray(got, dtype=np.float32).reshape(want.shape)
    if not np.array_equal(_bits(got), _bits(want)):
        pytest.fail(_describe_float_diff(f"gguf-py dequantize {t}", got, want))


@pytest.mark.parametrize("t,path", _type_paths())
def test_one_thread_equals_two_threads(t, path):
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("numba has fewer than 2 threads")
    tr = _traits_or_fail(t)
    g = golden_of(t)
    cases = g.meta["cases"]
    xs = [g[f"x:{c}"] for c in cases]
    xs = [x for x in xs if x.shape[1] == 512 and x.shape[1] % tr.block_size == 0]
    x = np.concatenate(xs)  # every 512-wide case stacked: ~40 rows, so both threads get work
    check_one_vs_two_threads(t, x, g[f"w:{cases[0]}"] if path == "imatrix" else None)


def check_one_vs_two_threads(t: str, x: np.ndarray, w: np.ndarray | None) -> None:
    """Fails unless quantizing ``x`` with 1 and with 2 numba threads gives the same bytes."""
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = Q.quantize(x, t, imatrix=w)
        numba.set_num_threads(2)
        two = Q.quantize(x, t, imatrix=w)
    finally:
        numba.set_num_threads(before)
    if not np.array_equal(one, two):
        pytest.fail("1 vs 2 threads: " + _describe_block_diff(t, two, one, Q.traits(t).type_size))


# -- the bad-input promises of quantize ----------------------------------------------------------
def _raises(t: str, fn, *needles: str) -> None:
    with pytest.raises(QuantError) as ei:
        fn()
    assert isinstance(ei.value, QuantkitError)
    msg = str(ei.value)
    assert "\n" not in msg, f"message is not one line: {msg!r}"
    for n in (t, *needles):
        assert n.lower() in msg.lower(), f"message {msg!r} does not mention {n!r}"


def _ok_data(tr, nrow=2):
    n = max(256, tr.block_size)
    return np.random.default_rng(0).standard_normal((nrow, n)).astype(np.float32)


@pytest.mark.parametrize("t", REQUIRED)
def test_bad_row_length(t):
    tr = _traits_or_fail(t)
    if tr.block_size == 1:
        pytest.skip(f"{t} has a block of 1: every row length is a multiple")
    n = tr.block_size + tr.block_size // 2
    x = np.zeros((2, n), np.float32)
    _raises(t, lambda: Q.quantize(x, t), str(n), str(tr.block_size))


@pytest.mark.parametrize("t", REQUIRED)
@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32])
def test_bad_dtype(t, dtype):
    tr = _traits_or_fail(t)
    x = _ok_data(tr).astype(dtype)
    _raises(t, lambda: Q.quantize(x, t), np.dtype(dtype).name, "float32")


@pytest.mark.parametrize("t", REQUIRED)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_data(t, bad):
    tr = _traits_or_fail(t)
    x = _ok_data(tr)
    x[1, 7] = bad
    _raises(t, lambda: Q.quantize(x, t), "NaN/Inf")
    _raises(t, lambda: Q.quantize(x, t, imatrix=np.ones(x.shape[1], np.float32)), "NaN/Inf")


@pytest.mark.parametrize("t", REQUIRED)
def test_imatrix_wrong_length(t):
    """Checked for every type, also those whose bytes ignore the imatrix: a wrong imatrix is a
    user's mistake (llama-quantize rejects it whatever the type)."""
    tr = _traits_or_fail(t)
    x = _ok_data(tr)
    n = x.shape[1]
    w = np.ones(n - 1, np.float32)
    _raises(t, lambda: Q.quantize(x, t, imatrix=w), str(n - 1), str(n))


@pytest.mark.parametrize("t", REQUIRED)
@pytest.mark.parametrize("bad,word", [(-1.0, "negative"), (np.nan, "non-finite"), (np.inf, "non-finite")],
                         ids=["negative", "nan", "inf"])
def test_imatrix_bad_values(t, bad, word):
    tr = _traits_or_fail(t)
    x = _ok_data(tr)
    w = np.ones(x.shape[1], np.float32)
    w[3] = bad
    _raises(t, lambda: Q.quantize(x, t, imatrix=w), word)


@pytest.mark.parametrize("name", ["Q9_9", "q4_k_m", "", "Q8_1"])
def test_unknown_or_unsupported_type(name):
    x = np.zeros((1, 256), np.float32)
    with pytest.raises(QuantError) as ei:
        Q.quantize(x, name)
    assert isinstance(ei.value, QuantkitError)
    assert repr(name) in str(ei.value) or name in str(ei.value), str(ei.value)
