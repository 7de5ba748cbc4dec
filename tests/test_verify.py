"""`quantkit verify` and `quantize --verify` on good and damaged files."""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType

from quantkit.cli import main
from quantkit.formats.gguf_io import KV, GGUFOutput, Tensor
from quantkit.quants import quantize


def write_model(path, tensors, block_count=1, n_embd=64):
    kv = [KV("general.architecture", "llama", GGUFValueType.STRING),
          KV("llama.block_count", block_count, GGUFValueType.UINT32),
          KV("llama.embedding_length", n_embd, GGUFValueType.UINT32),
          KV("general.quantization_version", 2, GGUFValueType.UINT32)]
    with GGUFOutput(path, kv, [Tensor(n, s, t) for n, s, t, _ in tensors]) as out:
        for n, _, _, data in tensors:
            out.write(n, data)
        out.commit()


def good_tensors(rng):
    x = rng.standard_normal((8, 64)).astype(np.float32)
    return [("token_embd.weight", (64, 8), T.Q8_0, quantize(x, "Q8_0")),
            ("blk.0.attn_q.weight", (64, 8), T.Q4_0, quantize(x, "Q4_0")),
            ("blk.0.attn_norm.weight", (64,), T.F32, x[0].copy())]


def test_verify_good_file(tmp_path):
    p = tmp_path / "m.gguf"
    write_model(p, good_tensors(np.random.default_rng(0)))
    res = CliRunner().invoke(main, ["verify", "-v", str(p)])
    assert res.exit_code == 0, res.output
    assert "3/3 tensors ok" in res.output and "blk.0.attn_q.weight" in res.output


def test_verify_finds_inf_scale_and_bad_metadata(tmp_path):
    t = good_tensors(np.random.default_rng(1))
    q = t[1][3].copy()
    q[3, 0:2] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)  # the fp16 d of row 3, block 0
    t[1] = (t[1][0], t[1][1], t[1][2], q)
    p = tmp_path / "bad.gguf"
    write_model(p, t, block_count=4, n_embd=96)
    res = CliRunner().invoke(main, ["verify", str(p)])
    assert res.exit_code == 1
    assert "blk.0.attn_q.weight" in res.output and "NaN/Inf" in res.output
    assert "block_count is 4" in res.output and "embedding_length is 96" in res.output
    assert "FAILED" in res.output


def test_verify_not_a_gguf(tmp_path):
    p = tmp_path / "x.gguf"
    p.write_bytes(b"\0" * 100)
    res = CliRunner().invoke(main, ["verify", str(p)])
    assert res.exit_code == 1 and "not a GGUF" in res.output and "Traceback" not in res.output
