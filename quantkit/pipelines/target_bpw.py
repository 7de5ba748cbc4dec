"""``quantize --target-bpw``: measure what each tensor loses in each type, then let the allocator choose.

Three steps, all before the first output byte (docs/quantize.md, "Choosing the mix"):

1. **Errors.** For every tensor the allocation may change and every type its row length allows, the
   importance-weighted squared error of quantizing it, ``D(t, q) = sum_rows sum_j w_j (x - x^)^2`` with
   ``w_j`` the imatrix's mean squared activation of column j (what llama-quantize gives the codecs). With
   those weights ``D`` estimates ``E||(W - W^) a||^2``, the squared error the tensor adds to its matmul's
   output. It is measured on an evenly spaced sample of rows (``sample_rows``) and scaled to all rows.
2. **Sensitivity.** How much a unit of ``D`` in a tensor class (attn_q, ..., ffn_down, the embeddings;
   a MoE layer's routed and shared experts apart: ffn_down_exps, ffn_down_shexp, ...) moves the model's output: one forward pass of the source model over a calibration chunk, then one per
   class with every tensor of the class quantized to a probe type (~4.5 bits), ``s_c = KLD_c / D_c``
   (KL divergence of the next-token distributions against the unperturbed pass). Losses then read
   ``loss(t, q) = s_class(t) * D(t, q)``, an estimate of the KLD the choice adds; KLD is quadratic in
   small logit errors, so independent errors add, which is what the allocator assumes.
   Architectures quantkit cannot run get ``s = 1`` everywhere (the weighted error alone), with a note.
3. **Allocation.** ``quantkit.allocation.allocate`` under the byte budget; fixed tensors (``--tensor-type``
   matches, ``--output-tensor-type``, ``--token-embedding-type``, ``--pure``, tensors never quantized) keep
   their type and count toward it.

The result is a list of ``^name$=type`` patterns: appended to ``--tensor-type``, plain quantization (ours
or llama-quantize's ``--tensor-type-file``) produces the chosen file.
"""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from quantkit.allocation import (Allocation, AllocationError, Candidate, Item, allocate, allowed_types,
                                 budget_for_bpw)
from quantkit.errors import QuantkitError
from quantkit.formats.ggml_types import type_info
from quantkit.formats.gguf_io import GGUFModel, Tensor, tensor_nbytes
from quantkit.formats.imatrix import Imatrix
from quantkit.model.llama import Weight
from quantkit.policy import OUTPUT, TOKEN_EMBD, TypePlan
from quantkit.typenames import ggml_type_name

Q = GGMLQuantizationType
Log = Callable[[str], None]

#: the probe's bits per weight: the candidate nearest to it perturbs a class in the sensitivity pass
PROBE_BPW = 4.5
#: rows per tensor whose errors are measured (evenly spaced; scaled to the whole tensor)
SAMPLE_ROWS = 64
#: the sensitivity pass: 2 chunks of 64 calibration tokens. Chunks of 32 tokens or more take the
#: forward's batch path (each matrix dequantized once per pass, then BLAS), which costs 0.4x the CPU time
#: of the GEMV that chunks under 32 take, per token (SmolLM2-135M F16: 128 tokens in 0.52 s against
#: 4 x 31 in 1.29 s a pass; docs/quantize.md "Planning time")
SENS_CTX = 64
SENS_CHUNKS = 2
#: the sensitivity pass holds every matrix as float32 (dequantized once, then plain BLAS products in
#: every pass) when that copy takes at most this many bytes; larger models dequantize per pass
SENS_F32_MAX_BYTES = 2 << 30
#: tied or untied, the embedding matrix and the output projection form one class
EMBEDDINGS = "embeddings"
#: the name parts of a MoE layer's routed experts (3D tensors) and shared expert
EXPERT_KINDS = ("_exps", "_shexp")


class TargetError(QuantkitError):
    """A ``--target-bpw`` / ``--target-size`` request that cannot be carried out."""


