"""``llama-quantize`` as a pipeline: plan every tensor first, then stream them through the codecs.

Pass 1 (``plan_quantization``) decides each tensor's type with ``quantkit.policy`` and checks every
reason to refuse (requantizing without permission, a missing or mis-sized imatrix, a fallback under
``--no-fallback``) before any byte is written. Pass 2 (``write_quantized``) streams each tensor a slab
of rows at a time: decoded into a small reused float32 buffer, quantized on N threads, checked like
ggml_validate_row_data, its source pages released; a finished tensor is written on a second thread
while the next is quantized, to a temporary file renamed into place only when complete. Peak memory is
a few output tensors, not a float32 copy of any tensor.

The output matches llama-quantize's: the same metadata (input keys in order, then
``general.quantization_version`` and ``general.file_type`` moved to the end as gguf's set does, split
keys removed, ``--override-kv`` and imatrix keys after), tensors in llama.cpp's order (by layer, then
name), 32-byte alignment, and the codecs' bytes.
"""

from __future__ import annotations

import json
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from quantkit.errors import QuantkitError
from quantkit.formats.atomic import preflight, write_bytes
from quantkit.formats.gguf_io import KV, GGUFModel, GGUFOutput, Tensor, remove_kv, set_kv
from quantkit.formats.imatrix import Imatrix, load_imatrix
from quantkit.pause import pause_point
from quantkit.policy import FileType, PolicyError, TypePlan, ggml_type_name, parse_ftype, plan_types

GGML_QNT_VERSION = 2
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
_LAYER_RX = re.compile(r"^blk\.(\d+)\.")
_FLOAT_TYPES = (GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16)


class QuantizeError(QuantkitError):
    """The quantization cannot be carried out as asked; raised before any output is written."""


@dataclass
class QuantizeOptions:
    ftype: str | int
    threads: int | None = None
    allow_requantize: bool = False
    leave_output_tensor: bool = False
    pure: bool = False
    imatrix: str | os.PathLike | None = None
    include_weights: tuple[str, ...] = ()
    exclude_weights: tuple[str, ...] = ()
    output_tensor_type: str | None = None
    token_embedding_type: str | None = None
    tensor_types: tuple[tuple[str, str], ...] = ()
    prune_layers: tuple[int, ...] = ()
    override_kv: tuple[KV, ...] = ()
    no_fallback: bool = False
    #: choose the mix (quantkit.pipelines.target_bpw): at most this BPW, or this many bytes of tensors
    target_bpw: float | None = None
    target_size: int | None = None
    #: with a target: the candidate types (default: every type the row length allows)
    target_types: tuple[GGMLQuantizationType, ...] = ()
    #: with a target: where to write the chosen types as a --tensor-type-file
    tensor_type_out: str | os.PathLike | None = None


@dataclass
class TensorJob:
    """One tensor of the output: where it comes from and what becomes of it."""

    src: Tensor  # the input tensor (original name)
    name: str  # output name (differs from src.name only after --prune-layers)
    target: GGMLQuantizationType
    quantize: bool  # False: bytes copied unchanged
    fallback_from: GGMLQuantizationType | None = None
    manual: bool = False
    imatrix: np.ndarray | None = None  # [n_mat, ne0] weights, when used
    imatrix_note: str = ""

    @property
    def src_bytes(self) -> int:
        return self.src.nbytes

    @cached_property
    def out_tensor(self) -> Tensor:
        return Tensor(self.name, self.src.shape, self.target)

    @cached_property
    def out_bytes(self) -> int:
        return self.out_tensor.nbytes


