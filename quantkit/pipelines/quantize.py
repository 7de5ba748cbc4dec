"""``llama-quantize`` as a pipeline: plan every tensor first, then stream them through the codecs.

Pass 1 (``plan_quantization``) decides each tensor's type with ``quantkit.policy`` and checks every
reason to refuse (requantizing without permission, a missing or mis-sized imatrix, a fallback under
``--no-fallback``) before any byte is written. Pass 2 (``write_quantized``) streams each tensor a slab
of rows at a time: decoded into a small reused float32 buffer, quantized on N threads, checked like
ggml_validate_row_data, its source pages released; a finished tensor is written on a second thread
while the next is quantized, to a temporary file renamed into place only when complete. Peak memory is
a few output tensors, not a float32 copy of any tensor.

Pass 1 is ``quantize_plan.py`` (its names import from here too); this module is the log lines in
llama-quantize's words and pass 2.

The output matches llama-quantize's: the same metadata (input keys in order, then
``general.quantization_version`` and ``general.file_type`` moved to the end as gguf's set does, split
keys removed, ``--override-kv`` and imatrix keys after), tensors in llama.cpp's order (by layer, then
name), 32-byte alignment, and the codecs' bytes.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from quantkit.formats.atomic import preflight, write_bytes
from quantkit.formats.gguf_io import GGUFModel, GGUFOutput, Tensor
from quantkit.formats.gguf_split import PartsOutput, part_paths
from quantkit.pause import pause_point
from quantkit.quants import ahead
from quantkit.pipelines.quantize_plan import (QuantizeError, QuantizeOptions, QuantPlan, TensorJob,  # noqa: F401
                                              output_kv, parse_override_kv, plan_quantization, prune_names)
from quantkit.typenames import ggml_type_name

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


def output_paths(plan: QuantPlan, out_path: str | os.PathLike) -> list[str]:
    """The files a plan writes: ``out_path``, or in parts (--keep-split, --split-max-*)
    ``<out_path without .gguf>-00001-of-0000N.gguf`` and so on (llama-quantize strips the suffix and names
    each part with llama_split_path)."""
    if not plan.in_parts:
        return [os.fspath(out_path)]
    prefix = os.fspath(out_path)
    if prefix.endswith(".gguf"):
        prefix = prefix[:-len(".gguf")]
    return part_paths(prefix, len(plan.output_parts()))


def plan_output(plan: QuantPlan, out_path: str | os.PathLike) -> GGUFOutput | PartsOutput:
    """The output file (or files, in parts) of a plan, not opened yet (its ``size`` is exact)."""
    if not plan.in_parts:
        return GGUFOutput(out_path, plan.kv, [j.out_tensor for j in plan.jobs], what="the quantized model")
    return PartsOutput(output_paths(plan, out_path), plan.output_parts(), what="the quantized model")


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
                    check: Callable[[], None] = lambda: None, calib=None) -> Path | list[Path]:
    """Stream every tensor to ``out_path`` (via a temporary file renamed at the end; with --keep-split
    to its parts, all renamed at the end). ``check`` runs
    after each tensor and before the commit: it raises when the input changed under the run.
    ``calib`` (``pipelines.optimize.Calibration``, --optimize): the tensors it has statistics for are
    quantized with error compensation (``optimize_job``) instead, each tensor's a bar of its own.

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
                    note = ""
                    if job.quantize:
                        data, note = (None, "") if calib is None else optimize_job(job, calib, progress)
                        if data is None:
                            data = convert_tensor(job, release, prefetch, buf)
                        else:
                            release(job.src)
                        check()
                        writer.put(job.name, data, lambda: None)
                        del data  # the writer holds it until written
                    else:
                        prefetch(job.src)
                        check()
                        writer.put(job.name, job.src.data, lambda src=job.src: release(src))
                    log(tensor_line(i, n, job, dry_run=False) + note)
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


