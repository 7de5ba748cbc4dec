"""Write a random-weight F16 GGUF of a real model's shape, for speed and memory benchmarks.

    python benchmarks/make_model.py llama-3.2-1b out/llama-3.2-1b-f16.gguf [--seed 0]
    python benchmarks/make_model.py deepseek-v2-lite out/dsv2-lite-8l-f16.gguf --layers 8
    python benchmarks/make_model.py --list [--layers N]

SmolLM2-135M (width 576) hides the K-quant kernels (most of its "Q4_K_M" falls back to Q5_0/Q8_0) and
its size hides per-token costs, so speed is measured on these shapes too. Each shape is the published
config of the model it is named after (n_embd, n_ff, layers, heads, KV heads, head size, RoPE base, tied
output), with SmolLM2's 49152-token vocabulary and tokenizer copied from the bundled model, so every
quantkit and llama.cpp tool loads the file. The weights are random: fine for speed and memory, not for
quality (perplexity on such a file is meaningless).

The new families' shapes (issues #42 / #43) are written as convert_hf_to_gguf.py writes the model: DeepSeek-
V2-Lite's latent attention with attn_kv_b split into attn_k_b / attn_v_b, LFM2-1.2B's short convolutions at
its attention layers' complement, Qwen3-Next's gated DeltaNet on three layers of four (fewer layers and
experts than the 80B model, said in general.name). ``--layers N`` keeps the first N layers of any shape,
each layer as published, so a model whose F16 would not fit the disk or RAM can still be measured per layer.

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
from dataclasses import dataclass, replace
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
    eps: float = 0.0       # the RMS norms' epsilon (0: 1e-5 for llama, 1e-6 otherwise)
    # the new families' parts (issues #42 / #43), each None / 0 when the model has none:
    lead_dense: int = 0    # leading dense layers (deepseek2: first_k_dense_replace) before the MoE layers
    n_shared: int = 0      # ungated shared experts, each n_ff_exp wide, beside the routed ones (DeepSeek)
    n_ff_shexp: int = 0    # one shared expert of this width with its sigmoid gate ffn_gate_inp_shexp (Qwen)
    ffn_norm: str = "ffn_norm"   # the FFN's input norm's name (qwen3next: post_attention_norm)
    mla: tuple[int, int, int, int, int] | None = None  # latent attention: q_lora, kv_lora, nope, rope, v dims
    yarn: tuple[float, int, float] | None = None  # YaRN: factor, original context, deepseek2's log multiplier
    attn_layers: tuple[int, ...] | None = None  # LFM2: the attention layers; the others gated short convolutions
    l_cache: int = 0       # LFM2: the short convolution's taps
    delta: tuple[int, int, int, int] | None = None  # gated DeltaNet (qwen3next): key heads, value heads, head
    #                        size, convolution taps; every fourth layer gated attention (full_attention_interval)
    rope_dim: int = 0      # rotated dims of a head when not all (qwen3next's partial_rotary_factor 0.25)
    n_layer_published: int = 0   # the published model's layer count when n_layer is fewer (0: the same)
    note: str = ""         # what else the shape leaves out of the published model

    @property
    def reduced(self) -> str:
        """What this shape leaves out of the published model ("" if nothing): general.name and --list say it."""
        n = self.n_layer_published
        return "; ".join(x for x in (f"{self.n_layer} of {n} layers" if n > self.n_layer else "", self.note) if x)

    def recurrent(self, i: int) -> bool:
        """Whether layer ``i`` is a recurrent layer (no KV cache): a short convolution or a DeltaNet."""
        if self.attn_layers is not None:
            return i not in self.attn_layers
        return self.delta is not None and (i + 1) % 4 != 0


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
    # DeepSeek-V2-Lite (deepseek2): 27 layers, MLA with kv_lora_rank 512 and no q_lora (attn_q), a head's
    # nope / rope / value dims 128 / 64 / 128, 16 heads; layer 0 dense (10944), then 64 routed experts of
    # width 1408 with 6 used (softmax gating, weights not normalized, scale 1) and 2 shared; YaRN factor 40
    # over 4096 positions, mscale_all_dim 0.707. attn_kv_b is written split into attn_k_b / attn_v_b, as
    # convert_hf_to_gguf.py writes it. 15.7 B parameters, ~2.4 B active; an F16 is 31 GiB, so use --layers
    "deepseek-v2-lite": Shape("deepseek2", 2048, 10944, 27, 16, 1, 128, 10000.0, tied=False, ctx=163840,
                              n_expert=64, n_used=6, n_ff_exp=1408, lead_dense=1, n_shared=2,
                              mla=(0, 512, 128, 64, 128), yarn=(40.0, 4096, 0.1 * 0.707)),
    # LFM2-1.2B (lfm2): 16 layers, attention (32 heads, 8 KV heads, per-head q/k norms) at layers 2, 5, 8,
    # 10, 12 and 14, gated short convolutions of 3 taps elsewhere; block_ff_dim 12288 auto-adjusted to
    # 8192 (2/3, multiple of 256) as the converter writes it; the final norm token_embd_norm, tied output
    "lfm2-1.2b": Shape("lfm2", 2048, 8192, 16, 32, 8, 64, 1000000.0, tied=True, qk_norm=True, ctx=128000,
                       eps=1e-5, attn_layers=(2, 5, 8, 10, 12, 14), l_cache=3),
    # Qwen3-Next-80B-A3B's layer (qwen3next): gated DeltaNet (16 key heads, 32 value heads of 128, 4 taps)
    # on three layers of four, gated attention (16 heads, 2 KV heads of 256, a quarter rotated, base 1e7)
    # on the fourth; MoE of width 512 with 10 used and a gated shared expert of 512. 8 of its 48 layers
    # and 64 of its 512 experts, so the Q4_K_M (1.2 GiB) fits RAM with room: a decode step reads what the
    # real model's does per layer (10 experts and the shared one), the routed experts' pool is smaller
    "qwen3-next-pattern": Shape("qwen3next", 2048, 5120, 8, 16, 2, 256, 10000000.0, tied=False, qk_norm=True,
                                ctx=262144, n_expert=64, n_used=10, n_ff_exp=512, n_ff_shexp=512,
                                ffn_norm="post_attention_norm", delta=(16, 32, 128, 4), rope_dim=64,
                                n_layer_published=48, note="64 of 512 experts"),
}

NU = 5.0  # Student-t degrees of freedom of the weights
STD = 0.02


def tensor_plan(s: Shape, n_vocab: int) -> list[tuple[str, tuple[int, ...], T]]:
    """(name, GGUF shape with the row length first, type) in llama.cpp's converter's order."""
    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    E = s.n_embd
    out = [("token_embd.weight", (E, n_vocab), T.F16)]
    for i in range(s.n_layer):
        b = f"blk.{i}."
        out.append((b + "attn_norm.weight", (E,), T.F32))
        if s.l_cache and s.recurrent(i):    # LFM2's gated short convolution: b, c, x; taps (F32); out
            out += [(b + "shortconv.in_proj.weight", (E, 3 * E), T.F16),
                    (b + "shortconv.conv.weight", (s.l_cache, E), T.F32),
                    (b + "shortconv.out_proj.weight", (E, E), T.F16)]
        elif s.delta and s.recurrent(i):    # a gated DeltaNet layer (llama.cpp's src/models/qwen3next.cpp)
            HK, HV, SD, K = s.delta
            conv = 2 * HK * SD + HV * SD    # q, k and v through the causal convolution
            out += [(b + "attn_qkv.weight", (E, conv), T.F16),
                    (b + "attn_gate.weight", (E, HV * SD), T.F16),
                    (b + "ssm_ba.weight", (E, 2 * HV), T.F16),
                    (b + "ssm_conv1d.weight", (K, conv), T.F32),
                    (b + "ssm_dt.bias", (HV,), T.F32),
                    (b + "ssm_a", (HV,), T.F32),
                    (b + "ssm_norm.weight", (SD,), T.F32),
                    (b + "ssm_out.weight", (HV * SD, E), T.F16)]
        elif s.mla:     # q straight from attn_q (q_lora 0), the latent and its norm, per head k_b / v_b
            LQ, LKV, NOPE, ROPE, VD = s.mla
            if LQ:
                out += [(b + "attn_q_a.weight", (E, LQ), T.F16), (b + "attn_q_a_norm.weight", (LQ,), T.F32),
                        (b + "attn_q_b.weight", (LQ, s.n_head * (NOPE + ROPE)), T.F16)]
            else:
                out.append((b + "attn_q.weight", (E, s.n_head * (NOPE + ROPE)), T.F16))
            out += [(b + "attn_kv_a_mqa.weight", (E, LKV + ROPE), T.F16),
                    (b + "attn_kv_a_norm.weight", (LKV,), T.F32),
                    (b + "attn_k_b.weight", (NOPE, LKV, s.n_head), T.F16),
                    (b + "attn_v_b.weight", (LKV, VD, s.n_head), T.F16),
                    (b + "attn_output.weight", (s.n_head * VD, E), T.F16)]
        else:   # (qwen3next's attn_q holds each head's query rows, then its output gate's)
            out += [
                (b + "attn_q.weight", (E, q * (2 if s.delta else 1)), T.F16),
                (b + "attn_k.weight", (E, kv), T.F16),
                (b + "attn_v.weight", (E, kv), T.F16),
            ]
            out.append((b + "attn_output.weight", (q, E), T.F16))
            if s.qk_norm:
                out += [(b + "attn_q_norm.weight", (s.head_dim,), T.F32),
                        (b + "attn_k_norm.weight", (s.head_dim,), T.F32)]
        out.append((b + s.ffn_norm + ".weight", (E,), T.F32))
        if s.n_expert and i >= s.lead_dense:  # the router stays F32, as the converter and llama-quantize leave it
            X, F = s.n_expert, s.n_ff_exp
            out += [(b + "ffn_gate_inp.weight", (E, X), T.F32),
                    (b + "ffn_gate_exps.weight", (E, F, X), T.F16),
                    (b + "ffn_up_exps.weight", (E, F, X), T.F16),
                    (b + "ffn_down_exps.weight", (F, E, X), T.F16)]
            FS = s.n_ff_shexp or s.n_shared * F
            if FS:
                if s.n_ff_shexp:
                    out.append((b + "ffn_gate_inp_shexp.weight", (E,), T.F32))
                out += [(b + "ffn_gate_shexp.weight", (E, FS), T.F16),
                        (b + "ffn_up_shexp.weight", (E, FS), T.F16),
                        (b + "ffn_down_shexp.weight", (FS, E), T.F16)]
            continue
        out += [
            (b + "ffn_gate.weight", (E, s.n_ff), T.F16),
            (b + "ffn_up.weight", (E, s.n_ff), T.F16),
            (b + "ffn_down.weight", (s.n_ff, E), T.F16),
        ]
    out.append(("token_embd_norm.weight" if s.l_cache else "output_norm.weight", (E,), T.F32))
    if not s.tied:
        out.append(("output.weight", (E, n_vocab), T.F16))
    return out


def metadata(name: str, s: Shape, tokenizer: list[KV]) -> list[KV]:
    """The KV pairs convert_hf_to_gguf.py writes for the shape's model (its vocabulary SmolLM2's)."""
    a = s.arch
    n_vocab = next(len(k.value) for k in tokenizer if k.key == "tokenizer.ggml.tokens")
    head_kv = ([s.n_head_kv if i in s.attn_layers else 0 for i in range(s.n_layer)]   # LFM2: 0 on a convolution
               if s.attn_layers is not None else s.n_head_kv)
    if s.mla:   # the cache holds the latent and the rope part (key_length / value_length), a head's dims apart
        LQ, LKV, NOPE, ROPE, VD = s.mla
        k_len, v_len, rope_dim = LKV + ROPE, LKV, ROPE
    else:
        k_len = v_len = s.head_dim
        rope_dim = s.rope_dim or s.head_dim
    kv = [
        KV("general.architecture", a, V.STRING),
        KV("general.name", f"random {name}" + (f" ({s.reduced})" if s.reduced else ""), V.STRING),
        KV("general.file_type", 1, V.UINT32),  # MOSTLY_F16
        KV(f"{a}.context_length", s.ctx, V.UINT32),
        KV(f"{a}.embedding_length", s.n_embd, V.UINT32),
        KV(f"{a}.feed_forward_length", s.n_ff, V.UINT32),
        KV(f"{a}.block_count", s.n_layer, V.UINT32),
        KV(f"{a}.attention.head_count", s.n_head, V.UINT32),
        KV(f"{a}.attention.head_count_kv", head_kv, V.ARRAY if isinstance(head_kv, list) else V.UINT32,
           V.UINT32 if isinstance(head_kv, list) else None),
        KV(f"{a}.attention.key_length", k_len, V.UINT32),
        KV(f"{a}.attention.value_length", v_len, V.UINT32),
        KV(f"{a}.rope.freq_base", s.rope_base, V.FLOAT32),
        KV(f"{a}.attention.layer_norm_rms_epsilon", s.eps or (1e-5 if a == "llama" else 1e-6), V.FLOAT32),
        KV(f"{a}.rope.dimension_count", rope_dim, V.UINT32),
    ]
    if s.mla:   # (q_lora_rank 0 written: llama.cpp reads the key unless the layer count is V2-Lite's 26 / 27,
        #        deepseek2.cpp's load_arch_hparams, and --layers changes the count)
        kv += [KV(f"{a}.attention.q_lora_rank", LQ, V.UINT32), KV(f"{a}.attention.kv_lora_rank", LKV, V.UINT32),
               KV(f"{a}.attention.key_length_mla", NOPE + ROPE, V.UINT32),
               KV(f"{a}.attention.value_length_mla", VD, V.UINT32)]
    if s.yarn:
        kv += [KV(f"{a}.rope.scaling.type", "yarn", V.STRING),
               KV(f"{a}.rope.scaling.factor", s.yarn[0], V.FLOAT32),
               KV(f"{a}.rope.scaling.original_context_length", s.yarn[1], V.UINT32),
               KV(f"{a}.rope.scaling.yarn_log_multiplier", s.yarn[2], V.FLOAT32)]
    if s.l_cache:
        kv.append(KV(f"{a}.shortconv.l_cache", s.l_cache, V.UINT32))
    if s.delta:     # convert_hf_to_gguf.py's Qwen3NextModel
        HK, HV, SD, K = s.delta
        kv += [KV(f"{a}.ssm.conv_kernel", K, V.UINT32), KV(f"{a}.ssm.state_size", SD, V.UINT32),
               KV(f"{a}.ssm.group_count", HK, V.UINT32), KV(f"{a}.ssm.time_step_rank", HV, V.UINT32),
               KV(f"{a}.ssm.inner_size", SD * HV, V.UINT32),
               KV(f"{a}.attention.recurrent_layers", [s.recurrent(i) for i in range(s.n_layer)], V.ARRAY, V.BOOL),
               KV(f"{a}.full_attention_interval", 4, V.UINT32)]
    if s.n_expert:
        kv += [KV(f"{a}.expert_count", s.n_expert, V.UINT32), KV(f"{a}.expert_used_count", s.n_used, V.UINT32)]
        if a != "llama":  # Mixtral's experts are feed_forward_length wide (n_ff == n_ff_exp there)
            kv.append(KV(f"{a}.expert_feed_forward_length", s.n_ff_exp, V.UINT32))
        if s.n_ff_shexp:
            kv.append(KV(f"{a}.expert_shared_feed_forward_length", s.n_ff_shexp, V.UINT32))
        if s.n_shared:   # DeepSeek-V2's routing: softmax gating, weights not normalized, scale 1
            kv += [KV(f"{a}.leading_dense_block_count", s.lead_dense, V.UINT32),
                   KV(f"{a}.expert_shared_count", s.n_shared, V.UINT32),
                   KV(f"{a}.expert_weights_scale", 1.0, V.FLOAT32),
                   KV(f"{a}.expert_gating_func", 1, V.UINT32)]
    if a == "llama" or s.mla or s.l_cache:
        kv.append(KV(f"{a}.vocab_size", n_vocab, V.UINT32))
    return kv + tokenizer


def random_weights(rng: np.random.Generator, shape: tuple[int, ...], norm: bool, decay: bool = False) -> np.ndarray:
    """Student-t-like F16 weights (std ~``STD``) or F32 norm weights around 1, row-major (rows, ne0);
    ``decay``: a DeltaNet's negative per-head decay rates (F32)."""
    n = int(np.prod(shape))
    if decay:   # a DeltaNet's ssm_a = -exp(A_log), A_log in (ln 0.05, ln 0.5): decays ~0.7 to 0.97 per token
        return -np.exp(rng.uniform(np.log(0.05), np.log(0.5), n)).astype(np.float32)
    if norm:
        return (1.0 + 0.1 * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)
    x = rng.standard_normal(n, dtype=np.float32)
    # per-32 block variance ~ InvGamma(nu/2, nu/2): a normal scale mixture is Student t(nu); the
    # scale is normalized so the marginal std is STD (Var t(nu) = nu / (nu - 2))
    g = rng.gamma(NU / 2, 2.0 / NU, size=(n + 31) // 32).astype(np.float32)
    scale = np.float32(STD * np.sqrt((NU - 2) / NU)) / np.sqrt(g)
    x = x.reshape(-1, 32) * scale[:, None] if n % 32 == 0 else x * np.repeat(scale, 32)[:n]
    return x.reshape(-1).astype(np.float16)


def shape(name: str, layers: int | None = None) -> Shape:
    """The shape ``name``, with only its first ``layers`` layers if given (each layer's shape unchanged; the
    file's general.name says so)."""
    s = SHAPES[name]
    if layers is None or layers == s.n_layer:
        return s
    if not 1 <= layers <= s.n_layer:
        raise ValueError(f"--layers must be 1..{s.n_layer} for {name}")
    return replace(s, n_layer=layers, n_layer_published=s.n_layer_published or s.n_layer,
                   attn_layers=None if s.attn_layers is None else tuple(i for i in s.attn_layers if i < layers))


def write_model(name: str, path: Path, seed: int = 0, progress: bool = True, layers: int | None = None) -> Path:
    s = shape(name, layers)
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
            x = random_weights(rng, t.shape, norm=len(t.shape) == 1, decay=t.name.endswith(".ssm_a"))
            out.write(t.name, x.astype(np.float32) if t.type == T.F32 else x)   # an F32 matrix: the router
            bar.update(t.nbytes)
        out.commit()
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("shape", nargs="?", choices=sorted(SHAPES), help="the real model whose shape to copy")
    ap.add_argument("output", nargs="?", type=Path, help="the GGUF to write (F16)")
    ap.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    ap.add_argument("--layers", type=int, metavar="N",
                    help="only the first N layers (each layer's shape unchanged), for a file that fits the disk / RAM")
    ap.add_argument("--list", action="store_true", help="list the shapes and their sizes")
    a = ap.parse_args()
    if a.list or a.shape is None:
        for k in SHAPES:
            s = shape(k, a.layers if a.shape in (None, k) and a.layers and a.layers <= SHAPES[k].n_layer else None)
            n = sum(int(np.prod(sh)) for _, sh, _ in tensor_plan(s, 49152))
            print(f"{k:18s} {s.arch:9s} n_embd {s.n_embd:5d} n_ff {s.n_ff:5d} layers {s.n_layer:2d} "
                  f"heads {s.n_head}/{s.n_head_kv} head_dim {s.head_dim:3d} {n / 1e9:5.2f} B params "
                  f"(F16 {2 * n / 2**30:5.2f} GiB)" + (f"  [{s.reduced}]" if s.reduced else ""))
        return 0
    if a.output is None:
        ap.error("give the output path")
    try:
        shape(a.shape, a.layers)
    except ValueError as e:
        ap.error(str(e))
    write_model(a.shape, a.output, a.seed, layers=a.layers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