@dataclass
class QuantPlan:
    input: Path
    ftype: FileType
    jobs: list[TensorJob]
    kv: list[KV]
    type_plan: TypePlan
    imatrix: Imatrix | None = None
    #: reasons the real run would be refused; plan_quantization(strict=True) raises on the first
    problems: list[str] = field(default_factory=list)

    @property
    def n_elements(self) -> int:
        return sum(j.src.n_elements for j in self.jobs)

    @property
    def size_in(self) -> int:
        return sum(j.src_bytes for j in self.jobs)

    @property
    def size_out(self) -> int:
        return sum(j.out_bytes for j in self.jobs)

    @property
    def fallbacks(self) -> list[TensorJob]:
        return [j for j in self.jobs if j.fallback_from is not None]

    def fallback_cost_bits(self) -> float:
        """How many bits per weight the fallbacks add over the intended types, model-wide."""
        extra = 0
        for j in self.fallbacks:
            block, size = GGML_QUANT_SIZES[j.fallback_from]
            intended = j.src.n_elements * size / block
            extra += j.out_bytes - intended
        return 8.0 * extra / max(1, self.n_elements)

    def to_json(self) -> dict[str, Any]:
        return {
            "input": str(self.input),
            "ftype": self.ftype.name,
            "file_type_id": self.ftype.ftype_id,
            "size_in": self.size_in,
            "size_out": self.size_out,
            "bpw_in": 8.0 * self.size_in / max(1, self.n_elements),
            "bpw_out": 8.0 * self.size_out / max(1, self.n_elements),
            "n_fallback": len(self.fallbacks),
            "tensors": [
                {
                    "name": j.name,
                    "source_name": j.src.name,
                    "shape": list(j.src.shape),
                    "source_type": j.src.type.name,
                    "type": j.target.name,
                    "quantize": j.quantize,
                    "manual": j.manual,
                    "fallback_from": j.fallback_from.name if j.fallback_from else None,
                    "imatrix": j.imatrix is not None,
                    "bytes_in": j.src_bytes,
                    "bytes_out": j.out_bytes,
                }
                for j in self.jobs
            ],
        }


# -- pass 1: planning ----------------------------------------------------------------------------

def prune_names(names: list[str], prune: tuple[int, ...]) -> dict[str, str | None]:
    """llama.cpp's remap_layer: drop pruned ``blk.N.`` tensors and renumber the rest contiguously.

    ``names`` must be in processing order (ascending layer). Returns old name -> new name (None if
    dropped).
    """
    drop = set(int(i) for i in prune)
    mapped: dict[int, int] = {}
    out: dict[str, str | None] = {}
    for n in names:
        m = _LAYER_RX.match(n)
        if not m:
            out[n] = n
            continue
        layer = int(m.group(1))
        if layer in drop:
            out[n] = None
            continue
        if layer not in mapped:
            mapped[layer] = len(mapped)
        out[n] = f"blk.{mapped[layer]}." + n[m.end():]
    return out


def output_kv(model: GGUFModel, ftype: FileType, opts: QuantizeOptions, imatrix: Imatrix | None,
              n_block_after_prune: int | None) -> list[KV]:
    kvs = list(model.kv)
    kvs = remove_kv(kvs, "general.quantization_version")
    kvs.append(KV("general.quantization_version", GGML_QNT_VERSION, GGUFValueType.UINT32))
    file_type = ftype.ftype_id
    if ftype.only_copy:
        file_type = int(model.metadata.get("general.file_type", 0))
    kvs = remove_kv(kvs, "general.file_type")
    kvs.append(KV("general.file_type", file_type, GGUFValueType.UINT32))
    kvs = remove_kv(kvs, *SPLIT_KEYS)
    if n_block_after_prune is not None:
        key = f"{model.arch}.block_count"
        kvs = remove_kv(kvs, key)
        kvs.append(KV(key, n_block_after_prune, GGUFValueType.UINT32))
    extra = list(opts.override_kv)
    if imatrix is not None:
        src = str(opts.imatrix)[:127]
        extra.append(KV("quantize.imatrix.file", src, GGUFValueType.STRING))
        if imatrix.datasets:
            extra.append(KV("quantize.imatrix.dataset", imatrix.datasets[0], GGUFValueType.STRING))
        extra.append(KV("quantize.imatrix.entries_count", len(imatrix.entries), GGUFValueType.UINT32))
        extra.append(KV("quantize.imatrix.chunks_count", int(imatrix.chunk_count), GGUFValueType.UINT32))
    for kv in extra:
        kvs = remove_kv(kvs, kv.key)
        kvs.append(kv)
    return kvs


