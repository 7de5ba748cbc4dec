"""``llama-gguf-split`` as a pipeline: ``split_model`` (--split) and ``merge_model`` (--merge).

The bytes are llama-gguf-split's (tools/gguf-split/gguf-split.cpp): the same parts, keys, tensor order
and padding (formats/gguf_split.py); the log lines are its words. What differs is how they are written:
every part through the atomic writer, all renamed into place only when all are complete, and each
tensor copied from the memory map of its own input file (pages released once written), never through
a read buffer.

Splitting reads its input with ``GGUFModel``, so a split model given by its first part is split again
as the whole model (llama-gguf-split would take the first part's tensors only).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from quantkit.errors import QuantkitError
from quantkit.formats.gguf_io import SPLIT_COUNT, GGUFModel, GGUFOutput, Tensor, split_prefix
from quantkit.formats.gguf_split import PartsOutput, merged_kv, part_paths, plan_info, plan_split
from quantkit.formats.sigbus import install as install_sigbus
from quantkit.pause import pause_point

Log = Callable[[str], None]


class SplitError(QuantkitError):
    """A split or merge that cannot be carried out as asked; raised before any output is written."""


def _copy(model: GGUFModel, out, progress: Callable[..., Any] | None, desc: str) -> None:
    """Every tensor of ``out``'s plan from ``model``'s maps, in order, then the input checked unchanged."""
    total = sum(t.nbytes for t in model.tensors)
    bar = progress(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc) if progress else None
    try:
        for t in model.tensors:
            model.prefetch(t)
            out.write(t.name, t.data)
            model.release(t)
            if bar is not None:
                bar.update(t.nbytes)
            pause_point("gguf_split.tensor")
        model.check_unchanged()
    finally:
        if bar is not None:
            bar.close()


def split_model(inp: str | os.PathLike, out_prefix: str, *, max_tensors: int | None = None,
                max_bytes: int | None = None, no_tensor_first_split: bool = False, dry_run: bool = False,
                log: Log = lambda s: None, out: Log = print,
                progress: Callable[..., Any] | None = None) -> list[str]:
    """llama-gguf-split --split: the parts ``<out_prefix>-00001-of-0000N.gguf`` ...; returns their paths
    (planned ones with ``dry_run``). ``out`` takes the lines llama-gguf-split prints on stdout, ``log``
    those on stderr."""
    with GGUFModel(inp) as model:
        parts = plan_split(model.kv, model.tensors, max_tensors=max_tensors, max_bytes=max_bytes,
                           no_tensor_first_split=no_tensor_first_split)
        paths = part_paths(out_prefix, len(parts))
        for line in plan_info(parts):
            out(line)
        if not dry_run:
            if any(os.path.exists(p) and os.path.samefile(p, q) for p in paths for q in _files(model)):
                raise SplitError(f"an output part would overwrite an input file: {out_prefix}")
            install_sigbus()
            with PartsOutput(paths, parts, "the split model") as w:
                _copy(model, w, progress, "split")
                w.commit()
            for p in paths:
                out(f"Writing file {p} ... done")
        log(f"gguf_split: {len(parts)} gguf split written with a total of {len(model.tensors)} tensors.")
    return paths


def merge_model(first: str | os.PathLike, out_path: str | os.PathLike, *, dry_run: bool = False,
                log: Log = lambda s: None, progress: Callable[..., Any] | None = None,
                delete_parts: bool = False) -> Path:
    """llama-gguf-split --merge: the parts named from ``first`` (the first part) into one file.
    ``delete_parts``: remove the parts once the merged file is in place."""
    first, out_path = Path(first), Path(out_path)
    log(f"gguf_merge: {first} -> {out_path}")
    if out_path.exists():        # as llama-gguf-split: never overwrite
        raise SplitError(f"{out_path}: the output file already exists")
    head = GGUFModel(first, whole=False)
    try:
        n = head.metadata.get(SPLIT_COUNT)
        if n is None:
            raise SplitError(f"{first}: not a split model (no {SPLIT_COUNT} key)")
        if int(n) < 1:
            raise SplitError(f"{first}: {SPLIT_COUNT} is {n}, not a valid split count (a merged file?)")
        if split_prefix(first, 0, int(n)) is None:
            raise SplitError(f"{first}: unexpected file name for the first of {n} parts "
                             f"(expected PREFIX-00001-of-{int(n):05d}.gguf)")
    finally:
        head.close()
    with GGUFModel(first) as model:
        for part in model.parts:
            log(f"gguf_merge: reading metadata {part.path} done")
        kv = merged_kv(model.kv)
        plan = [Tensor(t.name, t.shape, t.type) for t in model.tensors]
        if not dry_run:
            install_sigbus()
            with GGUFOutput(out_path, kv, plan, what="the merged model") as w:
                _copy(model, w, progress, "merge")
                w.commit()
        parts = _files(model)
        log(f"gguf_merge: {out_path} merged from {len(parts)} split with {len(model.tensors)} tensors.")
    if delete_parts and not dry_run:
        for p in parts:
            p.unlink()
            log(f"gguf_merge: deleted file {p}")
    return out_path


def _files(model: GGUFModel) -> list[Path]:
    return [p.path for p in model.parts]
