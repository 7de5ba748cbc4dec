"""The layer program: what each layer of a model does, read once from the GGUF, that every forward path
interprets.

llama.cpp builds one graph per architecture over shared builders (``build_norm``, ``build_attn``,
``build_ffn``, ``build_moe_ffn`` in src/llama-graph.cpp) and runs it for a batch and for one token
alike. quantkit describes each layer as a short program of ``Block`` steps::

    for block in layer.blocks:
        h = rmsnorm(x) * blk.<block.norm>          (the residual itself when norm is None)
        y = block.op(h)                            an Attn, MLA, DeltaNet, DenseFFN or MoeFFN
        y = rmsnorm(y) * blk.<block.post_norm>     (when post_norm is set)
        x = x + y * block.scale                    (when scale is set)

and the three paths -- the float64 ``reference``, the batch ``forward.Runner`` and the compiled
``decode`` step -- each walk that program with their own implementation of each op, never looking at
the architecture's name. ``describe`` builds a layer's program from the ``Arch`` row, the config and
which tensors the file has for that layer, so layers of one model may differ (leading dense layers
before MoE layers, sliding and global attention, DeltaNet layers between attention layers). A new architecture is its ``Arch`` row, its config
reading and any op it adds: a record here, one implementation per path, one test against the reference.

The ops:

=============  ====================================================================================
``Attn``       Q/K/V products (+ biases) -> Q/K RMSNorm (per head or over the whole projection) -> RoPE
               (or none) -> causal (sliding-window) softmax attention over the cache of the scaled,
               optionally soft-capped logits (+ a sink logit per head) -> attn_output (+ bias)
``MLA``        multi-head latent attention (DeepSeek V2 / V3): the cache holds one compressed latent
               per position, shared by every head (the record's docstring)
``DeltaNet``   gated DeltaNet linear attention (Qwen3-Next): a short causal convolution, the delta rule's
               state per value head, the gated output norm (the record's docstring); its state is not a KV
               cache but a convolution window and a matrix per head
``DenseFFN``   (act(h @ ffn_gate) * (h @ ffn_up)) @ ffn_down (llama.cpp's build_ffn, LLM_FFN_PAR)
``MoeFFN``     build_moe_ffn: the router, ``Routing`` (quantkit.model.route), each chosen expert's GLU
               weighted and added in the order of selection; a shared expert after them
``ShortConv``  LFM2's gated short convolution (a recurrent op: the record's docstring)
=============  ====================================================================================

Recurrent ops: state that is not a KV cache
-------------------------------------------
An op whose layer carries something from one position to the next other than keys and values -- LFM2's
convolution window (``ShortConv``), Qwen3-Next's gated DeltaNet (its convolution window and its delta-rule
matrix per head) -- is *recurrent*, llama.cpp's ``llama_memory_recurrent`` (the r_l / s_l rows of one
sequence; the hybrid memory keeps them beside the attention layers' KV cache). Such an op declares:

* ``state_size``: how many float32 values of state it carries per sequence. ``Layer.state_size`` is its
  layer's (a layer holds at most one recurrent op); the three paths give each layer one float32 row of
  the widest layer's size, and the op alone knows the layout of its part (``ShortConv``: the last
  ``l_cache - 1`` rows of its convolution's input, oldest first). A new recurrent op lays out its row as
  it likes (DeltaNet: its window, then its per-head matrices).
* where the state starts: zeros, at the first position of a sequence. llama.cpp clears the memory before
  each perplexity chunk and each new prompt (``llama_memory_clear``); quantkit's ``forward.Runner`` zeroes
  its rows in ``reset()`` and on any ``forward(..., pos0=0)``, and refuses a ``forward`` that would go back
  to a position after 0 (a recurrent state cannot be rewound: llama.cpp's ``seq_rm`` on recurrent memory
  fails too). ``save_prefix`` / ``restore_prefix`` carry the rows with the cached positions.

And each path runs it with the state as an argument:

* ``reference`` (float64): the whole sequence from position 0, so the state is the op's own local that
  starts at zeros (no rows at all: the reference is the check that the carried state is right);
* ``forward.Runner`` (a batch of positions pos0..): ``Runner.state[il]``, read at the batch's start and
  written at its end; a prompt runs in batches of ``n_batch`` positions (llama.cpp's ubatches), each a
  computation over its rows (not a loop of one-token steps), the state carried across the boundary;
* ``decode`` (one position): the step's ``rs[il]`` (the same array as ``Runner.state``), updated in place.
  A recurrent op there is an ``OP_*`` code with its function beside ``attn_op`` (``shortconv_op``), its
  per-layer tensors in ``decode.RecTables`` (ShortConv's taps), its work space in ``Scratch.rec`` (sized
  by ``DecodeStep`` from the layers' ops).

Tests check a state across a batch boundary (the same logits with ``n_batch`` smaller than the prompt) and
the compiled step token by token against the float64 reference.
"""