def parse_override_kv(arg: str) -> KV:
    """``KEY=TYPE:VALUE`` with TYPE int, float, bool or str (llama.cpp's --override-kv)."""
    key, sep, rest = arg.partition("=")
    kind, sep2, value = rest.partition(":")
    if not sep or not sep2 or not key or len(key) >= 128:
        raise QuantizeError(f"invalid --override-kv {arg!r}: expected KEY=TYPE:VALUE with TYPE int, float, bool or str")
    try:
        if kind == "int":
            # llama.cpp writes ints as u32 of the absolute value
            return KV(key, abs(int(value, 0)), GGUFValueType.UINT32)
        if kind == "float":
            return KV(key, float(value), GGUFValueType.FLOAT32)
        if kind == "bool":
            if value not in ("true", "false"):
                raise ValueError(value)
            return KV(key, value == "true", GGUFValueType.BOOL)
        if kind == "str":
            if len(value) > 127:
                raise QuantizeError(f"invalid --override-kv {arg!r}: string values are limited to 127 characters")
            return KV(key, value, GGUFValueType.STRING)
    except ValueError:
        raise QuantizeError(f"invalid --override-kv {arg!r}: {value!r} is not a valid {kind}") from None
    raise QuantizeError(f"invalid --override-kv {arg!r}: type must be int, float, bool or str, not {kind!r}")


def plan_quantization(model: GGUFModel, opts: QuantizeOptions, strict: bool = True) -> QuantPlan:
    """Decide every tensor's type and check everything that could fail, writing nothing.

    With ``strict`` the first problem raises ``QuantizeError``; otherwise (``--dry-run``) problems are
    kept in ``plan.problems`` for the caller to report.
    """
    ftype = parse_ftype(opts.ftype)
    if opts.include_weights and opts.exclude_weights:
        raise QuantizeError("--include-weights and --exclude-weights cannot be used together")
    imatrix = None
    if opts.imatrix is not None:
        imatrix = load_imatrix(opts.imatrix).filtered(tuple(opts.include_weights), tuple(opts.exclude_weights))
        if not imatrix.entries:  # llama-quantize then proceeds as if no imatrix was given
            imatrix = None

    by_name = {t.name: t for t in model.tensors}
    from quantkit.policy import check_loadable, processing_order_key

    order = sorted(by_name, key=processing_order_key)
    n_block = None
    rename = {n: n for n in order}
    if opts.prune_layers:
        rename = prune_names(order, tuple(opts.prune_layers))
        kept_layers = {int(m.group(1)) for n, new in rename.items() if new and (m := _LAYER_RX.match(new))}
        n_block = len(kept_layers)
    kept = [n for n in order if rename[n] is not None]

    try:
        check_loadable(model.metadata)
        tp = plan_types(
            model.metadata,
            [(rename[n], by_name[n].shape, by_name[n].type) for n in kept],
            ftype,
            pure=opts.pure,
            has_imatrix=imatrix is not None,
            output_tensor_type=opts.output_tensor_type,
            token_embedding_type=opts.token_embedding_type,
            tensor_types=tuple(opts.tensor_types),
            leave_output_tensor=opts.leave_output_tensor,
        )
    except PolicyError as e:  # metadata the rules read is wrong: name the file
        if str(model.path) in str(e):
            raise
        raise type(e)(f"{model.path}: {e}") from None
    back = {rename[n]: n for n in kept}
    return _finish_plan(model, opts, ftype, imatrix, tp, back, by_name, n_block, strict)


