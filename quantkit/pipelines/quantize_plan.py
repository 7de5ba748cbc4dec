"""Pass 1 of ``llama-quantize`` (``plan_quantization``): every tensor's type from ``quantkit.policy``, the
output's metadata, and every reason to refuse (requantizing without permission, a missing or mis-sized
imatrix, a fallback under ``--no-fallback``), all before any byte is written. Pass 2, the writer, is
``quantize.py``."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from quantkit.errors import FormatError, PolicyError, QuantkitError
from quantkit.formats.gguf_io import KV, SPLIT_KEYS, GGUFModel, Tensor, remove_kv
from quantkit.formats.gguf_split import Part, plan_split, split_keys
from quantkit.formats.imatrix import Imatrix, load_imatrix
from quantkit.policy import TypePlan, plan_types
from quantkit.typenames import FileType, ggml_type_name, parse_ftype

GGML_QNT_VERSION = 2
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
    #: one output part per input part (llama-quantize --keep-split)
    keep_split: bool = False
    #: split the output as llama-gguf-split --split-max-tensors / --split-max-size would split it
    split_max_tensors: int | None = None
    split_max_bytes: int | None = None
    #: --optimize (pipelines/optimize.py): error compensation with Gram matrices measured on calibration
    #: text (a file, or None for the built-in calibration half), ``optimize_chunks`` x ``optimize_ctx``
    optimize: bool = False
    optimize_text: str | os.PathLike | None = None
    optimize_chunks: int = 20
    optimize_ctx: int = 512
    #: a directory to keep each layer's Gram matrices in, read back where saved (formats/gram.py)
    optimize_stats: str | os.PathLike | None = None


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
    part: int = 0  # the output part (--keep-split: the input part it comes from)

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
    #: --keep-split: one output file per input part, even when there is one part
    keep_split: bool = False
    #: --split-max-tensors / --split-max-size (quantkit's): the output split as llama-gguf-split splits
    split_limits: tuple[int | None, int | None] | None = None

    @property
    def in_parts(self) -> bool:
        """The output is named as parts (``<prefix>-00001-of-0000N.gguf``)."""
        return self.keep_split or self.split_limits is not None

    def output_parts(self) -> list[Part]:
        """The output files' keys and tensors: one file; with --keep-split one per input part, as
        llama_model_quantize_impl fills its ``ctx_outs`` (split keys only when there are several); with
        split limits, llama-gguf-split's parts of the one file."""
        if self.split_limits is not None:
            max_tensors, max_bytes = self.split_limits
            return plan_split(self.kv, [j.out_tensor for j in self.jobs], max_tensors=max_tensors,
                              max_bytes=max_bytes)
        n = max((j.part for j in self.jobs), default=0) + 1
        groups: list[list[Tensor]] = [[] for _ in range(n)]
        for j in self.jobs:
            groups[j.part].append(j.out_tensor)
        if n == 1:
            return [Part(list(self.kv), groups[0])]
        return [Part((list(self.kv) if i == 0 else []) + split_keys(i, n, len(self.jobs), count_last=False), g)
                for i, g in enumerate(groups)]

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
    if opts.keep_split:  # llama.cpp sorts by (part, offset): the type rules' counters see this order
        kept.sort(key=model.location)

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
            in_given_order=opts.keep_split,
        )
    except PolicyError as e:  # metadata the rules read is wrong: name the file
        if str(model.path) in str(e):
            raise
        raise type(e)(f"{model.path}: {e}") from None
    back = {rename[n]: n for n in kept}
    part = model.part_of if opts.keep_split else {}
    return _finish_plan(model, opts, ftype, imatrix, tp, back, by_name, n_block, strict, part)


def _finish_plan(model, opts, ftype, imatrix, tp, back, by_name, n_block, strict, part) -> QuantPlan:
    """The per-tensor jobs of a type plan, and every reason the real run would be refused."""
    from quantkit.quants import TRAITS

    jobs: list[TensorJob] = []
    problems: list[str] = []
    requant: list[Tensor] = []
    for p in tp.tensors:
        src = by_name[back[p.name]]
        quantize = p.quantizable and p.target != src.type
        job = TensorJob(src, p.name, p.target if quantize else src.type, quantize, p.fallback_from, p.manual,
                        part=part.get(src.name, 0))
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

    limits = None
    if opts.split_max_tensors is not None or opts.split_max_bytes is not None:
        if opts.keep_split:
            raise QuantizeError("--keep-split cannot be combined with --split-max-tensors / --split-max-size")
        limits = (opts.split_max_tensors, opts.split_max_bytes)
    plan = QuantPlan(Path(model.path), ftype, jobs, output_kv(model, ftype, opts, imatrix, n_block), tp, imatrix,
                     problems, keep_split=opts.keep_split, split_limits=limits)
    if limits is not None:
        try:
            plan.output_parts()
        except FormatError as e:
            problems.append(str(e))
    empty = sorted(set(range(len(model.parts))) - {j.part for j in jobs}) if opts.keep_split else []
    if empty and len(model.parts) > 1:
        problems.append(f"--keep-split: no tensor of input part {empty[0] + 1} is left (--prune-layers removed "
                        f"them all), so that part has no output file")
    if opts.no_fallback and plan.fallbacks:
        names = ", ".join(f"{j.name} ({j.fallback_from.name}->{j.target.name}, ncols {j.src.shape[0]})"
                          for j in plan.fallbacks[:4])
        more = f" and {len(plan.fallbacks) - 4} more" if len(plan.fallbacks) > 4 else ""
        problems.append(f"--no-fallback: {len(plan.fallbacks)} tensor(s) would fall back: {names}{more}")
    if problems and strict:
        extra = f" (and {len(problems) - 1} more problem(s))" if len(problems) > 1 else ""
        raise QuantizeError(problems[0] + extra)
    return plan