@dataclass
class TargetMix:
    """What the allocator chose and why."""

    allocation: Allocation
    patterns: list[tuple[str, GGMLQuantizationType]]        # ^name$ -> type, for the free tensors
    sensitivity: dict[str, float]                            # class -> KLD per unit of weighted error
    probe_kld: dict[str, float]                              # class -> measured KLD with the probe
    losses: dict[str, dict[str, float]]                      # tensor -> {type name: loss}
    free: list[str]                                          # the tensors the allocator chose for
    target_bpw: float
    budget: int
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def predicted_kld(self) -> float:
        return self.allocation.loss

    @property
    def predicted_bpw(self) -> float:
        return self.allocation.bpw

    def to_json(self) -> dict:
        return {
            "target_bpw": self.target_bpw,
            "budget_bytes": self.budget,
            "predicted_bytes": self.allocation.nbytes,
            "predicted_bpw": self.predicted_bpw,
            "predicted_kld": self.predicted_kld,
            "sensitivity": self.sensitivity,
            "probe_kld": self.probe_kld,
            "seconds": self.seconds,
            "tensors": {name: {"type": self.allocation.choice[name].qtype.name,
                               "loss": self.allocation.choice[name].loss,
                               "candidates": self.losses[name]} for name in self.free},
        }


def tensor_class(name: str, category: str) -> str:
    """The sensitivity class: the tensor's category, with token_embd and output as one class; in a
    mixture-of-experts layer the routed experts (``ffn_up_exps``, ...) and the shared expert
    (``ffn_up_shexp``, ...) are classes of their own beside the dense FFN's, as the recipes people tune
    keep them apart (the router, ``ffn_gate_inp``, is never quantized)."""
    if category in (TOKEN_EMBD, OUTPUT):
        return EMBEDDINGS
    for kind in EXPERT_KINDS:
        if f"{kind}." in name:
            return category + kind
    return category


def candidate_types(ne0: int, only: Sequence[GGMLQuantizationType] = ()) -> list[GGMLQuantizationType]:
    """Every storage type with a codec the allocator may choose (by default, or those of ``only``) whose
    block fits a row of ``ne0``: the type table's ``target_bpw`` column (formats/ggml_types.py) says which
    it never chooses and which only when named."""
    from quantkit.quants import TRAITS

    def chosen(t):
        how = type_info(t).target_bpw
        return how != "never" and (t in only if only else how == "default")

    return allowed_types(ne0, [t for t in TRAITS if chosen(t)])


def pattern_for(name: str) -> str:
    """An anchored regex matching exactly ``name`` (llama-quantize lower-cases patterns; GGUF names
    are lower-case already)."""
    return "^" + re.escape(name) + "$"


# -- step 1: weighted errors ----------------------------------------------------------------------

def _sample_rows(n_rows: int, k: int) -> np.ndarray:
    if n_rows <= k:
        return np.arange(n_rows)
    return np.unique(np.linspace(0, n_rows - 1, k).round().astype(np.int64))


def weighted_errors(t: Tensor, types: Sequence[GGMLQuantizationType], weights: np.ndarray | None,
                    sample_rows: int = SAMPLE_ROWS) -> dict[GGMLQuantizationType, float]:
    """``D(t, q)`` for each type: the importance-weighted squared error over a row sample, scaled to
    the whole tensor. ``weights``: the imatrix's [n_mat, ne0] weights, or None (every weight 1)."""
    from quantkit.quants import dequantize, quantize

    ne0 = int(t.shape[0])
    n_rows = t.n_elements // ne0
    rows_idx = _sample_rows(n_rows, sample_rows)
    x = dequantize(np.asarray(t.data).reshape(n_rows, -1)[rows_idx], t.type).reshape(len(rows_idx), ne0)
    n_mat = 1 if weights is None else weights.shape[0]
    per_mat = n_rows // n_mat
    mat_of = rows_idx // per_mat
    out: dict[GGMLQuantizationType, float] = {}
    for q in types:
        err = 0.0
        for m in np.unique(mat_of):
            sel = mat_of == m
            xs = np.ascontiguousarray(x[sel])
            w = None if weights is None else np.ascontiguousarray(weights[m], dtype=np.float32)
            y = dequantize(quantize(xs, q, w), q).reshape(xs.shape)
            d = (xs.astype(np.float64) - y) ** 2
            err += float((d @ (np.ones(ne0) if w is None else w.astype(np.float64))).sum())
        out[q] = err * n_rows / len(rows_idx)
    return out