def _finish_plan(model, opts, ftype, imatrix, tp, back, by_name, n_block, strict) -> QuantPlan:
    """The per-tensor jobs of a type plan, and every reason the real run would be refused."""
    from quantkit.quants import TRAITS

    jobs: list[TensorJob] = []
    problems: list[str] = []
    requant: list[Tensor] = []
    for p in tp.tensors:
        src = by_name[back[p.name]]
        quantize = p.quantizable and p.target != src.type
        job = TensorJob(src, p.name, p.target if quantize else src.type, quantize, p.fallback_from, p.manual)
        if quantize:
            if src.type not in _FLOAT_TYPES and not opts.allow_requantize:
                requant.append(src)
            if imatrix is not None:
                w = imatrix.weights(src.name)
                ne2 = src.shape[2] if len(src.shape) > 2 else 1
                if w is None:
                    job.imatrix_note = f"did not find weights for {src.name}"
                elif w.size != src.shape[0] * ne2:
                    msg = (f"imatrix size {w.size} is different from tensor size {src.shape[0] * ne2} "
                           f"for {src.name}")
                    if p.category == "token_embd":
                        job.imatrix_note = msg
                    else:
                        problems.append(msg)
                else:
                    job.imatrix = w.reshape(ne2, src.shape[0])
            if p.requires_imatrix and job.imatrix is None:
                problems.append(f"{src.name}: target type {p.target.name} requires an importance matrix "
                                f"(--imatrix); the result would be garbage without one")
        jobs.append(job)
    if requant:
        kinds = ", ".join(sorted({ggml_type_name(t.type) for t in requant}))
        problems.insert(0, f"requantizing from type {kinds} is disabled: {len(requant)} tensor(s) are already "
                           f"quantized, e.g. {requant[0].name} (use --allow-requantize)")
    missing = sorted({j.target.name for j in jobs if j.quantize and j.target not in TRAITS})
    if missing:  # the type rules name it, but its codec is not written yet
        first = next(j for j in jobs if j.quantize and j.target.name == missing[0])
        problems.append(f"quantizing to {', '.join(missing)} is not implemented yet in quantkit (no codec), "
                        f"e.g. {first.name}")

    plan = QuantPlan(Path(model.path), ftype, jobs, output_kv(model, ftype, opts, imatrix, n_block), tp, imatrix,
                     problems)
    if opts.no_fallback and plan.fallbacks:
        names = ", ".join(f"{j.name} ({j.fallback_from.name}->{j.target.name}, ncols {j.src.shape[0]})"
                          for j in plan.fallbacks[:4])
        more = f" and {len(plan.fallbacks) - 4} more" if len(plan.fallbacks) > 4 else ""
        problems.append(f"--no-fallback: {len(plan.fallbacks)} tensor(s) would fall back: {names}{more}")
    if problems and strict:
        extra = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise QuantizeError(problems[0] + extra)
    return plan


# -- logging in llama-quantize's words -------------------------------------------------------------

def _shape4(shape) -> str:
    dims = list(shape) + [1] * (4 - len(shape))
    return ", ".join(f"{int(d):6d}" for d in dims[:4])


def tensor_line(i: int, n: int, job: TensorJob, dry_run: bool) -> str:
    head = f"[{i:4d}/{n:4d}] {job.name:<36s} - [{_shape4(job.src.shape)}], type = {ggml_type_name(job.src.type):>6s}, "
    mib_in = job.src_bytes / 1024 / 1024
    if not job.quantize:
        return head + f"size = {mib_in:8.3f} MiB"
    mib_out = job.out_bytes / 1024 / 1024
    if dry_run:
        return head + f"size = {mib_in:8.2f} MiB -> {mib_out:8.2f} MiB ({ggml_type_name(job.target)})"
    return head + f"converting to {ggml_type_name(job.target)} .. size = {mib_in:8.2f} MiB -> {mib_out:8.2f} MiB"


def fallback_lines(plan: QuantPlan) -> list[str]:
    out = []
    for j in plan.fallbacks:
        block = GGML_QUANT_SIZES[j.fallback_from][0]
        must_f16 = " (WARNING: must use F16 due to unusual shape)" if j.target == GGMLQuantizationType.F16 else ""
        out.append(f"warning: {j.name:<36s} - ncols {j.src.shape[0]:6d} not divisible by {block:3d} "
                   f"(required for type {ggml_type_name(j.fallback_from):>7s}){must_f16} -> falling back to "
                   f"{ggml_type_name(j.target):>7s}")
    return out