def optimize_job(job: TensorJob, calib, progress=None) -> tuple[np.ndarray | None, str]:
    """--optimize: ``job``'s bytes with error compensation (``pipelines.optimize``), checked as
    ``convert_tensor`` checks its own, and a note for its log line; None for a tensor it does not cover."""
    from quantkit.pipelines.optimize import optimized_tensor
    from quantkit.quants import count_invalid, dequantize

    bar = progress(total=1, desc=job.name) if progress else None
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        got = optimized_tensor(job, calib, dequantize(job.src.data, job.src.type))
    finally:
        if bar is not None:
            bar.update(1)
            bar.close()
    if got is None:
        return None, ""
    data, share = got
    if count_invalid(data, job.target):
        raise QuantizeError(f"{job.name}: quantized data validation failed ({job.target.name} block scale is "
                            f"NaN/Inf; values too large for the type's fp16 scales)")
    return data, (f", optimized: {100 * share:.1f} % of rows compensated "
                  f"({time.perf_counter() - t0:.1f} s, {time.process_time() - c0:.1f} s CPU)")


def default_output_path(inp: str | os.PathLike, ftype_name: str) -> Path:
    return Path(inp).resolve().parent / f"ggml-model-{ftype_name}.gguf"


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _refuse_overwriting_input(model: GGUFModel, outputs: list) -> None:
    for o in outputs:
        for part in model.parts:
            if same_file(part.path, o):
                raise QuantizeError(f"input and output are the same file: {part.path}")


def save_plan_json(plan: QuantPlan, path: str | os.PathLike, extra: dict[str, Any] | None = None) -> None:
    doc = plan.to_json()
    doc.update(extra or {})
    write_bytes(path, (json.dumps(doc, indent=1) + "\n").encode(), "the plan")


def quantize_file(inp, out, opts: QuantizeOptions, *, dry_run: bool = False, plan_out=None,
                  log: Callable[[str], None] = lambda s: None, progress=None) -> tuple[QuantPlan, float]:
    """The whole job. Returns the plan and the seconds spent quantizing."""
    from quantkit.jit import set_threads

    n_threads = set_threads(opts.threads)
    t0 = time.perf_counter()
    with GGUFModel(inp) as model:
        if out is not None and not opts.keep_split and opts.split_max_tensors is None \
                and opts.split_max_bytes is None:       # before any long work (a --target-bpw search)
            _refuse_overwriting_input(model, [out])
        mix = None
        if opts.target_bpw is not None or opts.target_size is not None:
            from quantkit.pipelines.target_bpw import apply_target, tensor_type_file_text

            opts, mix = apply_target(model, opts, log)
            if opts.tensor_type_out:
                write_bytes(opts.tensor_type_out, tensor_type_file_text(opts.tensor_types).encode(), "the tensor types")
        plan = plan_quantization(model, opts, strict=not dry_run)
        if out is not None:
            _refuse_overwriting_input(model, output_paths(plan, out))
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
            planned = plan_output(plan, out)
            if isinstance(planned, PartsOutput):
                planned.preflight()                                                # before the long part
            else:
                preflight(out, planned.size, "the quantized model")
            helper = ahead.start([j.target for j in plan.jobs if j.quantize])  # a first run's compiles
            try:
                scan_source(plan, release=model.release)
                calib = None
                if opts.optimize:
                    from quantkit.pipelines.optimize import Calibration

                    calib = Calibration(inp, opts.optimize_text, opts.optimize_chunks, opts.optimize_ctx, log,
                                        stats=opts.optimize_stats)
                try:
                    write_quantized(plan, out, log=log, progress=progress, release=model.release,
                                    prefetch=model.prefetch, check=model.check_unchanged, calib=calib)
                finally:
                    if calib is not None:
                        calib.close()
            finally:
                ahead.stop(helper)
        for line in summary_lines(plan, dry_run):
            log(f"llama_model_quantize_impl: {line}" if "size" in line else line)
        if mix is not None:
            from quantkit.pipelines.target_bpw import target_lines

            for line in target_lines(mix, plan.size_out, plan.n_elements):
                log(line)
    return plan, time.perf_counter() - t0