def all_weighted_errors(model: GGUFModel, names: Sequence[str],
                        cands: dict[str, Sequence[GGMLQuantizationType]],
                        weights_of: Callable[[str], np.ndarray | None], source_of: Callable[[str], str] = lambda n: n,
                        sample_rows: int = SAMPLE_ROWS) -> dict[str, dict[GGMLQuantizationType, float]]:
    """``weighted_errors`` of every tensor of ``names`` (the model's ``source_of(name)``) in its
    candidates. The tensors are shared out among numba's thread count of Python threads, each running
    its codecs on one numba thread (the kernels release the GIL): a row sample is too small to pay for
    a parallel region per (tensor, type) -- on SmolLM2-135M 7.5 s of CPU with 2-thread regions against
    4.6 s on one thread. Each tensor's result does not depend on the threads."""
    from quantkit.jit import get_threads, set_threads

    def one(name: str) -> dict[GGMLQuantizationType, float]:
        src = model.tensor(source_of(name))
        try:
            return weighted_errors(src, cands[name], weights_of(name), sample_rows)
        finally:
            model.release(src)

    def in_worker(name: str) -> dict[GGMLQuantizationType, float]:
        set_threads(1)  # numba's count is thread-local: the caller's is untouched
        return one(name)

    n = get_threads()
    if n <= 1:
        return {name: one(name) for name in names}
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="quantkit-errors") as pool:
        return dict(zip(names, pool.map(in_worker, names)))


# -- step 2: sensitivity -------------------------------------------------------------------------

def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z -= z.max(axis=1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=1, keepdims=True))


def kld(base_lp: np.ndarray, logits: np.ndarray, base_p: np.ndarray | None = None) -> float:
    """Mean over rows of KL(base || this), from base log-probs (and their exp, ``base_p``, if at hand)
    and this run's logits."""
    lp = _log_softmax(logits)
    p = np.exp(base_lp) if base_p is None else base_p
    return float((p * (base_lp - lp)).sum(axis=1).mean())


def _block_weights(block) -> list[tuple[str, Weight]]:
    """(attribute, Weight) of every tensor a layer multiplies by (attention, FFN, experts, router)."""
    return [(a, w) for a, w in vars(block).items() if isinstance(w, Weight)]


def _hold_as_f32(runners, max_bytes: int = SENS_F32_MAX_BYTES) -> bool:
    """Give ``runners`` (of one model) float32 copies of its matrices (one object per tensor, shared by
    the runners, so a tied embedding stays one) when they fit ``max_bytes``: every pass then multiplies them directly instead of dequantizing
    each matrix again (the products are exact float32 ones rather than ggml's rounding of activations
    to F16, the same in the base pass and the perturbed ones)."""
    import dataclasses

    holders = [(r, a) for r in runners for a in ("token_embd", "output")]
    holders += [(b, a) for r in runners for b in r.blk for a, _ in _block_weights(b)]
    weights = {id(getattr(o, a)): getattr(o, a) for o, a in holders}
    if 4 * sum(w.data.shape[0] * w.shape[0] for w in weights.values()) > max_bytes:
        return False
    f32 = {k: dataclasses.replace(w, type=GGMLQuantizationType.F32, data=w.dequantize().view(np.uint8))
           for k, w in weights.items()}
    for o, a in holders:
        w = f32.get(id(getattr(o, a)))
        if w is not None:  # runners share their blocks: replaced already through another runner
            setattr(o, a, w)
    return True