def summary_lines(plan: QuantPlan, dry_run: bool) -> list[str]:
    n = max(1, plan.n_elements)
    lines = [
        f"model size  = {plan.size_in / 1024 / 1024:8.2f} MiB ({8.0 * plan.size_in / n:.2f} BPW)",
        f"quant size  = {plan.size_out / 1024 / 1024:8.2f} MiB ({8.0 * plan.size_out / n:.2f} BPW)",
    ]
    fb = plan.fallbacks
    if fb:
        lines.append(f"WARNING: {len(fb)} of {len(plan.jobs)} tensor(s) required fallback quantization "
                     f"(+{plan.fallback_cost_bits():.3f} BPW over the intended types)")
    else:
        lines.append("no tensor required fallback quantization")
    return lines


# -- pass 2: writing ---------------------------------------------------------------------------------

#: float32 elements per slab and thread: a slab is converted from the source type into a reused float32
#: buffer, quantized, checked, and its source pages released before the next. Each slab costs three
#: parallel regions, and on a busy machine a thread waiting at a region's end spins: with 1 MiB per thread
#: F16 -> Q4_0 of a 1B model took 5-17 s of CPU, with 8 MiB 2.7 s (measured 2026-12-01, load ~20 on 2 cores).
SLAB_ELEMENTS_PER_THREAD = 1 << 21



def slab_elements() -> int:
    from quantkit.jit import get_threads

    return SLAB_ELEMENTS_PER_THREAD * get_threads()


Advice = Callable[..., None]  # (tensor, start_row, stop_row): GGUFModel.release / GGUFModel.prefetch


def _no_advice(tensor, start_row=0, stop_row=None) -> None:
    pass


