"""Split GGUF out: planning the parts and writing them all or none.

Reading a split model is ``GGUFModel``'s (gguf_io.py). This module is the writing side, as llama.cpp
does it in two places:

* ``plan_split`` -- llama-gguf-split's ``split_strategy`` (tools/gguf-split/gguf-split.cpp): tensors in
  input order, a new part every ``max_tensors`` tensors or before the tensor that would take the part's
  tensor data (each tensor padded to 32 bytes) over ``max_bytes``; every key in the first part, each
  part ending with ``split.no``, ``split.tensors.count``, ``split.count`` in that order (gguf's set
  removes a key and appends it, and the count is set last).
* ``keep_split_keys`` -- llama-quantize --keep-split (src/llama-quant.cpp): the same three keys, in the
  order ``split.no``, ``split.count``, ``split.tensors.count``, and only when there are several parts.

``PartsOutput`` writes the parts through ``GGUFOutput`` (one ``AtomicWriter`` each): every part goes to
a temporary file, and the parts are renamed into place only once all of them are complete; a failure
before that leaves none of them, and a failure while renaming removes the parts already renamed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
from gguf import GGUF_DEFAULT_ALIGNMENT, GGUFValueType

from quantkit.errors import FormatError
from quantkit.formats.atomic import preflight
from quantkit.formats.gguf_io import (KV, SPLIT_COUNT, SPLIT_KEYS, SPLIT_NO, SPLIT_TENSORS_COUNT, GGUFOutput,
                                      Tensor, remove_kv, split_path)

#: llama-gguf-split's default --split-max-tensors
DEFAULT_MAX_TENSORS = 128


@dataclass
class Part:
    """One output file: its key/value records and its tensors (planned: ``data`` None)."""

    kv: list[KV]
    tensors: list[Tensor]

    def output(self, path: str | os.PathLike, what: str) -> GGUFOutput:
        return GGUFOutput(path, self.kv, self.tensors, what=what)


def _pad(n: int, align: int = GGUF_DEFAULT_ALIGNMENT) -> int:
    return (n + align - 1) // align * align


def parse_split_size(text: str) -> int:
    """``--split-max-size N(M|G)``: N megabytes (10^6 bytes) or gigabytes (10^9), N a positive integer
    (split_str_to_n_bytes in gguf-split.cpp)."""
    text = text.strip()
    unit = text[-1:]
    scale = {"M": 1000 ** 2, "G": 1000 ** 3}.get(unit)
    if scale is None:
        raise FormatError(f"--split-max-size {text!r}: supported units are M (megabytes) or G (gigabytes), "
                          f"e.g. 500M or 2G")
    try:
        n = int(text[:-1])
    except ValueError:
        raise FormatError(f"--split-max-size {text!r}: expected a positive integer before {unit}") from None
    if n <= 0:
        raise FormatError(f"--split-max-size {text!r}: the size must be a positive value")
    return n * scale


def plan_split(kv: Sequence[KV], tensors: Sequence[Tensor], *, max_tensors: int | None = None,
               max_bytes: int | None = None, no_tensor_first_split: bool = False) -> list[Part]:
    """The parts llama-gguf-split --split writes for a file of ``kv`` and ``tensors`` (in file order).

    ``max_bytes`` splits by size, otherwise by tensor count (``max_tensors``, default 128). A part left
    without tensors (a size limit below one tensor) is refused, as llama-gguf-split refuses it; only the
    first part may be empty, with ``no_tensor_first_split``.
    """
    if max_bytes is not None and max_tensors is not None:
        raise FormatError("either --split-max-tensors or --split-max-size can be given, but not both")
    per_part = DEFAULT_MAX_TENSORS if max_tensors is None else int(max_tensors)
    if max_bytes is None and per_part < 1:
        raise FormatError(f"--split-max-tensors must be at least 1, got {per_part}")
    n = len(tensors)
    groups: list[list[Tensor]] = [[]]
    if no_tensor_first_split:
        groups.append([])
    cur = 0                  # the current part's tensor data, each tensor padded to the alignment
    for i, t in enumerate(tensors):
        size = _pad(t.nbytes)
        if max_bytes is not None:
            new = cur + size > max_bytes
        else:
            new = 0 < i < n and i % per_part == 0
        if new:
            if not groups[-1]:
                raise FormatError(f"a part would hold no tensors: tensor {t.name!r} alone takes {size} bytes, "
                                  f"over the limit of {max_bytes} (raise --split-max-size)")
            groups.append([])
            cur = size
        else:
            cur += size
        groups[-1].append(Tensor(t.name, t.shape, t.type))
    count = len(groups)
    first = remove_kv(list(kv), *SPLIT_KEYS)
    return [Part((first if i == 0 else []) + split_keys(i, count, n, count_last=True), g)
            for i, g in enumerate(groups)]


def split_keys(no: int, count: int, n_tensors: int, count_last: bool) -> list[KV]:
    """The three split keys of part ``no``: llama-gguf-split's order (``count_last``: no, tensors.count,
    count) or llama-quantize --keep-split's (no, count, tensors.count)."""
    keys = [KV(SPLIT_NO, no, GGUFValueType.UINT16), KV(SPLIT_COUNT, count, GGUFValueType.UINT16),
            KV(SPLIT_TENSORS_COUNT, n_tensors, GGUFValueType.INT32)]
    return [keys[0], keys[2], keys[1]] if count_last else keys