def measure_sensitivity(path, groups: dict[str, list[str]], probe: dict[str, GGMLQuantizationType],
                        weights_of: Callable[[str], np.ndarray | None], probe_err: dict[str, float],
                        n_ctx: int = SENS_CTX, n_chunks: int = SENS_CHUNKS,
                        log: Log = lambda s: None) -> tuple[dict[str, float], dict[str, float]]:
    """``(s, kld)`` per class: KLD of the source model with the class quantized to its probe types,
    over ``n_chunks`` calibration chunks of ``n_ctx`` tokens, divided by the class's summed probe error.

    Raises ``ModelError`` when quantkit cannot run the architecture."""
    import dataclasses

    from quantkit.jit import get_threads, set_threads
    from quantkit.kernels.mul_mat import blas_one_thread
    from quantkit.pipelines.chunks import add_bos_id, chunk_input, read_text
    from quantkit.pipelines.loading import open_model
    from quantkit.quants import quantize

    om = open_model(path)
    model, tok = om.model, om.tok
    pool = ThreadPoolExecutor(max_workers=max(1, min(get_threads(), n_chunks)), thread_name_prefix="quantkit-sens")
    try:
        text, _ = read_text(None, "calibration")
        ids = np.asarray(tok.encode(text[: 20 * n_ctx * n_chunks], add_special=True), dtype=np.int64)
        if ids.size < n_ctx * n_chunks:
            raise TargetError(f"the calibration text gives only {ids.size} tokens, {n_ctx * n_chunks} are needed")
        xs = [chunk_input(ids, i, n_ctx, add_bos_id(tok)) for i in range(n_chunks)]
        # the chunks run side by side, one runner (and one numba and BLAS thread) each: a 64-token pass
        # is many small products and norms, too small to pay for a parallel region each
        n_par = max(1, min(get_threads(), n_chunks))
        runners = [om.runner(n_ctx, n_ctx, compiled_step=False) for _ in range(n_par)]
        runner = runners[0]
        rows = np.arange(1, n_ctx)
        _hold_as_f32(runners)

        def part(j: int) -> list[np.ndarray]:
            if n_par > 1:
                set_threads(1)  # thread-local
            out = []
            for x in xs[j::n_par]:
                runners[j].reset()
                out.append(runners[j].forward(x, 0, logits=rows))
            return out

        def run() -> list[np.ndarray]:
            if n_par == 1:
                return part(0)
            with blas_one_thread():
                parts = list(pool.map(part, range(n_par)))
            return [parts[i % n_par][i // n_par] for i in range(n_chunks)]

        base = [_log_softmax(lg) for lg in run()]
        base_p = [np.exp(b) for b in base]
        where: dict[str, tuple[object, str]] = {}
        for b in runner.blk:
            for attr, w in _block_weights(b):
                where[w.name] = (b, attr)
        sens, klds = {}, {}
        for cls, names in groups.items():
            saved = []
            for name in names:
                holders = [(r, a) for r in runners for a in ("token_embd", "output") if getattr(r, a).name == name]
                if name in where:
                    holders.append(where[name])
                if not holders:
                    continue
                w0 = getattr(holders[0][0], holders[0][1])
                f = w0.data.view(np.float32) if w0.type == GGMLQuantizationType.F32 else w0.dequantize()
                wts = weights_of(name)
                qt = probe[name]
                # a 3D experts tensor: each expert with its own imatrix row, as quantize does
                mats = f.reshape(w0.n_expert, -1, f.shape[-1])
                qb = np.concatenate([quantize(m, qt, None if wts is None else wts[e]) for e, m in enumerate(mats)])
                w1 = dataclasses.replace(w0, type=qt, data=qb.reshape(w0.data.shape[0], -1))
                for obj, attr in holders:
                    saved.append((obj, attr, getattr(obj, attr)))
                    setattr(obj, attr, w1)
            try:
                k = float(np.mean([kld(b, lg, p) for b, lg, p in zip(base, run(), base_p)]))
            finally:
                for obj, attr, w in reversed(saved):
                    setattr(obj, attr, w)
            d = sum(probe_err[n] for n in names)
            klds[cls] = k
            sens[cls] = k / d if d > 0 else 0.0
            log(f"target-bpw: class {cls:<12s} {len(names):3d} tensors, probe KLD {k:.6f}")
        return sens, klds
    finally:
        pool.shutdown()
        model.close()


# -- step 3: allocation --------------------------------------------------------------------------

def choose_mix(model: GGUFModel, type_plan: TypePlan, imatrix: Imatrix, *, target_bpw: float | None = None,
               target_bytes: int | None = None, fixed_names: set[str] = frozenset(), sample_rows: int = SAMPLE_ROWS,
               only: Sequence[GGMLQuantizationType] = (), sensitivity: bool = True, log: Log = lambda s: None,
               source_of: Callable[[str], str] = lambda n: n) -> TargetMix:
    """Choose a type for every free tensor of ``type_plan`` (the plan quantize would make without a
    target) so the file is at most ``target_bpw`` bits per weight (or ``target_bytes`` of tensor data).

    Free: quantizable, not decided by a ``--tensor-type`` pattern, not in ``fixed_names``. ``only``: the
    candidate types (default: every type quantkit writes)."""
    t_start, c_start = time.perf_counter(), time.process_time()
    by_name = {p.name: p for p in type_plan.tensors}
    n_elements = 0
    fixed_bytes = 0
    free: list[str] = []
    for p in type_plan.tensors:
        n = int(np.prod(p.shape))
        n_elements += n
        if p.quantizable and not p.manual and p.name not in fixed_names:
            free.append(p.name)
        else:
            fixed_bytes += tensor_nbytes(p.shape, p.target)
    if target_bytes is not None:
        budget = int(target_bytes)
        target = 8.0 * budget / max(1, n_elements)
    else:
        assert target_bpw is not None
        target = float(target_bpw)
        budget = budget_for_bpw(target, n_elements)
    if not free:
        raise TargetError("every tensor's type is fixed (--pure, --tensor-type, ...): there is nothing to choose")
    cands = {n: candidate_types(by_name[n].shape[0], only) for n in free}
    for n, c in cands.items():
        if not c:
            raise TargetError(f"tensor {n}: none of the types {', '.join(ggml_type_name(q) for q in only)} "
                              f"fits its row length {by_name[n].shape[0]}")
    smallest = fixed_bytes + sum(min(tensor_nbytes(by_name[n].shape, q) for q in cands[n]) for n in free)
    if smallest > budget:
        raise TargetError(f"target {target:.4f} BPW ({budget} bytes) is too small: the smallest types the tensors "
                          f"allow give {8.0 * smallest / max(1, n_elements):.4f} BPW ({smallest} bytes)")

    def weights_of(name: str) -> np.ndarray | None:
        return imatrix.weights(source_of(name))

    t0, c0 = time.perf_counter(), time.process_time()
    errors = all_weighted_errors(model, free, cands, weights_of, source_of, sample_rows)
    t_err, c_err = time.perf_counter() - t0, time.process_time() - c0
    log(f"target-bpw: weighted errors of {sum(len(e) for e in errors.values())} (tensor, type) pairs "
        f"in {t_err:.1f} s")

    groups: dict[str, list[str]] = {}
    for name in free:
        groups.setdefault(tensor_class(name, by_name[name].category), []).append(name)
    probe = {}
    for name in free:
        types = list(errors[name])
        nonzero = [q for q in types if errors[name][q] > 0] or types
        # ties go to the oldest type (Q4_0 before Q4_K before IQ4_NL): the cheapest codec to run
        probe[name] = min(nonzero, key=lambda q: (abs(8.0 * GGML_QUANT_SIZES[q][1] / GGML_QUANT_SIZES[q][0]
                                                      - PROBE_BPW), q.value))
    t0, c0 = time.perf_counter(), time.process_time()
    sens = {c: 1.0 for c in groups}
    klds: dict[str, float] = {}
    if sensitivity:
        from quantkit.errors import ModelError

        try:
            sens, klds = measure_sensitivity(
                model.path, groups, probe, weights_of, {n: errors[n][probe[n]] for n in free}, log=log)
        except ModelError as e:
            log(f"target-bpw: note: no sensitivity pass ({e}); losses are the weighted errors alone")
    t_sens, c_sens = time.perf_counter() - t0, time.process_time() - c0

    items = []
    losses: dict[str, dict[str, float]] = {}
    for p in type_plan.tensors:
        if p.name in errors:
            s = sens[tensor_class(p.name, p.category)]
            cands = tuple(Candidate(q, tensor_nbytes(p.shape, q), s * d) for q, d in errors[p.name].items())
            losses[p.name] = {c.qtype.name: c.loss for c in cands}
            items.append(Item(p.name, int(np.prod(p.shape)), cands))
    try:
        alloc = allocate(items, budget - fixed_bytes, n_elements)
    except AllocationError as e:
        raise TargetError(f"target {target:.4f} BPW ({budget} bytes): {e}") from None
    alloc.budget = budget
    patterns = [(pattern_for(n), alloc.choice[n].qtype) for n in free]
    mix = TargetMix(alloc, patterns, sens, klds, losses, free, target, budget,
                    {"errors": t_err, "sensitivity": t_sens, "total": time.perf_counter() - t_start,
                     "errors_cpu": c_err, "sensitivity_cpu": c_sens, "total_cpu": time.process_time() - c_start})
    # the allocation's bytes are the free tensors'; the file's add the fixed ones
    mix.allocation.choice.update({p.name: Candidate(p.target, tensor_nbytes(p.shape, p.target), 0.0)
                                  for p in type_plan.tensors if p.name not in errors})
    return mix


def tensor_type_file_text(patterns: Sequence[tuple[str, GGMLQuantizationType | str]]) -> str:
    """``PATTERN=type`` lines as llama-quantize's ``--tensor-type-file`` reads them (the user's own
    ``--tensor-type`` patterns first, as given, then the chosen ones)."""
    from quantkit.typenames import parse_ggml_type

    return "".join(f"{p}={ggml_type_name(parse_ggml_type(q))}\n" for p, q in patterns)


# -- the quantize pipeline's entry ---------------------------------------------------------------

def apply_target(model: GGUFModel, opts, log: Log = lambda s: None):
    """``(opts with the chosen patterns appended to tensor_types, TargetMix)`` for a quantize run with
    ``opts.target_bpw`` or ``opts.target_size``; every refusal comes before the measurements."""
    import dataclasses

    from quantkit.pipelines.quantize import plan_quantization

    if opts.imatrix is None:
        raise TargetError("--target-bpw/--target-size need --imatrix FILE: each tensor's error is weighted by it")
    if opts.pure:
        raise TargetError("--pure fixes every tensor to the file type's default: nothing is left for "
                          "--target-bpw/--target-size to choose")
    base = plan_quantization(model, opts, strict=True)
    if not base.ftype.is_quantized:
        raise TargetError(f"--target-bpw/--target-size need a quantized file type, not {base.ftype.name} "
                          f"(llama-quantize applies per-tensor types only to those)")
    if base.imatrix is None:
        raise TargetError(f"{opts.imatrix}: the imatrix has no entry for this model's tensors")
    tp = base.type_plan
    has_output = any(p.name == "output.weight" for p in tp.tensors)
    fixed = set()
    for p in tp.tensors:
        if p.category == TOKEN_EMBD and (opts.token_embedding_type is not None
                                        or (opts.output_tensor_type is not None and not has_output)):
            fixed.add(p.name)
        if p.category == OUTPUT and opts.output_tensor_type is not None:
            fixed.add(p.name)
    source = {j.name: j.src.name for j in base.jobs}
    mix = choose_mix(model, tp, base.imatrix, target_bpw=opts.target_bpw, target_bytes=opts.target_size,
                     fixed_names=fixed, only=tuple(opts.target_types), log=log, source_of=lambda n: source[n])
    return dataclasses.replace(opts, tensor_types=tuple(opts.tensor_types) + tuple(mix.patterns)), mix


def target_lines(mix: TargetMix, achieved_bytes: int, n_elements: int) -> list[str]:
    """What the run reports about the target: asked, predicted, achieved."""
    achieved = 8.0 * achieved_bytes / max(1, n_elements)
    return [
        f"target-bpw: target {mix.target_bpw:.4f} BPW ({mix.budget} bytes): predicted {mix.predicted_bpw:.4f} BPW "
        f"({mix.allocation.nbytes} bytes), achieved {achieved:.4f} BPW ({achieved_bytes} bytes)",
        f"target-bpw: predicted KLD added vs the source {mix.predicted_kld:.3g}; planned in "
        f"{mix.seconds['total']:.1f} s, {mix.seconds['total_cpu']:.1f} s CPU (errors {mix.seconds['errors_cpu']:.1f} s, "
        f"sensitivity {mix.seconds['sensitivity_cpu']:.1f} s CPU)",
    ]
