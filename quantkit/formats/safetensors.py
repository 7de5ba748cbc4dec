"""Hugging Face checkpoints: safetensors shards, their index, config.json.

``Checkpoint(folder)`` reads what a converter needs before its first output byte: config.json, the
weight map of ``model.safetensors.index.json`` (or the single ``model.safetensors`` / the ``model*
.safetensors`` files, as llama.cpp's ``ModelBase.index_tensors`` finds them), and every shard's header,
each value checked against the file it describes (header length and JSON, dtype, shape, data offsets
inside the file and matching the dtype and shape, no overlaps). A missing shard, a tensor the index
names but no shard holds (or the reverse) or a header that lies is one ``FormatError`` line naming the
file and tensor.

Tensors are then read one at a time, or a range of rows at a time (``Checkpoint.rows``), through the
``safetensors`` package's numpy API (``safe_open(path, "np")``; ``ml_dtypes`` is imported first so
BF16 tensors come back as ``bfloat16`` arrays), so a conversion never holds more than the tensor or
rows it is writing.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantkit.errors import FormatError

#: safetensors dtype -> bytes per element (the float types a converter reads, and the integer ones
#: a header may hold)
DTYPE_SIZES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
#: the safetensors library refuses headers larger than this (100 MB)
MAX_HEADER = 100_000_000
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorEntry:
    name: str
    file: Path
    dtype: str                  # safetensors' name: BF16, F16, F32, ...
    shape: tuple[int, ...]      # PyTorch order (rows first)
    start: int                  # byte offset of the data in the file
    nbytes: int


def read_header(path: Path) -> list[TensorEntry]:
    """The tensors of one safetensors file, each checked against the file's size; in name order (the
    order the safetensors library lists them, and llama.cpp's converter walks them)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise FormatError(f"{path}: not a safetensors file ({size} bytes, shorter than its header length)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                raise FormatError(f"{path}: safetensors header length {n} does not fit the file ({size} bytes)")
            raw = f.read(n)
    except OSError as e:
        raise FormatError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{path}: the safetensors header is not JSON ({e})") from None
    if not isinstance(meta, dict):
        raise FormatError(f"{path}: the safetensors header is not a JSON object")
    data_start, data_len = 8 + n, size - 8 - n
    out, spans = [], []
    for name, info in meta.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name!r}"
        if not isinstance(info, dict):
            raise FormatError(f"{where}: header entry is not an object")
        dtype, shape, offs = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in DTYPE_SIZES:
            raise FormatError(f"{where}: unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise FormatError(f"{where}: bad shape {shape!r}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)):
            raise FormatError(f"{where}: bad data_offsets {offs!r}")
        begin, end = offs
        want = int(np.prod(shape, dtype=np.int64)) * DTYPE_SIZES[dtype]
        if not 0 <= begin <= end <= data_len:
            raise FormatError(f"{where}: data_offsets [{begin}, {end}] outside the file's {data_len} data bytes")
        if end - begin != want:
            raise FormatError(f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes, but {dtype} "
                              f"{shape} needs {want}")
        spans.append((begin, end, name))
        out.append(TensorEntry(name, path, dtype, tuple(shape), data_start + begin, want))
    spans.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(spans, spans[1:]):
        if b1 < e0:
            raise FormatError(f"{path}: tensors {n0!r} and {n1!r} overlap in the file")
    return sorted(out, key=lambda t: t.name)


def part_names(folder: Path) -> list[str]:
    """``model*.safetensors`` in the folder, sorted (llama.cpp's ``get_model_part_names``)."""
    return sorted(f for f in os.listdir(folder) if f.startswith("model") and f.endswith(".safetensors"))


def read_json(path: Path, what: str) -> Any:
    """The JSON file at ``path`` (``what`` it is, for the one-line error when it cannot be read)."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise FormatError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FormatError(f"{path}: {what} is not valid JSON ({e})") from None


class Checkpoint:
    """A Hugging Face model folder: ``config`` (config.json as written), ``tensors`` (name -> entry, in
    the order the shards list them: shards sorted by name, each shard's tensors by name)."""

    def __init__(self, folder: str | os.PathLike):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise FormatError(f"{self.folder}: not a directory (expected a Hugging Face model folder)")
        cfg = self.folder / "config.json"
        if not cfg.is_file():
            raise FormatError(f"{cfg}: missing (a Hugging Face model folder has a config.json)")
        self.config: dict = read_json(cfg, "config.json")
        if not isinstance(self.config, dict):
            raise FormatError(f"{cfg}: config.json is not a JSON object")
        self.tensors: dict[str, TensorEntry] = {}
        index = self.folder / INDEX
        parts = part_names(self.folder)
        weight_map: dict[str, str] = {}
        if index.is_file():
            idx = read_json(index, "the weight index")
            weight_map = idx.get("weight_map") if isinstance(idx, dict) else None
            if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
                raise FormatError(f"{index}: no 'weight_map' object of tensor -> file names")
            parts = sorted(set(weight_map.values()))
        if not parts:
            raise FormatError(f"{self.folder}: no model*.safetensors files (PyTorch .bin checkpoints are not read)")
        for part in parts:
            path = self.folder / part
            if Path(part).name != part or not path.is_file():
                raise FormatError(f"{path}: missing shard" + (f" (named by {INDEX})" if weight_map else ""))
            for t in read_header(path):
                if t.name in self.tensors:
                    raise FormatError(f"{path}: tensor {t.name!r} is also in {self.tensors[t.name].file.name}")
                self.tensors[t.name] = t
        if weight_map:
            for name, part in weight_map.items():
                if name not in self.tensors:
                    raise FormatError(f"{self.folder / part}: tensor {name!r} named by {INDEX} is not in it")
                if self.tensors[name].file.name != part:
                    raise FormatError(f"{index}: tensor {name!r} is mapped to {part} but is in "
                                      f"{self.tensors[name].file.name}")
            extra = [n for n in self.tensors if n not in weight_map]
            if extra:
                raise FormatError(f"{self.tensors[extra[0]].file}: tensor {extra[0]!r} is not in {INDEX}")

    def json(self, name: str) -> Any | None:
        """Another JSON file of the folder (tokenizer_config.json, generation_config.json), or None."""
        path = self.folder / name
        return read_json(path, name) if path.is_file() else None

    # -- reading ----------------------------------------------------------------------------------
    def rows(self, name: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``start:stop`` (first axis) of tensor ``name``, in its own dtype (bfloat16 as
        ml_dtypes.bfloat16); the whole tensor by default. The file is opened for each read: the
        library maps it, and pages of a mapping count in the process's resident size until it is
        closed, so a kept handle would grow to the whole checkpoint."""
        import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, for safetensors' numpy API)
        from safetensors import safe_open

        t = self.tensors[name]
        try:
            with safe_open(str(t.file), framework="np") as f:
                sl = f.get_slice(name)
                return np.array(sl[start:stop] if t.shape else sl[:])
        except Exception as e:  # the library's SafetensorError, or an OSError
            raise FormatError(f"{t.file}: tensor {name!r}: cannot read ({e})") from None

    def close(self) -> None:
        """Nothing stays open between reads (kept for ``with``)."""

    def __enter__(self) -> "Checkpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