from __future__ import annotations

from dataclasses import dataclass

#: expert gating functions (llama_expert_gating_func_type) quantkit runs: "softmax" (the chosen experts'
#: softmax probabilities over all experts), "sigmoid" (each expert's sigmoid: DeepSeek V3, GLM-4.5),
#: "softmax_weight" (LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT, gpt-oss: the top-k of the raw logits,
#: weighted by the softmax of those k logits alone)
GATINGS = ("softmax", "sigmoid", "softmax_weight")


@dataclass(frozen=True)
class Attn:
    """Grouped-query attention over the KV cache (the module's table)."""

    rope_neox: bool     # llama_model_rope_type: NEOX pairs (x[i], x[i + n_rot/2]), NORM (x[2i], x[2i+1])
    qkv_bias: bool      # blk.N.attn_{q,k,v}.bias (any of them; a missing one counts as zeros)
    qk_norm: bool       # blk.N.attn_q_norm / attn_k_norm
    n_swa: int          # sliding window (0: the whole context)
    rope_table: int     # 0: the model's RoPE base and scaling; 1: the sliding layers' base
    sinks: bool = False     # blk.N.attn_sinks: per head, one more logit in the softmax's denominator
    out_bias: bool = False  # blk.N.attn_output.bias, added after the output product
    rope: bool = True       # False: Q and K are not rotated (SmolLM3's NoPE layers)
    qk_norm_full: bool = False  # the Q/K norms over the whole projection (OLMo 2), not per head
    softcap: float = 0.0    # each scaled logit s -> softcap * tanh(s / softcap) before the mask (Gemma 2)
    gate: bool = False      # attn_q's rows per head are [query, gate]: the output times sigmoid(gate)
                            # before attn_output (Qwen3-Next)
    chunked: bool = False   # n_swa is a chunk: position p sees the keys from (p // n_swa) * n_swa on
                            # (LLAMA_SWA_TYPE_CHUNKED, Llama 4), not its last n_swa
    l2_norm: bool = False   # q and k RMS-normed per head without a weight, after RoPE (Llama 4's use_kq_norm)
    temp_floor: int = 0     # q times log(floor((pos + temp_offset) / temp_floor) + 1) * temp_scale + 1
    temp_scale: float = 0.0  # (0: not; llm_graph_input_attn_temp, Llama 4's NoPE layers)
    temp_offset: float = 0.0

    @property
    def window(self) -> int:
        """The window as the kernels take it (quantkit.model.ops.window_start): n_swa keys, or minus the
        chunk's size when chunked (0: the whole context)."""
        return -self.n_swa if self.chunked else self.n_swa


