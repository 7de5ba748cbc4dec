"""What is particular to the lattice types' row dots (kernels/vecdot_iq.py): the same bits without BMI2 and
F16C, and a tiny model with lattice tensors against the float64 reference. Their row dots against a
float64 dot, their 2-row forms and GEMVs are tested with every other type's in test_rowdots.py."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from quantkit.formats.ggml_types import type_info
from quantkit.kernels.activations import quantize_q8_k_into
from quantkit.kernels.cpu_traits import cpu_traits
from quantkit.kernels.ir_rowdot import row_dot
from quantkit.kernels.vecdot import build, row_intrinsic, rowdot_ir


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
    return build(rowdot_ir, f"{t}_{variant}_test", False, ROW=row_intrinsic(gguf.GGMLQuantizationType[t], variant))


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
    fn = build(rowdot_ir, f"{t}_generic_nobmi2_nof16_test", False,
               ROW=row_dot("generic", t, cpu_traits(t).row.fn))
    assert [fn(y[r], xq[1], xd[1], xs[1], sc) for r in range(4)] == want


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
