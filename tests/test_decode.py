"""The compiled decode step (quantkit.model.decode): equal to the per-layer batch path at the same
positions, independent of the thread count, fp16 and float32 KV caches, on tiny mixed-type models."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from quantkit import isa
from quantkit.jit import get_threads, set_threads
from quantkit.kernels import x8_types
from quantkit.model.ops import expf
from quantkit.model.forward import Runner
from quantkit.model.llama import Llama
from quantkit.model.reference import reference_logits
from test_model import TOKENS, write_tiny

#: every kind of activation the step quantizes to (Q8_0, Q8_1, Q8_K, float) in one model, per layer; the
#: product matrices with rows in multiples of 8 take the x8 layout (Q4_K, Q8_0, Q5_1, Q6_K, Q5_0, IQ4_NL)
MIXED = {"token_embd": T.Q4_1, "attn_q": T.Q4_K, "attn_k": T.Q8_0, "attn_v": T.Q5_1, "attn_output": T.F16,
         "ffn_gate": T.Q6_K, "ffn_up": T.Q5_0, "ffn_down": T.IQ4_NL, "output": T.Q8_0}


@pytest.fixture(scope="module", params=["mixed", "mixed+tied"])
def tiny(request, tmp_path_factory):
    path = write_tiny(tmp_path_factory.mktemp("dec") / f"{request.param}.gguf", tied="tied" in request.param,
                      rope_freqs=True, types=MIXED)
    with Llama(path) as m:
        yield m


def decode_all(m, tokens, **kw):
    r = Runner(m, 64, **kw)
    return r, np.concatenate([r.forward([t]) for t in tokens])


@pytest.mark.parametrize("type_kv", ["f16", "f32"])
def test_step_equals_batch_path(tiny, type_kv, monkeypatch):
    """Token by token through the compiled step == token by token through the per-layer path (both
    reading the file's rows: the x8 layout sums blocks in another order, test_x8_step_vs_reference)."""
    monkeypatch.setenv("QUANTKIT_X8", "0")
    r, a = decode_all(tiny, TOKENS, type_kv=type_kv)
    assert r.step is not None and len(r.step.types) == len({w.type for w in tiny.matrices()})
    r2, b = decode_all(tiny, TOKENS, type_kv=type_kv, compiled_step=False)
    assert r2.step is None
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * np.abs(b).max())
    np.testing.assert_array_equal(r.key_cache[:, :len(TOKENS)], r2.key_cache[:, :len(TOKENS)])


#: the levels with x8 kernels the host runs, highest first
X8_LEVELS = [lv for lv in isa.buildable() if x8_types(isa.BY_NAME[lv].variant)]


@pytest.mark.parametrize("tiny,level", [(m, lv) for lv in X8_LEVELS for m in ("mixed", "mixed+tied")
                                        if m == "mixed" or lv == X8_LEVELS[0]] or
                         [pytest.param("mixed", "none", marks=pytest.mark.skip(reason="no AVX2: no x8 kernels"))],
                         indirect=["tiny"])
def test_x8_step_vs_reference(tiny, monkeypatch, level):
    """The step with the matrices of x8 types in the 8-row interleaved layout (all but attn_output,
    F16; the 300-row output is not a multiple of 8 and keeps the file's rows): as close to the float64
    reference as the step on the file's rows. Not equal to it: the x8 dot sums blocks in another float order, and the
    activations' re-quantization to 8 bits carries any last-bit difference on (docs/run.md). For every
    level with x8 kernels the host runs (their kernels, in this process: LLVM may use more); the tied
    model (its output the embedding's Q4_1, a packed type too: another slot set) at the highest only:
    the choice of slots is the same code at every level, and each (model, level, layout) is a step
    build of its own, ~10 CPU-s on a cold cache (the untied model's x8=0 run covers Q4_1's row dots)."""
    monkeypatch.setenv("QUANTKIT_KERNELS", level)
    ref = reference_logits(tiny, TOKENS)
    scale = np.abs(ref).max()
    errs = {}
    for x8 in ("1", "0"):
        monkeypatch.setenv("QUANTKIT_X8", x8)
        r, got = decode_all(tiny, TOKENS)
        packed = {t for t, p in r.step.slots if p}
        # QUANTKIT_X8=0 leaves the float matrices on the step's copy of their rows (runners.copies_rows)
        assert packed >= {T.Q4_K, T.Q5_0, T.Q5_1, T.Q6_K, T.IQ4_NL} if x8 == "1" else packed <= {T.F32, T.F16, T.BF16}
        errs[x8] = (np.abs(got - ref).max() / scale, np.abs(got - ref).mean() / scale)
    assert errs["1"][0] <= 1.25 * errs["0"][0] and errs["1"][1] <= 1.25 * errs["0"][1], errs


def test_step_after_batch_prefill(tiny):
    """Prompt as a batch (BLAS attention path from 32 tokens on), then steps: the steps read the
    batch's cache; close to the float64 reference and to the batch logits of the same positions."""
    seq = (TOKENS * 3)[:40]
    r = Runner(tiny, 64)
    r.forward(seq[:36])
    got = np.concatenate([r.forward([t]) for t in seq[36:]])
    full = Runner(tiny, 64).forward(seq, logits="all")[36:]
    ref = reference_logits(tiny, seq)[36:]
    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= 0.05 * scale
    assert np.abs(got - full).max() <= 0.05 * scale


def test_step_threads_identical(tiny):
    if get_threads() < 2 and set_threads(2) < 2:
        pytest.skip("one core")
    before = get_threads()
    try:
        set_threads(1)
        _, a = decode_all(tiny, TOKENS)
        set_threads(2)
        _, b = decode_all(tiny, TOKENS)
    finally:
        set_threads(before)
    np.testing.assert_array_equal(a, b)