@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention, as llama.cpp's deepseek2 graph runs it (``is_mla``: the absorbed form,
    for a batch and for one token alike). For the normed input h of a position p::

        q    = h @ attn_q                    or  rmsnorm(h @ attn_q_a) * attn_q_a_norm @ attn_q_b   (n_lora_q > 0)
               per head: q_nope (n_nope), q_pe (n_rot) = rope(that part)
        kv   = h @ attn_kv_a_mqa             (n_lora_kv + n_rot)
        c    = rmsnorm(kv[:n_lora_kv]) * attn_kv_a_norm;   k_pe = rope(kv[n_lora_kv:])     (one "head")
        cache row p = [c, k_pe]              (``kv_width``: the KV cache's only state; no V cache)

    and per head h, over the cached rows t <= p::

        q_abs = attn_k_b[h] @ q_nope         (n_lora_kv: q_nope taken into the latent's space)
        s_t   = scale * ([q_abs, q_pe] . row_t)           = scale * (k_nope_t . q_nope + k_pe_t . q_pe)
        o     = attn_v_b[h] @ sum_t softmax(s)_t c_t      (n_v)
        out   = [o for every head] @ attn_output

    -- multi-query attention over the latent with a product before and one after (ggml_mul_mat with
    the 3D attn_k_b / attn_v_b, one matrix per head). The decompressed form (k_nope = attn_k_b[h]^T c,
    v = attn_v_b[h] c per head and position) gives the same logits; quantkit.model.reference computes
    that one, so the tests check the absorption too."""

    n_head: int
    n_lora_q: int       # {arch}.attention.q_lora_rank: 0 (V2-Lite) reads attn_q, else attn_q_a / _norm / _b
    n_lora_kv: int      # {arch}.attention.kv_lora_rank: the latent's width
    n_nope: int         # a head's query / key dims without RoPE: key_length_mla - n_rot
    n_rot: int          # ... with RoPE ({arch}.rope.dimension_count): after the nope ones in q
    n_v: int            # {arch}.attention.value_length_mla: a head's output, attn_v_b's rows
    rope_neox: bool
    rope_table: int = 0

    @property
    def kv_width(self) -> int:
        """A cache row: the normed latent, then the rotated k_pe."""
        return self.n_lora_kv + self.n_rot

    @property
    def n_q(self) -> int:
        """q's width: n_head heads of n_nope + n_rot."""
        return self.n_head * (self.n_nope + self.n_rot)


@dataclass(frozen=True)
class DeltaNet:
    """Gated DeltaNet linear attention, as llama.cpp's qwen3next graph runs it (build_layer_attn_linear;
    the delta rule itself: ggml_gated_delta_net, or build_delta_net_chunking / _autoregressive where a
    backend has no fused op). For the normed input h of a position t::

        x      = h @ attn_qkv                (conv_dim = 2 n_k_heads head_dim + n_v_heads head_dim: q, k, v)
        z      = h @ attn_gate               (n_v_heads head_dim: the output gate)
        b, a   = h @ ssm_ba                  per key head group g: [b (r), a (r)], r = n_v_heads / n_k_heads
        c      = silu(sum_i conv[:, i] * x_{t - d_conv + 1 + i})   per channel (ssm_conv1d, d_conv taps;
                                             the d_conv - 1 previous x are the convolution's state)
        q, k   = c's first two parts per key head, each x / sqrt(sum x^2 + eps) (build_gdn_l2_norm);
                 value head j reads key head j // r
        v      = c's last part per value head
        beta   = sigmoid(b);   g = softplus(a + ssm_dt.bias) * ssm_a        (ssm_a = -exp(A_log))
        S      = exp(g) S;   S += beta (v - S k) k^T;   o = S q / sqrt(head_dim)
                                             (per value head: S the (head_dim x head_dim) state)
        out    = [rmsnorm(o) * ssm_norm * silu(z) per value head] @ ssm_out

    The state of a sequence (``state_size``): the convolution's last d_conv - 1 inputs (``conv_state``)
    and S per value head (``ssm_state``), both zero at the start (llama.cpp's recurrent memory, cleared for
    each new sequence: the module's "Recurrent ops")."""

    n_k_heads: int      # {arch}.ssm.group_count
    n_v_heads: int      # {arch}.ssm.time_step_rank
    head_dim: int       # {arch}.ssm.state_size (keys and values alike; inner_size / time_step_rank)
    d_conv: int         # {arch}.ssm.conv_kernel

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """The convolution's channels: q, k and v."""
        return 2 * self.key_dim + self.value_dim

    @property
    def conv_state(self) -> int:
        """Floats of a sequence's convolution window (llama_hparams::n_embd_r)."""
        return (self.d_conv - 1) * self.conv_dim

    @property
    def ssm_state(self) -> int:
        """Floats of a sequence's delta-rule state (llama_hparams::n_embd_s)."""
        return self.head_dim * self.head_dim * self.n_v_heads

    @property
    def state_size(self) -> int:
        """The layer's state row (the module's "Recurrent ops"): the convolution's window, (d_conv - 1,
        conv_dim) oldest first, then each value head's S, (n_v_heads, head_dim (v), head_dim (k))."""
        return self.conv_state + self.ssm_state


@dataclass(frozen=True)
class DenseFFN:
    """``(act(h @ ffn_gate) * (h @ ffn_up)) @ ffn_down`` (llama.cpp's build_ffn with LLM_FFN_PAR)."""

    glu: str            # quantkit.model.arch.GLU_KINDS
    n_ff: int


@dataclass(frozen=True)
class Routing:
    """build_moe_ffn's choice of experts and their weights (the steps: quantkit.model.route)."""

    n_expert: int
    n_used: int
    gating: str = "softmax"   # GATINGS
    norm_w: bool = True       # the chosen weights divided by their sum
    w_scale: float = 0.0      # then times this unless it is 0 or 1 ({arch}.expert_weights_scale)
    n_group: int = 1          # {arch}.expert_group_count: experts in groups, ...
    n_group_used: int = 1     # ... of which the best {arch}.expert_group_used_count are eligible
    score_bias: bool = False  # blk.N.exp_probs_b.bias: added to the scores the choice is made on
    select_logits: bool = False  # the choice made on the router's logits, not on the gated probabilities
                                 # (build_moe_ffn for Llama 4); the weights are still the probabilities


@dataclass(frozen=True)
class MoeFFN:
    """build_moe_ffn: router logits ``h @ ffn_gate_inp`` (+ its bias), ``routing``, then each chosen
    expert e's ``(act(h @ gate_exps[e]) * (h @ up_exps[e])) @ down_exps[e]`` times its weight, added in
    the order of selection (the largest first). With a shared expert (``n_ff_shexp`` > 0),
    ``(act(h @ gate_shexp) * (h @ up_shexp)) @ down_shexp`` is added after them, times
    ``sigmoid(h . ffn_gate_inp_shexp)`` when ``shexp_gate`` (src/models/qwen2moe.cpp; DeepSeek's and
    GLM's shared experts have no gate)."""

    routing: Routing
    n_ff: int             # one expert's width
    glu: str
    n_ff_shexp: int = 0   # the shared expert's width (0: none)
    biases: bool = False  # the router's bias (added to its logits) and the experts' (ggml_add_id after
                          # each expert's gate, up and down products; gpt-oss)
    shexp_gate: bool = False  # the shared expert scaled by sigmoid(h . ffn_gate_inp_shexp) (qwen2moe)
    gate_up: bool = False     # the experts' gate and up in one tensor, ffn_gate_up_exps (gate rows, then up
                              # rows per expert; llama.cpp's create_tensor_gate_up_exps): one product for both
    weight_before: bool = False  # each chosen expert's weight multiplies its input instead of its output
                                 # (build_moe_ffn's weight_before_ffn, Llama 4)

    @property
    def n_expert(self) -> int:
        return self.routing.n_expert

    @property
    def n_expert_used(self) -> int:
        return self.routing.n_used


@dataclass(frozen=True)
class ShortConv:
    """LFM2's gated short convolution (src/models/lfm2.cpp, build_shortconv_block), for the normed input
    h of position t::

        b, c, x = split(h @ shortconv.in_proj, 3)           (n_embd each)
        u_t     = b * x
        conv_t  = sum_k u_{t - (l_cache - 1) + k} * shortconv.conv[:, k]   k = 0 .. l_cache - 1, per channel
                                                           (ggml_ssm_conv; u before position 0 is 0)
        out     = (c * conv_t) @ shortconv.out_proj

    The state (``state_size``): u of the last ``l_cache - 1`` positions, float32 (l_cache - 1, n_embd),
    oldest first -- llama.cpp's conv state (its r_l row; kept there per channel)."""

    n_embd: int
    l_cache: int        # {arch}.shortconv.l_cache: the convolution's width, this position included

    @property
    def state_size(self) -> int:
        return (self.l_cache - 1) * self.n_embd


#: the ops a Block may hold
OPS = (Attn, MLA, DenseFFN, MoeFFN, ShortConv, DeltaNet)
#: the recurrent ones (a ``state_size`` each; the module's "Recurrent ops")
RECURRENT = (ShortConv, DeltaNet)


@dataclass(frozen=True)
class Block:
    """One step of a layer: ``x += post(op(norm(x)))`` (the module's program)."""

    op: Attn | MLA | DenseFFN | MoeFFN | ShortConv | DeltaNet
    norm: str | None        # the llama.Block attribute of the input norm's weight (None: no input norm)
    post_norm: str | None = None   # the output norm's, before the residual add (None: none)
    scale: float = 0.0      # the output times this before the add (0: none; Granite's residual_scale)


@dataclass(frozen=True)
class Layer:
    blocks: tuple[Block, ...]

    def _op(self, kinds) -> object | None:
        return next((b.op for b in self.blocks if isinstance(b.op, kinds)), None)

    @property
    def attn(self) -> Attn | MLA | None:
        return self._op((Attn, MLA))

    @property
    def delta_net(self) -> DeltaNet | None:
        return self._op(DeltaNet)

    @property
    def ffn(self) -> DenseFFN | MoeFFN | None:
        return self._op((DenseFFN, MoeFFN))

    @property
    def recurrent(self):
        """The layer's recurrent op (``RECURRENT``), or None."""
        return self._op(RECURRENT)

    @property
    def state_size(self) -> int:
        """float32 values of state the layer carries per sequence (0: none; the module's "Recurrent ops")."""
        r = self.recurrent
        return r.state_size if r is not None else 0

    @property
    def moe(self) -> bool:
        return isinstance(self.ffn, MoeFFN)


def describe(config, block, il: int) -> Layer:
    """The ``Layer`` of layer ``il``: the config's (``LlamaConfig``) architecture row and hyperparameters,
    and which tensors ``block`` (a loaded ``llama.Block``) has -- a layer with a router is a MoE layer, one
    with ``ffn_gate`` a dense one (DeepSeek's and GLM's leading dense layers)."""
    c, a = config, config.arch
    swa = c.is_swa(il)
    # a recurrent layer (hparams.is_recr): the row's recurrent op in the attention's place
    if c.is_recurrent(il) and a.recurrent == "shortconv":
        attn = ShortConv(n_embd=c.n_embd, l_cache=c.l_cache)
    elif c.is_recurrent(il):    # "delta_net"
        attn = DeltaNet(n_k_heads=c.ssm_n_group, n_v_heads=c.ssm_dt_rank, head_dim=c.ssm_d_state, d_conv=c.ssm_d_conv)
    elif a.mla:
        attn = MLA(n_head=c.n_head, n_lora_q=c.n_lora_q, n_lora_kv=c.n_lora_kv, n_nope=c.head_dim - c.n_rot,
                   n_rot=c.n_rot, n_v=c.head_dim_v, rope_neox=a.rope_neox)
    else:
        rope = not (a.nope_step and (il + 1) % a.nope_step == 0)
        attn = Attn(rope_neox=a.rope_neox, rope=rope,
                    qk_norm_full=a.qk_norm_full, softcap=c.attn_softcap,
                    qkv_bias=any(getattr(block, n) is not None for n in ("attn_q_bias", "attn_k_bias", "attn_v_bias")),
                    qk_norm=block.attn_q_norm is not None,
                    n_swa=c.n_swa if swa else 0, rope_table=1 if swa else 0, sinks=block.attn_sinks is not None,
                    out_bias=block.attn_output_bias is not None, gate=a.attn_gate, **_llama4_attn(c, swa, rope))
    if block.ffn_gate_inp is not None:
        # build_moe_ffn's arguments as the config read them (llama.LlamaConfig: the arch row's or the file's)
        routing = Routing(n_expert=c.n_expert, n_used=c.n_expert_used, gating=c.moe_gating, norm_w=c.moe_norm_w,
                          w_scale=c.expert_weights_scale, n_group=c.n_expert_groups,
                          n_group_used=c.n_group_used, score_bias=block.exp_probs_b is not None,
                          select_logits=a.moe_select_logits)
        ffn = MoeFFN(routing, n_ff=c.n_ff_exp, glu=a.glu,
                     n_ff_shexp=c.n_ff_shexp if block.ffn_gate_shexp is not None else 0,
                     shexp_gate=block.ffn_gate_inp_shexp is not None, biases=a.moe_biases,
                     gate_up=block.ffn_gate_up_exps is not None, weight_before=a.moe_weight_before)
    else:
        ffn = DenseFFN(glu=a.glu, n_ff=c.n_ff)
    return Layer((Block(attn, "attn_norm" if block.attn_norm is not None else None,
                        "post_attention_norm" if block.post_attention_norm is not None else None, c.residual_scale),
                  Block(ffn, "ffn_norm" if block.ffn_norm is not None else None,
                        "post_ffw_norm" if block.post_ffw_norm is not None else None, c.residual_scale)))


def _llama4_attn(c, swa: bool, rope: bool) -> dict:
    """Attn's fields for the config's chunked attention, L2 q/k norm and NoPE temperature (Llama 4;
    src/models/llama4.cpp): a chunked layer's n_swa is its chunk, the L2 norm on the RoPE layers, the
    temperature on the others."""
    out: dict = {}
    if c.swa_chunked and swa:
        out["chunked"] = True
    if c.qk_l2 and rope:
        out["l2_norm"] = True
    if c.attn_temp and not rope:
        out.update(temp_floor=c.attn_temp[0], temp_scale=c.attn_temp[1], temp_offset=c.attn_temp[2])
    return out