def merged_kv(first_part_kv: Sequence[KV]) -> list[KV]:
    """The keys of llama-gguf-split --merge's output: the first part's, with ``split.count`` moved to the
    end and set to 0 ("do not trigger merge if we try to merge again the output")."""
    return remove_kv(list(first_part_kv), SPLIT_COUNT) + [KV(SPLIT_COUNT, 0, GGUFValueType.UINT16)]


def plan_info(parts: Sequence[Part]) -> list[str]:
    """llama-gguf-split's ``print_info`` lines: each part's header plus unpadded tensor bytes, in whole
    megabytes (10^6)."""
    lines = [f"n_split: {len(parts)}"]
    for i, p in enumerate(parts):
        meta = _pad(len(p.output(os.devnull, "").header))
        total = (meta + sum(t.nbytes for t in p.tensors)) // 1000 // 1000
        lines.append(f"split {i + 1:05d}: n_tensors = {len(p.tensors)}, total_size = {total}M")
    return lines


class PartsOutput:
    """Several GGUFs written as one: ``write(name, data)`` in the parts' tensor order, ``commit()``
    renames every part into place once all are complete. Used as a context manager, an exception leaves
    no part behind."""

    def __init__(self, paths: Sequence[str | os.PathLike], parts: Sequence[Part], what: str = "the output"):
        if len(paths) != len(parts):
            raise FormatError(f"{len(paths)} paths for {len(parts)} parts")
        self.outs = [p.output(path, f"{what} (part {i + 1} of {len(parts)})")
                     for i, (path, p) in enumerate(zip(paths, parts))]
        self.paths = [Path(p) for p in paths]
        self.size = sum(o.size for o in self.outs)
        self._where = {t.name: i for i, p in enumerate(parts) for t in p.tensors}
        self.committed = False
        self._what = what

    def preflight(self) -> None:
        """Refuse before the first byte when the parts do not fit, all together, where they go."""
        by_dir: dict[Path, int] = {}
        for o in self.outs:
            by_dir[o.path.resolve().parent] = by_dir.get(o.path.resolve().parent, 0) + o.size
        for o in self.outs:
            preflight(o.path, by_dir[o.path.resolve().parent], self._what)

    def open(self) -> "PartsOutput":
        self.preflight()
        try:
            for o in self.outs:
                o.open()
        except BaseException:
            self.abort()
            raise
        return self

    def write(self, name: str, data: np.ndarray) -> None:
        i = self._where.get(name)
        if i is None:
            raise FormatError(f"tensor {name!r} is in no part of the output")
        self.outs[i].write(name, data)

    def commit(self) -> list[Path]:
        done: list[GGUFOutput] = []
        try:
            for o in self.outs:
                if not o.complete:
                    raise FormatError(f"{o.path}: the part is incomplete (not every tensor was written)")
            for o in self.outs:
                o.commit()
                done.append(o)
        except BaseException:
            for o in done:          # all or nothing: the parts already in place go too
                try:
                    o.path.unlink()
                except OSError:
                    pass
            self.abort()
            raise
        self.committed = True
        return self.paths

    def abort(self) -> None:
        for o in self.outs:
            if not o.committed:
                o.abort()

    def __enter__(self) -> "PartsOutput":
        return self.open()

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            self.abort()


def part_paths(prefix: str | os.PathLike, count: int) -> list[str]:
    """The files of a split output: llama_split_path of each part."""
    return [split_path(prefix, i, count) for i in range(count)]