def test_step_logit_rows(tiny):
    r = Runner(tiny, 64)
    r.forward(TOKENS[:5])
    assert r.forward([7], logits="none").shape == (0, tiny.config.n_vocab)
    assert r.n_past == 6
    one = r.forward([9], pos0=5)
    two = r.forward([9], pos0=5, logits=[0, 0])
    np.testing.assert_array_equal(two, np.concatenate([one, one]))


@pytest.mark.parametrize("tiny", ["mixed"], indirect=True)  # the cache does not depend on a tied output
def test_f16_cache_holds_rounded_f32(tiny):
    a, _ = decode_all(tiny, TOKENS[:8], type_kv="f16")
    b, _ = decode_all(tiny, TOKENS[:8], type_kv="f32")
    assert a.key_cache.dtype == np.float16 and b.key_cache.dtype == np.float32
    # layer 0's keys depend on the tokens only: the fp16 cache holds the float32 keys, rounded
    k32 = b.key_cache[0, :8]
    np.testing.assert_array_equal(a.key_cache[0, :8], k32.astype(np.float16))


def test_expf():
    from numba import njit

    @njit
    def run(x, y):
        for i in range(x.size):
            y[i] = expf(x[i])

    x = np.concatenate([np.linspace(-80, 88, 100001), [0.0, -1e-8, 1e-8]]).astype(np.float32)
    y = np.empty_like(x)
    run(x, y)
    ref = np.exp(x.astype(np.float64))
    assert np.max(np.abs(y - ref) / ref) < 5e-7
    run(np.array([-200.0, -1e30], np.float32), y[:2])
    assert 0 <= y[0] < 1.3e-38 and 0 <= y[1] < 1.3e-38     # clamped: tiny, never nan


def test_weights_read_from_the_file_map(tiny, monkeypatch):
    """By default the step reads the GGUF's memory map itself (one copy of the weights in the
    process); QUANTKIT_COPY_WEIGHTS=1 makes a private copy, and both give the same logits."""
    base = tiny.gguf.reader.data
    monkeypatch.delenv("QUANTKIT_COPY_WEIGHTS", raising=False)
    r, a = decode_all(tiny, TOKENS[:4])
    assert not r.step.copied and np.shares_memory(r.step.buf, base)
    assert all(np.shares_memory(r.step.views[w.name], base) for w in tiny.matrices())
    monkeypatch.setenv("QUANTKIT_COPY_WEIGHTS", "1")
    r2, b = decode_all(tiny, TOKENS[:4])
    assert r2.step.copied and not np.shares_memory(r2.step.buf, base)
    np.testing.assert_array_equal(a, b)


def _present_pages(a: np.ndarray) -> tuple[int, int]:
    """(pages mapped in this process, whole pages) of the pages lying wholly inside ``a``'s bytes, from
    /proc/self/pagemap's present bit (the page table, not the page cache that mincore reports)."""
    import mmap

    page = mmap.PAGESIZE
    start = a.__array_interface__["data"][0]
    first, last = -(-start // page), (start + a.nbytes) // page
    with open("/proc/self/pagemap", "rb") as fh:
        fh.seek(first * 8)
        entries = np.frombuffer(fh.read(8 * (last - first)), np.uint64)
    return int(np.count_nonzero(entries >> np.uint64(63))), last - first


@pytest.mark.skipif(not x8_types(), reason="no AVX2: no x8 kernels")
def test_x8_copy_replaces_the_file_pages(tmp_path, monkeypatch):
    """The x8 copy (and the float matrices' copied rows) is made a slice of rows at a time and each
    slice's file pages leave this process as soon as it is copied (``X8_SLICE_BYTES``; here 8 rows a
    slice): once made, no whole page of such a matrix is mapped any more, and the copy holds the same
    bytes as packing each matrix whole (a float matrix's: its rows). The step then gives the same logits as a Runner whose copy was packed in one piece."""
    import os

    import quantkit.model.decode as D
    from quantkit.kernels.runners import copies_rows
    from quantkit.kernels.vecdot import pack_x8

    if not os.path.exists("/proc/self/pagemap"):
        pytest.skip("no /proc/self/pagemap")
    monkeypatch.setenv("QUANTKIT_X8", "1")
    monkeypatch.delenv("QUANTKIT_COPY_WEIGHTS", raising=False)
    path = write_tiny(tmp_path / "tiny.gguf")
    with Llama(path) as m:
        r = Runner(m, 64)
        todo = list(r.step._x8_todo)
        assert todo and not r.step.copied
        whole = sum(_present_pages(w.data)[1] for w, _ in todo)
        assert whole >= 20
        for w, _ in todo:                       # every page of the packed matrices mapped, as after a prompt
            int(np.asarray(w.data, np.uint8).sum())
        assert sum(_present_pages(w.data)[0] for w, _ in todo) == whole
        monkeypatch.setattr(D, "X8_SLICE_BYTES", 1)
        r.step.make_x8()
        assert sum(_present_pages(w.data)[0] for w, _ in todo) == 0
        a = r.forward([TOKENS[0]])
        for w, o in todo:                       # (reading the rows maps them back)
            n = w.data.nbytes
            want = w.data if copies_rows(w.type) else pack_x8(w.data, w.type)  # the float rows: as they are
            np.testing.assert_array_equal(r.step.pbuf[o:o + n], np.asarray(want).reshape(-1))
        monkeypatch.setattr(D, "X8_SLICE_BYTES", 1 << 40)
        np.testing.assert_array_equal(a, Runner(m, 64).forward([TOKENS[0]]))
