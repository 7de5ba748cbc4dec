"""Write a random-weight F16 GGUF of a real model's shape, for speed and memory benchmarks.

    python benchmarks/make_model.py llama-3.2-1b out/llama-3.2-1b-f16.gguf [--seed 0]
    python benchmarks/make_model.py --list

SmolLM2-135M (width 576) hides the K-quant kernels (most of its "Q4_K_M" falls back to Q5_0/Q8_0) and
its size hides per-token costs, so speed is measured on these shapes too. Each shape is the published
config of the model it is named after (n_embd, n_ff, layers, heads, KV heads, head size, RoPE base, tied
output), with SmolLM2's 49152-token vocabulary and tokenizer copied from the bundled model, so every
quantkit and llama.cpp tool loads the file. The weights are random: fine for speed and memory, not for
quality (perplexity on such a file is meaningless).

Weights are Student-t-like with std ~0.02, as trained weights roughly are (heavy tails make the
K-quant searches do the work they do on a real model): a standard normal times a per-32-element scale
drawn from an inverse-gamma law, i.e. a scale mixture of normals, which is a Student t (nu = 5) within
each block. Norm weights are F32 around 1. Tensors are generated and written one at a time through
quantkit's GGUF writer (temporary file, renamed when complete), so an 8B file (16 GB) is written in
bounded memory.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as V
from tqdm import tqdm

from quantkit.formats.gguf_io import KV, GGUFModel, GGUFOutput, Tensor
from quantkit.formats.locate import bundled_model


@dataclass(frozen=True)
class Shape:
    arch: str
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_base: float
    tied: bool            # no output.weight: the output reuses token_embd (as llama.cpp does)
    qk_norm: bool = False  # qwen3: attn_q_norm / attn_k_norm (head_dim wide)
    ctx: int = 131072
    n_expert: int = 0      # a mixture of experts (qwen3moe): experts per layer, used per token, their width
    n_used: int = 0
    n_ff_exp: int = 0


#: published configs (Hugging Face config.json of each model)
SHAPES = {
    "llama-3.2-1b": Shape("llama", 2048, 8192, 16, 32, 8, 64, 500000.0, tied=True),
    "llama-3.2-3b": Shape("llama", 3072, 8192, 28, 24, 8, 128, 500000.0, tied=True),
    "llama-3.1-8b": Shape("llama", 4096, 14336, 32, 32, 8, 128, 500000.0, tied=False),
    "qwen3-0.6b": Shape("qwen3", 1024, 3072, 28, 16, 8, 128, 1000000.0, tied=True, qk_norm=True, ctx=40960),
    # OLMoE-1B-7B's shape (n_embd 2048, 16 layers, 64 experts of width 1024, 8 used) as a qwen3moe file
    # (quantkit does not run olmoe's whole-Q/K norm): ~7B parameters, ~1.3B active
    "olmoe-like": Shape("qwen3moe", 2048, 8192, 16, 16, 16, 128, 10000.0, tied=False, qk_norm=True, ctx=4096,
                        n_expert=64, n_used=8, n_ff_exp=1024),
    # a small MoE for quick measurements: ~0.3B parameters, ~0.1B active
    "moe-small": Shape("qwen3moe", 1024, 2048, 8, 16, 8, 64, 1000000.0, tied=True, qk_norm=True, ctx=4096,
                       n_expert=16, n_used=4, n_ff_exp=512),
    # Mixtral's layout (a llama file with llama.expert_count; the experts' width is feed_forward_length)
    # at a small size: ~0.3B parameters, ~0.1B active
    "mixtral-small": Shape("llama", 1024, 1024, 8, 16, 8, 64, 1000000.0, tied=False, ctx=4096,
                           n_expert=8, n_used=2, n_ff_exp=1024),
}

NU = 5.0  # Student-t degrees of freedom of the weights
STD = 0.02


def tensor_plan(s: Shape, n_vocab: int) -> list[tuple[str, tuple[int, ...], T]]:
    """(name, GGUF shape with the row length first, type) in llama.cpp's converter's order."""
    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    out = [("token_embd.weight", (s.n_embd, n_vocab), T.F16)]
    for i in range(s.n_layer):
        b = f"blk.{i}."
        out += [
            (b + "attn_norm.weight", (s.n_embd,), T.F32),
            (b + "attn_q.weight", (s.n_embd, q), T.F16),
            (b + "attn_k.weight", (s.n_embd, kv), T.F16),
            (b + "attn_v.weight", (s.n_embd, kv), T.F16),
            (b + "attn_output.weight", (q, s.n_embd), T.F16),
        ]
        if s.qk_norm:
            out += [(b + "attn_q_norm.weight", (s.head_dim,), T.F32),
                    (b + "attn_k_norm.weight", (s.head_dim,), T.F32)]
        out.append((b + "ffn_norm.weight", (s.n_embd,), T.F32))
        if s.n_expert:  # the router stays F32, as the converter and llama-quantize leave it
            X, F = s.n_expert, s.n_ff_exp
            out += [(b + "ffn_gate_inp.weight", (s.n_embd, X), T.F32),
                    (b + "ffn_gate_exps.weight", (s.n_embd, F, X), T.F16),
                    (b + "ffn_up_exps.weight", (s.n_embd, F, X), T.F16),
                    (b + "ffn_down_exps.weight", (F, s.n_embd, X), T.F16)]
            continue
        out += [
            (b + "ffn_gate.weight", (s.n_embd, s.n_ff), T.F16),
            (b + "ffn_up.weight", (s.n_embd, s.n_ff), T.F16),
            (b + "ffn_down.weight", (s.n_ff, s.n_embd), T.F16),
        ]
    out.append(("output_norm.weight", (s.n_embd,), T.F32))
    if not s.tied:
        out.append(("output.weight", (s.n_embd, n_vocab), T.F16))
    return out


def metadata(name: str, s: Shape, tokenizer: list[KV]) -> list[KV]:
    a = s.arch
    kv = [
        KV("general.architecture", a, V.STRING),
        KV("general.name", f"random {name}", V.STRING),
        KV("general.file_type", 1, V.UINT32),  # MOSTLY_F16
        KV(f"{a}.context_length", s.ctx, V.UINT32),
        KV(f"{a}.embedding_length", s.n_embd, V.UINT32),
        KV(f"{a}.feed_forward_length", s.n_ff, V.UINT32),
        KV(f"{a}.block_count", s.n_layer, V.UINT32),
        KV(f"{a}.attention.head_count", s.n_head, V.UINT32),
        KV(f"{a}.attention.head_count_kv", s.n_head_kv, V.UINT32),
        KV(f"{a}.attention.key_length", s.head_dim, V.UINT32),
        KV(f"{a}.attention.value_length", s.head_dim, V.UINT32),
        KV(f"{a}.rope.freq_base", s.rope_base, V.FLOAT32),
        KV(f"{a}.attention.layer_norm_rms_epsilon", 1e-5 if a == "llama" else 1e-6, V.FLOAT32),
        KV(f"{a}.rope.dimension_count", s.head_dim, V.UINT32),
    ]
    if s.n_expert:
        kv += [KV(f"{a}.expert_count", s.n_expert, V.UINT32), KV(f"{a}.expert_used_count", s.n_used, V.UINT32)]
        if a != "llama":  # Mixtral's experts are feed_forward_length wide (n_ff == n_ff_exp there)
            kv.append(KV(f"{a}.expert_feed_forward_length", s.n_ff_exp, V.UINT32))
    if a == "llama":
        kv.append(KV("llama.vocab_size", next(len(k.value) for k in tokenizer if k.key == "tokenizer.ggml.tokens"),
                     V.UINT32))
    return kv + tokenizer


def random_weights(rng: np.random.Generator, shape: tuple[int, ...], norm: bool) -> np.ndarray:
    """Student-t-like F16 weights (std ~``STD``) or F32 norm weights around 1, row-major (rows, ne0)."""
    n = int(np.prod(shape))
    if norm:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
    x = rng.standard_normal(n, dtype=np.float32)
    # per-32 block variance ~ InvGamma(nu/2, nu/2): a normal scale mixture is Student t(nu); the
    # scale is normalized so the marginal std is STD (Var t(nu) = nu / (nu - 2))
    g = rng.gamma(NU / 2, 2.0 / NU, size=(n + 31) // 32).astype(np.float32)
    scale = np.float32(STD * np.sqrt((NU - 2) / NU)) / np.sqrt(g)
    x = x.reshape(-1, 32) * scale[:, None] if n % 32 == 0 else x * np.repeat(scale, 32)[:n]
    return x.reshape(-1).astype(np.float16)


def write_model(name: str, path: Path, seed: int = 0, progress: bool = True) -> Path:
    s = SHAPES[name]
    with GGUFModel(bundled_model()) as src:
        tokenizer = [kv for kv in src.kv if kv.key.startswith("tokenizer.")]
    n_vocab = next(len(k.value) for k in tokenizer if k.key == "tokenizer.ggml.tokens")
    plan = tensor_plan(s, n_vocab)
    rng = np.random.default_rng(seed)
    tensors = [Tensor(n, sh, t) for n, sh, t in plan]
    bar = tqdm(total=sum(t.nbytes for t in tensors), unit="B", unit_scale=True, desc=path.name,
               disable=not progress)
    with GGUFOutput(path, metadata(name, s, tokenizer), tensors) as out, bar:
        for t in tensors:
            x = random_weights(rng, t.shape, norm=len(t.shape) == 1)
            out.write(t.name, x.astype(np.float32) if t.type == T.F32 else x)   # an F32 matrix: the router
            bar.update(t.nbytes)
        out.commit()
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", nargs="?", choices=sorted(SHAPES), help="the real model whose shape to copy")
    ap.add_argument("output", nargs="?", type=Path, help="the GGUF to write (F16)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--list", action="store_true", help="list the shapes and their sizes")
    a = ap.parse_args()
    if a.list or a.shape is None:
        for k, s in SHAPES.items():
            n = sum(int(np.prod(sh)) for _, sh, _ in tensor_plan(s, 49152))
            print(f"{k:14s} {s.arch:6s} n_embd {s.n_embd:5d} n_ff {s.n_ff:5d} layers {s.n_layer:2d} "
                  f"heads {s.n_head}/{s.n_head_kv} head_dim {s.head_dim:3d} {n / 1e9:5.2f} B params "
                  f"(F16 {2 * n / 2**30:5.2f} GiB)")
        return 0
    if a.output is None:
        ap.error("give the output path")
    write_model(a.shape, a.output, a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
