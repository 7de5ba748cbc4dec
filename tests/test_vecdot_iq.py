"""The lattice types' row dots (kernels/vecdot_iq.py, IR through ir_rowdot.ROW_SPECS) against a float64 dot of what
the bytes mean: gguf-py's dequantized weights times the dequantized Q8_K activations (``q * d``), both IR
variants, on quantized rows and on random bytes (every grid index, sign, scale and delta bit in play, so a
wrong lane, group or bit shows); the 2-row form and the GEMV built on them against the 1-row dot."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

import quantkit.kernels as K
import quantkit.quants as Q
from quantkit.formats.ggml_types import type_info
from quantkit.kernels.activations import quantize_q8_k_into
from quantkit.kernels.ir import RUNNABLE_VARIANTS
from quantkit.kernels.ir_rowdot import row_dots
from quantkit.kernels.vecdot import build, rowdot2_ir, rowdot_ir
from quantkit.kernels.vecdot_iq import SPECS

TYPES = sorted(SPECS)
VARIANTS = [v for v in RUNNABLE_VARIANTS if v != "plain"]


def _weights(t, n_out, n_in, seed):
    rng = np.random.default_rng(seed)
    w = (rng.standard_t(5, (n_out, n_in)) * 0.02).astype(np.float32)
    w[1] = 0.0  # an all-zero row
    return Q.quantize(w, t, imatrix=rng.uniform(0.1, 2.0, n_in).astype(np.float32))


def _random_bytes(t, n_out, n_in, seed):
    """Random block bytes with a finite fp16 scale (IQ1_M: its scale words' top nibbles)."""
    info = type_info(t)
    nb = n_in // 256
    raw = np.random.default_rng(seed).integers(0, 256, (n_out, nb, info.type_size), dtype=np.uint8)
    if "d" in info.offsets:
        raw[:, :, info.field("d"):info.field("d") + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    else:  # the fp16 0x2000 + ...: top nibble of byte 7 of the scales is 0x2
        raw[:, :, info.field("scales") + 7] = (raw[:, :, info.field("scales") + 7] & 0x0F) | 0x20
    return raw.reshape(n_out, nb * info.type_size)


def _activations(n_tok, n_in, seed):
    x = np.random.default_rng(seed).standard_normal((n_tok, n_in)).astype(np.float32)
    x[0, :256] = 0.0  # a zero block of activations
    xq = np.empty((n_tok, n_in), np.int8)
    xd = np.empty((n_tok, n_in // 256), np.float32)
    xs = np.empty((n_tok, n_in // 16), np.int32)
    quantize_q8_k_into(x, xq, xd, xs)
    return xq, xd, xs


def _rowdot(t, variant):
    return build(rowdot_ir, f"{t}_{variant}_test", False, ROW=row_dots(variant)[t])


@pytest.mark.parametrize("t", ["IQ2_S", "IQ1_S", "IQ1_M"])
def test_without_bmi2_and_f16c_the_same_dot(t, monkeypatch):
    """The grid indices packed with shifts where the CPU has no BMI2 ``pdep`` (lowbit._pdep), and fp16
    scales converted with integer operations where it has no F16C: the same bits as with them."""
    import quantkit.kernels.ir as I

    y = _random_bytes(t, 4, 512, 5)
    xq, xd, xs = _activations(2, 512, 6)
    sc = np.zeros(16, np.int32)
    want = [_rowdot(t, "generic")(y[r], xq[1], xd[1], xs[1], sc) for r in range(4)]
    monkeypatch.setattr(I, "HAS_BMI2", False)
    monkeypatch.setattr(I, "HAS_F16", False)
    fn = build(rowdot_ir, f"{t}_generic_nobmi2_nof16_test", False, ROW=row_dots("generic")[t])
    assert [fn(y[r], xq[1], xd[1], xs[1], sc) for r in range(4)] == want


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("t", TYPES)
@pytest.mark.parametrize("n_in,source", [(256, "quantized"), (1024, "quantized"), (1280, "random")])
def test_rowdot_matches_float64_dot(t, variant, n_in, source):
    y = (_weights if source == "quantized" else _random_bytes)(t, 6, n_in, 1)
    xq, xd, xs = _activations(3, n_in, 2)
    wf = np.asarray(gguf.quants.dequantize(y, gguf.GGMLQuantizationType[t]), dtype=np.float64)
    af = xq.astype(np.float64) * np.repeat(xd.astype(np.float64), 256, axis=1)
    rowdot = _rowdot(t, variant)
    sc = np.zeros(16, np.int32)
    for r in range(y.shape[0]):
        for k in range(xq.shape[0]):
            got = rowdot(y[r], xq[k], xd[k], xs[k], sc)
            want = float(wf[r] @ af[k])
            # one float product per lane of 8 and block; one wrong value of 256 would be ~4e-3 of the scale
            scale = float(np.abs(wf[r]) @ np.abs(af[k]))
            assert abs(got - want) <= 2e-6 * scale + 1e-30, (t, r, k, got, want)


@pytest.mark.parametrize("t", TYPES)
def test_two_rows_and_matvec_equal_the_row_dot(t):
    n_in = 512
    tt = gguf.GGMLQuantizationType[t]
    y = _random_bytes(t, 9, n_in, 3)
    xq, xd, xs = _activations(2, n_in, 4)
    assert tt in K.WEIGHT_TYPES and K.activation_kind(tt) == "Q8_K"
    sc = np.zeros(16, np.int32)
    one = K.rowdot_kernel(tt)
    want = np.array([[one(y[r], xq[k], xd[k], xs[k], sc) for r in range(y.shape[0])] for k in range(2)],
                    dtype=np.float32)
    two = build(rowdot2_ir, f"{t}_test2", False, ROW2=row_dots(K.default_variant(), 2)[t])
    for r in range(0, 8, 2):
        assert two(y[r:r + 2].reshape(-1), xq[1], xd[1], xs[1], sc) == (want[1, r], want[1, r + 1])
    for parallel in (False, True):
        out = np.empty((2, y.shape[0]), np.float32)
        K.matvec_kernel(tt, parallel=parallel)(y, xq, xd, xs, out, 4)
        assert np.array_equal(out, want)
def test_tiny_model_with_lattice_tensors_matches_the_float64_reference(tmp_path):
    """A tiny llama whose projections are IQ2_S / IQ1_M (the two ggml can make without an imatrix): token
    by token decode (the row dots) and a batch (the prefill) against the float64 reference forward on the
    same dequantized weights."""
    from test_model import TOKENS, write_tiny

    from quantkit.model.forward import Runner
    from quantkit.model.llama import Llama
    from quantkit.model.reference import reference_logits

    T = gguf.GGMLQuantizationType
    types = {"token_embd": T.Q8_0, "attn_q": T.IQ2_S, "attn_k": T.IQ1_M, "attn_v": T.IQ2_S,
             "attn_output": T.IQ1_M, "ffn_gate": T.IQ2_S, "ffn_up": T.IQ1_M, "ffn_down": T.IQ2_S, "output": T.Q8_0}
    path = write_tiny(tmp_path / "iq.gguf", types=types)
    with Llama(path) as m:
        assert m.blk[0].attn_q.type == T.IQ2_S and m.blk[1].ffn_up.type == T.IQ1_M
        ref = reference_logits(m, TOKENS)
        scale = float(np.abs(ref).max())
        batch = Runner(m, 64).forward(TOKENS, 0, logits="all")
        r = Runner(m, 64)
        steps = np.concatenate([r.forward([t]) for t in TOKENS])
        for got in (batch, steps):
            assert float(np.abs(got - ref).max()) <= 0.05 * scale