def convert_tensor(job: TensorJob, release: Advice = _no_advice, prefetch: Advice = _no_advice,
                   buf: np.ndarray | None = None) -> np.ndarray:
    """Source bytes -> target bytes for one tensor, a slab of rows at a time (threads as set by
    jit.set_threads), like llama-quantize's slab loop but never holding the tensor in float32.

    Each slab is decoded into ``buf`` (float32, reused across calls; grown when too small), quantized
    straight into the output, and its source pages released while the next slab is being read ahead.
    Like llama-quantize (ggml_validate_row_data), the result is refused when a block scale came out NaN
    or Inf: such a block decodes to non-finite values. Sources are finite (checked by ``scan_source``).
    """
    from quantkit.quants import count_invalid, traits

    src = job.src
    src_tr, dst_tr = traits(src.type), traits(job.target)
    n_per_row = src.shape[0]
    data = src.data
    n_rows = data.shape[0]
    out = np.empty((n_rows, dst_tr.row_bytes(n_per_row)), dtype=np.uint8)
    # rows of one expert share a row of imatrix weights: slabs never cross an expert's boundary
    n_mat = 1 if job.imatrix is None else job.imatrix.shape[0]
    per_mat = n_rows // n_mat
    slab = max(1, min(per_mat, slab_elements() // n_per_row))
    if buf is None or buf.size < slab * n_per_row:
        buf = np.empty(slab * n_per_row, dtype=np.float32)
    starts = [(e * per_mat + r, min(per_mat, r + slab) - r, e) for e in range(n_mat) for r in range(0, per_mat, slab)]
    prefetch(src, 0, starts[0][1] if starts else 0)
    bad = 0
    for k, (r0, n, e) in enumerate(starts):
        if k + 1 < len(starts):
            prefetch(src, starts[k + 1][0], starts[k + 1][0] + starts[k + 1][1])
        x = buf[:n * n_per_row].reshape(n, n_per_row)
        src_tr.dequantize_into(data[r0:r0 + n], x)
        y = out[r0:r0 + n]
        dst_tr.quantize_into(x, y, None if job.imatrix is None else job.imatrix[e])
        bad += count_invalid(y, job.target)
        release(src, r0, r0 + n)
    if bad:
        raise QuantizeError(f"{job.name}: quantized data validation failed ({job.target.name} block scale "
                            f"is NaN/Inf in {bad} block(s); values too large for the type's fp16 scales)")
    return out


def count_nonfinite(t: Tensor, release: Advice = _no_advice) -> int:
    """NaN/Inf values in a tensor (float types: read in place; others: decoded a few MiB at a time)."""
    from quantkit.quants import TRAITS, count_invalid, dequantize

    if t.type not in TRAITS or t.data is None:
        return 0
    rows = t.data
    step = max(1, (1 << 22) // max(1, t.shape[0]))
    bad = 0
    for i in range(0, rows.shape[0], step):
        if TRAITS[t.type].info.check == "values":
            bad += count_invalid(rows[i:i + step], t.type)
        else:
            vals = dequantize(rows[i:i + step], t.type)
            bad += vals.size - int(np.count_nonzero(np.isfinite(vals)))
        release(t, i, i + step)
    return bad


def scan_source(plan: QuantPlan, release: Advice = _no_advice) -> None:
    """Refuse source weights with NaN/Inf before any output is written, naming tensor and count."""
    bad = []
    for job in plan.jobs:
        n = count_nonfinite(job.src, release)
        if n:
            bad.append((job.src.name, n))
    if bad:
        more = f" (and {len(bad) - 1} more tensor(s))" if len(bad) > 1 else ""
        raise QuantizeError(f"source tensor {bad[0][0]} contains {bad[0][1]} NaN/Inf value(s){more}; "
                            f"refusing to quantize")


def plan_output(plan: QuantPlan, out_path: str | os.PathLike) -> GGUFOutput:
    """The output file of a plan, not opened yet (its ``size`` is exact)."""
    return GGUFOutput(out_path, plan.kv, [j.out_tensor for j in plan.jobs], what="the quantized model")


class _WriteBehind:
    """Writes finished tensors on a second thread while the next one is quantized (the codecs release
    the GIL), at most ``depth`` tensors waiting; a write error is raised in the caller at its next put.
    ``done(tensor)`` runs after each write (it releases the source pages of a copied tensor)."""

    def __init__(self, out: GGUFOutput, depth: int = 1):
        self.out = out
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="quantkit-writer", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            if self.error is not None:
                continue  # drain: the caller raises at its next put
            name, data, done = item
            try:
                self.out.write(name, data)
                done()
            except BaseException as e:  # noqa: BLE001 -- handed to the caller
                self.error = e

    def put(self, name: str, data: np.ndarray, done: Callable[[], None]) -> None:
        self._check()
        self.q.put((name, data, done))

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def close(self, raise_error: bool = True) -> None:
        """Wait for every queued write; raise the first write error."""
        self.q.put(None)
        self.thread.join()
        if raise_error:
            self._check()


def write_quantized(plan: QuantPlan, out_path: str | os.PathLike,
                    log: Callable[[str], None] = lambda s: None,
                    progress: Callable[..., Any] | None = None,
                    release: Advice = _no_advice, prefetch: Advice = _no_advice,
                    check: Callable[[], None] = lambda: None) -> Path:
    """Stream every tensor to ``out_path`` (via a temporary file renamed at the end). ``check`` runs
    after each tensor and before the commit: it raises when the input changed under the run.

    Reading, quantizing and writing overlap: the next slab is read ahead (``prefetch``) while one is
    quantized, and a finished tensor is written on a second thread while the next is quantized. Peak
    memory is a few output tensors and one small float32 slab per thread; source pages are released
    (``release``) as soon as they are used.
    """
    bar = progress(total=plan.size_in, unit="B", unit_scale=True, unit_divisor=1024, desc="quantize") \
        if progress else None
    # one float32 slab buffer for the whole run (a slab holds at least one row)
    buf = np.empty(slab_elements() + max([j.src.shape[0] for j in plan.jobs if j.quantize], default=0),
                   dtype=np.float32)
    try:
        with plan_output(plan, out_path) as out:
            writer = _WriteBehind(out)
            try:
                n = len(plan.jobs)
                for i, job in enumerate(plan.jobs, 1):
                    if job.imatrix_note:
                        log(f"====== {job.imatrix_note}")
                    if job.quantize:
                        data = convert_tensor(job, release, prefetch, buf)
                        check()
                        writer.put(job.name, data, lambda: None)
                        del data  # the writer holds it until written
                    else:
                        prefetch(job.src)
                        check()
                        writer.put(job.name, job.src.data, lambda src=job.src: release(src))
                    log(tensor_line(i, n, job, dry_run=False))
                    if bar is not None:
                        bar.update(job.src_bytes)
                    pause_point("quantize.tensor")
            except BaseException:
                writer.close(raise_error=False)  # the first error is the one to report
                raise
            writer.close()
            check()
            return out.commit()
    finally:
        if bar is not None:
            bar.close()


def default_output_path(inp: str | os.PathLike, ftype_name: str) -> Path:
    return Path(inp).resolve().parent / f"ggml-model-{ftype_name}.gguf"


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def save_plan_json(plan: QuantPlan, path: str | os.PathLike, extra: dict[str, Any] | None = None) -> None:
    doc = plan.to_json()
    doc.update(extra or {})
    write_bytes(path, (json.dumps(doc, indent=1) + "\n").encode(), "the plan")


def quantize_file(inp, out, opts: QuantizeOptions, *, dry_run: bool = False, plan_out=None,
                  log: Callable[[str], None] = lambda s: None, progress=None) -> tuple[QuantPlan, float]:
    """The whole job. Returns the plan and the seconds spent quantizing."""
    from quantkit.jit import set_threads

    n_threads = set_threads(opts.threads)
    if out is not None and same_file(inp, out):
        raise QuantizeError(f"input and output are the same file: {inp}")
    t0 = time.perf_counter()
    with GGUFModel(inp) as model:
        mix = None
        if opts.target_bpw is not None or opts.target_size is not None:
            from quantkit.pipelines.target_bpw import apply_target, tensor_type_file_text

            opts, mix = apply_target(model, opts, log)
            if opts.tensor_type_out:
                write_bytes(opts.tensor_type_out, tensor_type_file_text(opts.tensor_types).encode(), "the tensor types")
        plan = plan_quantization(model, opts, strict=not dry_run)
        if plan_out:
            save_plan_json(plan, plan_out, {"target": mix.to_json()} if mix else None)
        verb = "calculating quantization size for" if dry_run else "quantizing"
        dest = "" if dry_run else f" to '{out}'"
        log(f"llama_quantize: {verb} '{inp}'{dest} as {plan.ftype.name} using {n_threads} threads")
        for m in plan.type_plan.manual:
            log(f"llama_tensor_get_type: {m.name:<36s} - applying manual override: "
                f"{ggml_type_name(plan.ftype.default)} -> {ggml_type_name(m.target)}")
        for line in fallback_lines(plan):
            log(line)
        if dry_run:
            n = len(plan.jobs)
            for i, job in enumerate(plan.jobs, 1):
                log(tensor_line(i, n, job, dry_run=True))
            for problem in plan.problems:
                log(f"WARNING: the real run would fail: {problem}")
        else:
            from quantkit.formats.sigbus import install

            install()       # a truncated input: one line, not a silent SIGBUS death
            preflight(out, plan_output(plan, out).size, "the quantized model")    # before the long part
            scan_source(plan, release=model.release)
            write_quantized(plan, out, log=log, progress=progress, release=model.release,
                            prefetch=model.prefetch, check=model.check_unchanged)
        for line in summary_lines(plan, dry_run):
            log(f"llama_model_quantize_impl: {line}" if "size" in line else line)
        if mix is not None:
            from quantkit.pipelines.target_bpw import target_lines

            for line in target_lines(mix, plan.size_out, plan.n_elements):
                log(line)
    return plan, time.perf_counter() - t0
