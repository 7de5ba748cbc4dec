"""GGUF reading and writing over the ``gguf`` package (no parser of our own).

* ``GGUFModel(path)`` opens a file memory-mapped: ``metadata`` holds plain Python values, ``kv`` the
  typed key/value records needed to copy them exactly, ``tensors`` the tensors in file order, each with
  its GGUF shape (ne0 first), its ggml type and a zero-copy ``data`` view (uint8 bytes, one row of
  ``row_bytes`` per ne1*ne2*ne3 row).
  Given the first part of a split model (``split.count`` > 1, parts named as ``llama_split_path``
  names them: ``<prefix>-00001-of-00004.gguf``), it opens every part the way llama.cpp's model loader
  does (src/llama-model-loader.cpp): the metadata is the first part's, ``tensors`` are the parts'
  tensors in part order, each mapped from its own part's file; a missing part, a part with the wrong
  ``split.no`` or ``split.count``, a duplicated tensor or a total that disagrees with
  ``split.tensors.count`` is one error line.
* ``GGUFOutput(path, kv, tensors)`` writes a new GGUF streaming one tensor at a time through
  ``quantkit.formats.atomic.AtomicWriter``; ``commit()`` renames it into place only when every byte is
  written. Used as a context manager, an exception (or Ctrl-C) removes the temporary file and leaves
  ``path`` untouched. Its exact size is known before the first byte (``size``).
"""

from __future__ import annotations

import io
import mmap
import os
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
from gguf import (GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFValueType,
                  GGUFWriter)
from gguf.gguf_writer import WriterState

from quantkit.errors import FormatError
from quantkit.formats.atomic import AtomicWriter
from quantkit.pause import pause_point

GGUF_MAGIC = b"GGUF"

#: the split keys (llama.cpp's LLM_KV_SPLIT_NO / _COUNT / _TENSORS_COUNT)
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT = "split.no", "split.count", "split.tensors.count"
SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT)


def split_path(prefix: str | os.PathLike, split_no: int, split_count: int) -> str:
    """The file of part ``split_no`` (0-based) of ``split_count``: llama_split_path in src/llama.cpp."""
    return f"{os.fspath(prefix)}-{split_no + 1:05d}-of-{split_count:05d}.gguf"


def split_prefix(path: str | os.PathLike, split_no: int, split_count: int) -> str | None:
    """The prefix ``path`` was named from as part ``split_no`` of ``split_count``, or None when its name
    does not end the way split_path ends it (llama_split_prefix)."""
    path = os.fspath(path)
    tail = f"-{split_no + 1:05d}-of-{split_count:05d}.gguf"
    if len(path) <= len(tail) or not path.endswith(tail):
        return None
    return path[:-len(tail)]


@dataclass(frozen=True)
class KV:
    """One metadata record: key, plain value, value type and (for arrays) element type."""

    key: str
    value: Any
    vtype: GGUFValueType
    sub_type: GGUFValueType | None = None


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # GGUF order: ne0 (row length) first
    type: GGMLQuantizationType
    data: np.ndarray | None = None  # uint8, shape (n_rows, row_bytes); None for a planned tensor

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def n_per_row(self) -> int:
        return int(self.shape[0])

    @property
    def n_rows(self) -> int:
        return self.n_elements // max(1, self.n_per_row)

    @property
    def row_bytes(self) -> int:
        return tensor_nbytes((self.shape[0],), self.type)

    @property
    def nbytes(self) -> int:
        return tensor_nbytes(self.shape, self.type)


def tensor_nbytes(shape: Sequence[int], qtype: GGMLQuantizationType) -> int:
    block, size = GGML_QUANT_SIZES[qtype]
    n = int(np.prod([int(d) for d in shape], dtype=np.int64))
    if int(shape[0]) % block:
        raise FormatError(f"{qtype.name}: row length {shape[0]} is not a multiple of the block size {block}")
    return n // block * size


class _Reader(GGUFReader):
    """gguf's reader, slicing a plain ndarray view of its memory map.

    Each slice of an ``np.memmap`` runs memmap's Python-level bookkeeping; a GGUF with a 49k-token
    vocabulary takes ~250k slices, so parsing spent most of its time there. Viewing the same mapping
    as a plain ndarray keeps every array zero-copy and makes opening such a file several times faster.
    The byte-fetching helper is replaced (bounds-checked), and arrays get a fast path that builds the
    very parts gguf would (tests/test_gguf_io.py compares them with stock GGUFReader's); the rest of
    the parsing stays gguf's.
    """

    _plain: np.ndarray | None = None
    _native = "<" if sys.byteorder == "little" else ">"

    def _get(self, offset, dtype, count=1, override_order=None):
        plain = self._plain_view()
        dt = _DTYPES.get(dtype)
        if dt is None:
            dt = np.dtype(dtype)
        n = dt.itemsize * int(count)
        if offset < 0 or count < 0 or offset + n > plain.size:
            # A count or length from the file that runs past its end: stop here, before any loop over it
            raise FormatError(f"a read of {n} bytes at offset {offset} runs past the end of the file "
                              f"({plain.size} bytes): truncated or corrupt")
        arr = plain[offset:offset + n].view(dt)
        order = self.byte_order if override_order is None else override_order
        if order == "I" or order == self._native:
            return arr
        return arr.view(arr.dtype.newbyteorder(order))

    def _get_field_parts(self, orig_offs, raw_type):
        """gguf's method with a fast path for arrays: the same parts, indices and types it builds (one
        1-element array per scalar item, a length and a bytes array per string item), made without
        gguf's per-item recursion -- a vocabulary is ~200k items. Anything else goes to gguf."""
        if raw_type != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        itype, n = int(raw_itype[0]), int(alen[0])
        nptype = self.gguf_scalar_to_np.get(itype) if itype in _VALUE_TYPES else None
        if n == 0 or (nptype is None and itype != GGUFValueType.STRING):
            return super()._get_field_parts(orig_offs, raw_type)
        offs = orig_offs + 12
        parts: list = [raw_itype, alen]
        if nptype is not None:
            values = self._get(offs, nptype, n)
            parts += list(values.reshape(n, 1))
            size = 12 + int(values.nbytes)
        else:
            plain = self._plain_view()
            end = plain.size
            u64 = np.dtype(np.uint64)
            if self.byte_order not in ("I", self._native):   # a file of the other byte order
                u64 = u64.newbyteorder("S")
            fmt = "=Q" if u64.isnative else ("<Q" if self._native == ">" else ">Q")
            raw = memoryview(plain)
            unpack = struct.unpack_from
            for _ in range(n):
                if offs + 8 > end:
                    raise FormatError(f"a read of 8 bytes at offset {offs} runs past the end of the file "
                                      f"({end} bytes): truncated or corrupt")
                (slen,) = unpack(fmt, raw, offs)
                if offs + 8 + slen > end:
                    raise FormatError(f"a read of {slen} bytes at offset {offs + 8} runs past the end of the "
                                      f"file ({end} bytes): truncated or corrupt")
                parts.append(plain[offs:offs + 8].view(u64))
                parts.append(plain[offs + 8:offs + 8 + slen])
                offs += 8 + slen
            size = offs - orig_offs
        first = 3 if nptype is None else 2
        step = 2 if nptype is None else 1
        return size, parts, list(range(first, first + step * n, step)), [GGUFValueType.ARRAY, GGUFValueType(itype)]

    def _plain_view(self) -> np.ndarray:
        if self._plain is None:
            self._plain = self.data.view(np.ndarray)
        return self._plain

    def _build_tensors(self, start_offs, fields):
        """Check every tensor's type, shape, alignment and bounds before gguf maps it."""
        size = int(self.data.size)
        spans = []
        for field in fields:
            _nl, name_data, _nd, dims, raw_dtype, off = field.parts
            name = bytes(name_data).decode("utf-8", errors="replace")
            try:
                qt = GGMLQuantizationType(int(raw_dtype[0]))
            except ValueError:
                raise FormatError(f"tensor {name!r} has unknown ggml type id {int(raw_dtype[0])}") from None
            ne = [int(d) for d in dims]
            if not ne or any(d <= 0 for d in ne):
                raise FormatError(f"tensor {name!r} has an empty dimension: shape {ne}")
            n = 1
            for d in ne:
                n *= d
            block, tsize = GGML_QUANT_SIZES[qt]
            if ne[0] % block:
                raise FormatError(f"tensor {name!r}: row length {ne[0]} is not a multiple of the "
                                  f"{qt.name} block size {block}")
            nbytes = n // block * tsize
            rel = int(off[0])
            if rel % self.alignment:
                raise FormatError(f"tensor {name!r}: data offset {rel} is not a multiple of the alignment "
                                  f"{self.alignment}")
            start = int(start_offs) + rel
            if start + nbytes > size:
                raise FormatError(f"tensor {name!r}: {nbytes} bytes at offset {start} run past the end of "
                                  f"the file ({size} bytes)")
            spans.append((start, start + nbytes, name))
        spans.sort()
        for (a0, a1, an), (b0, b1, bn) in zip(spans, spans[1:]):
            if b0 < a1:
                raise FormatError(f"tensors {an!r} and {bn!r} overlap in the data section")
        super()._build_tensors(start_offs, fields)


_VALUE_TYPES = {int(t) for t in GGUFValueType}
_DTYPES = {t: np.dtype(t) for t in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32, np.uint64,
                                   np.int64, np.float32, np.float64, np.bool_)}


def _field_kv(field) -> KV:
    vtype = field.types[0]
    sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
    if vtype == GGUFValueType.ARRAY and len(field.types) > 2:
        raise FormatError(f"metadata key {field.name!r}: nested arrays are not supported")
    value = field.contents()
    if vtype == GGUFValueType.ARRAY and sub is None:
        sub = GGUFValueType.UINT8
    return KV(field.name, value, vtype, sub)


class GGUFModel:
    """A GGUF file opened read-only and memory-mapped."""

    def __init__(self, path: str | os.PathLike, whole: bool = True):
        """``whole=False``: this file only, even when it is one part of a split model."""
        self._open_file(path)
        self.parts: list[GGUFModel] = [self]      # the split model's parts, first one first
        self.part_of: dict[str, int] = {t.name: 0 for t in self.tensors}
        if whole:
            self._join_parts()

    def _open_file(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise FormatError(f"{self.path}: no such file")
        if self.path.is_dir():
            raise FormatError(f"{self.path}: is a directory, not a GGUF file")
        st = self.path.stat()
        size = st.st_size
        self._identity = _identity(st)
        with open(self.path, "rb") as f:
            magic = f.read(4)
        if magic != GGUF_MAGIC:
            raise FormatError(f"{self.path}: not a GGUF file (magic {magic!r}, expected {GGUF_MAGIC!r})")
        try:
            reader = _Reader(self.path, "r")
        except FormatError as e:
            raise FormatError(f"{self.path}: {e}") from None
        except KeyError as e:  # gguf's duplicate-key check
            raise FormatError(f"{self.path}: {e.args[0] if e.args else e}") from None
        except Exception as e:  # the gguf package raises many kinds on damaged files
            raise FormatError(f"{self.path}: damaged or truncated GGUF ({type(e).__name__}: {e})") from None
        self.reader = reader
        self.file_size = size
        self.alignment = int(reader.alignment)
        self.data_offset = int(reader.data_offset)
        try:
            self.kv: list[KV] = [_field_kv(f) for k, f in reader.fields.items() if not k.startswith("GGUF.")]
        except FormatError as e:
            raise FormatError(f"{self.path}: {e}") from None
        except Exception as e:
            raise FormatError(f"{self.path}: unreadable metadata ({type(e).__name__}: {e})") from None
        self.metadata: dict[str, Any] = {kv.key: kv.value for kv in self.kv}
        self.version = int(reader.fields["GGUF.version"].contents())
        # gguf keeps a numpy array per string of every array value (two per vocabulary entry): tens of
        # MiB for a 49k vocabulary. Everything is in self.kv now, so let them go.
        reader.fields.clear()
        self.tensors: list[Tensor] = []
        self.offsets: dict[str, int] = {}
        for rt in reader.tensors:
            shape = tuple(int(d) for d in rt.shape)
            end = int(rt.data_offset) + int(rt.n_bytes)
            if end > size:
                raise FormatError(
                    f"{self.path}: tensor {rt.name!r} ends at byte {end} beyond the file size {size} (truncated?)"
                )
            n_rows = max(1, int(np.prod(shape[1:], dtype=np.int64))) if len(shape) > 1 else 1
            raw = np.asarray(rt.data).reshape(-1).view(np.uint8)
            self.tensors.append(Tensor(rt.name, shape, GGMLQuantizationType(rt.tensor_type), raw.reshape(n_rows, -1)))
            self.offsets[rt.name] = int(rt.data_offset)
        self._by_name = {t.name: t for t in self.tensors}
        self._advise_huge_pages()

    def _join_parts(self) -> None:
        """Open the other parts of a split model (llama_model_loader's constructor), or nothing."""
        n = _split_int(self, SPLIT_COUNT, 0)
        if n <= 1:
            return
        no = _split_int(self, SPLIT_NO, None)
        if no != 0:
            first = split_prefix(self.path, no, n)
            hint = f" ({split_path(first, 0, n)})" if first is not None else ""
            raise FormatError(f"{self.path}: part {no + 1} of a split model of {n} parts; open its first "
                              f"part{hint}")
        prefix = split_prefix(self.path, 0, n)
        if prefix is None:
            raise FormatError(f"{self.path}: the first part of a split model of {n} parts must be named "
                              f"PREFIX-00001-of-{n:05d}.gguf to find the others")
        try:
            for idx in range(1, n):
                p = Path(split_path(prefix, idx, n))
                if not p.exists():
                    raise FormatError(f"{self.path}: part {idx + 1} of {n}, {p}, is missing")
                part = GGUFModel(p, whole=False)
                self.parts.append(part)
                got_no, got_n = _split_int(part, SPLIT_NO, None), _split_int(part, SPLIT_COUNT, None)
                if got_no != idx:
                    raise FormatError(f"{p}: split.no is {got_no}, expected {idx} (part {idx + 1} of {n})")
                if got_n != n:
                    raise FormatError(f"{p}: split.count is {got_n}, but the first part {self.path.name} "
                                      f"says {n}")
                for t in part.tensors:
                    if t.name in self._by_name:
                        raise FormatError(f"{p}: tensor {t.name!r} is duplicated (also in part "
                                          f"{self.part_of[t.name] + 1})")
                    self._by_name[t.name] = t
                    self.part_of[t.name] = idx
                    self.tensors.append(t)
            want = _split_int(self, SPLIT_TENSORS_COUNT, None)
            if want != len(self.tensors):
                raise FormatError(f"{self.path}: split.tensors.count says {want} tensors, but the {n} parts "
                                  f"hold {len(self.tensors)}")
        except BaseException:
            self.close()
            raise
        self.file_size = sum(p.file_size for p in self.parts)

    def location(self, name: str) -> tuple[int, int]:
        """(part index, byte offset in its part's file) of a tensor's data: llama_tensor_weight's
        (idx, offs), the order ``quantize --keep-split`` writes tensors in."""
        part = self.part_of[name]
        return part, self.parts[part].offsets[name]

    def _advise_huge_pages(self) -> None:
        """Advise the file mapping for transparent huge pages (Linux ``MADV_HUGEPAGE``): a fault in the
        map then reads ahead in 2 MiB folios, which the kernel maps with one page-table entry when the
        map is 2 MiB-aligned (ext4/xfs align file maps of 2 MiB and more). Model runs stream every
        weight once per token from this map; docs/performance.md has the measurements. Harmless
        where unsupported."""
        mm = getattr(getattr(self.reader, "data", None), "_mmap", None)
        if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_HUGEPAGE"):
            try:
                mm.madvise(mmap.MADV_HUGEPAGE)
            except (OSError, ValueError):
                pass

    # -- access -------------------------------------------------------------------------------
    def check_unchanged(self) -> None:
        """Raise if the file is no longer the one opened: truncated, rewritten or replaced.

        A file truncated under the memory map makes a read past its new end fault (SIGBUS, caught by
        ``quantkit.formats.sigbus``, which maps zeros there); whatever was read since is unreliable.
        Callers check before they commit anything made from the data, and at the end of a run.
        """
        for part in self.parts[1:]:
            part.check_unchanged()
        try:
            now = _identity(os.stat(self.path))
        except OSError as e:
            raise FormatError(f"{self.path}: the input disappeared while it was being read ({e.strerror}); "
                              f"the run stopped and kept nothing made from it") from None
        if now != self._identity:
            size0, size1 = self._identity[2], now[2]
            how = (f"its size went from {size0} to {size1} bytes" if size1 != size0 else
                   "it was replaced by another file" if now[:2] != self._identity[:2] else "it was rewritten")
            raise FormatError(f"{self.path}: the input changed while it was being read ({how}); "
                              f"the run stopped and kept nothing made from it")

    @property
    def arch(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def tensor(self, name: str) -> Tensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise FormatError(f"{self.path}: no tensor named {name!r}") from None

    def has_tensor(self, name: str) -> bool:
        return name in self._by_name

    def release(self, tensor: Tensor, start_row: int = 0, stop_row: int | None = None) -> None:
        """Drop a tensor's pages (or those of rows ``start_row:stop_row``) from this process's memory
        (llama-quantize's unmap_weight). The mapping stays valid: touching the data reads it back."""
        self._advise(tensor, start_row, stop_row, mmap.MADV_DONTNEED)

    def prefetch(self, tensor: Tensor, start_row: int = 0, stop_row: int | None = None) -> None:
        """Ask the kernel to start reading a tensor's rows in the background (MADV_WILLNEED); returns at once."""
        self._advise(tensor, start_row, stop_row, mmap.MADV_WILLNEED)

    def _advise(self, tensor: Tensor, start_row: int, stop_row: int | None, advice: int) -> None:
        owner = self.parts[self.part_of.get(tensor.name, 0)] if len(self.parts) > 1 else self
        mm = getattr(getattr(owner.reader, "data", None), "_mmap", None)
        if mm is None or tensor.data is None or not tensor.data.size or not hasattr(mm, "madvise"):
            return
        rows = tensor.data[start_row:stop_row]
        if not rows.size:
            return
        base = np.frombuffer(mm, dtype=np.uint8).__array_interface__["data"][0]
        start = rows.__array_interface__["data"][0] - base
        page = mmap.PAGESIZE
        lo = start // page * page
        hi = start + rows.nbytes
        try:
            mm.madvise(advice, lo, hi - lo)
        except (OSError, ValueError):
            pass

    def kv_record(self, key: str) -> KV | None:
        for kv in self.kv:
            if kv.key == key:
                return kv
        return None

    def close(self) -> None:
        for part in getattr(self, "parts", [])[1:]:
            part.close()
        self.parts = [self]
        self.tensors = []
        self._by_name = {}
        mm = getattr(self.reader, "data", None)
        if mm is not None and hasattr(mm, "_mmap") and mm._mmap is not None:
            try:
                mm._mmap.close()
            except (BufferError, ValueError):  # views still alive elsewhere: leave it to the GC
                pass
        self.reader = None

    def __enter__(self) -> "GGUFModel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _split_int(m: GGUFModel, key: str, default):
    """A split key's integer value (``default`` when absent); a non-integer value is one error line."""
    v = m.metadata.get(key, default)
    if v is default:
        if default is None:
            raise FormatError(f"{m.path}: key {key} is missing from a part of a split model")
        return v
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise FormatError(f"{m.path}: {key} must be an integer, got {v!r}")
    return int(v)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def set_kv(kvs: list[KV], key: str, value: Any, vtype: GGUFValueType, sub_type: GGUFValueType | None = None) -> list[KV]:
    """Return ``kvs`` with ``key`` replaced in place (keeping its position) or appended."""
    new = KV(key, value, vtype, sub_type)
    out = [new if kv.key == key else kv for kv in kvs]
    if not any(kv.key == key for kv in kvs):
        out.append(new)
    return out


def remove_kv(kvs: list[KV], *keys: str) -> list[KV]:
    return [kv for kv in kvs if kv.key not in keys]


#: numpy's dtype of each GGUF array item type packed in one go by ``_Writer`` (the kind its values must have)
_ARRAY_DTYPES = {GGUFValueType.UINT8: ("u1", "iu"), GGUFValueType.INT8: ("i1", "iu"), GGUFValueType.UINT16: ("u2", "iu"),
                 GGUFValueType.INT16: ("i2", "iu"), GGUFValueType.UINT32: ("u4", "iu"), GGUFValueType.INT32: ("i4", "iu"),
                 GGUFValueType.UINT64: ("u8", "iu"), GGUFValueType.INT64: ("i8", "iu"),
                 GGUFValueType.FLOAT32: ("f4", "fiu"), GGUFValueType.FLOAT64: ("f8", "fiu"), GGUFValueType.BOOL: ("?", "b")}


class _Writer(GGUFWriter):
    """gguf-py's ``GGUFWriter`` whose long arrays of numbers and strings are packed at once (numpy, one
    join) instead of item by item: a 151,936-token vocabulary's ~450,000 items took ~2 s in gguf-py's
    ``_pack_val``. The bytes are gguf-py's (tests/test_gguf_io.py compares them); anything else, or a
    value gguf-py would refuse, goes to gguf-py's own ``_pack_val``."""

    def _pack_val(self, val: Any, vtype: GGUFValueType, add_vtype: bool, sub_type: GGUFValueType | None = None) -> bytes:
        if (vtype != GGUFValueType.ARRAY or isinstance(val, (bytes, str)) or not isinstance(val, Sequence)
                or len(val) < 16):
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        ltype = sub_type if sub_type is not None else GGUFValueType.get_type(val[0])
        body = self._pack_items(val, ltype, sub_type is None)
        if body is None:
            return super()._pack_val(val, vtype, add_vtype, sub_type)
        head = (self._pack("I", vtype) if add_vtype else b"") + self._pack("I", ltype) + self._pack("Q", len(val))
        return head + body

    def _pack_items(self, val: Sequence, ltype: GGUFValueType, inferred: bool) -> bytes | None:
        order = "<" if self.endianess == GGUFEndian.LITTLE else ">"
        if ltype == GGUFValueType.STRING:
            if not all(isinstance(i, (str, bytes)) for i in val):
                return None
            enc = [i.encode("utf-8") if isinstance(i, str) else i for i in val]
            size = struct.Struct(order + "Q")
            return b"".join([size.pack(len(e)) + e for e in enc])
        if ltype not in _ARRAY_DTYPES:
            return None
        dtype, kinds = _ARRAY_DTYPES[ltype]
        if inferred and not all(GGUFValueType.get_type(i) is ltype for i in val):
            return None                      # gguf-py refuses mixed arrays: let it say so
        arr = np.asarray(val)
        if arr.ndim != 1 or arr.dtype.kind not in kinds:
            return None
        if arr.dtype.kind in "iu":           # struct refuses what does not fit; so does this path
            info = np.iinfo(dtype) if dtype[0] in "iu" else np.finfo(dtype)
            if arr.size and (arr.min() < info.min or arr.max() > info.max):
                return None
        return arr.astype(np.dtype(dtype).newbyteorder(order if dtype != "?" else "="), copy=False).tobytes()


class GGUFOutput:
    """Stream a GGUF to ``path`` through ``AtomicWriter``; nothing appears at ``path`` until ``commit()``.

    ``tensors`` lists (name, GGUF shape, type) in the order their data will be written with
    ``write(name, data)``. The header (gguf's own ``GGUFWriter`` serialization) is built in memory at
    construction, so ``size`` is the exact file size before anything is opened.
    """

    def __init__(self, path: str | os.PathLike, kv: Iterable[KV], tensors: Iterable[Tensor],
                 alignment: int | None = None, what: str = "the output"):
        self.path = Path(path)
        self.kv = list(kv)
        self.plan = list(tensors)
        align = alignment
        for rec in self.kv:
            if rec.key == "general.alignment":
                align = int(rec.value)
        self.alignment = int(align or GGUF_DEFAULT_ALIGNMENT)
        self.header = self._header()
        self.size = _pad(len(self.header), self.alignment) + sum(_pad(t.nbytes, self.alignment) for t in self.plan)
        self._next = 0
        self._out = AtomicWriter(self.path, self.size, what)
        self.committed = False

    def _header(self) -> bytes:
        arch = next((str(r.value) for r in self.kv if r.key == "general.architecture"), "")
        w = _Writer(None, arch)
        w.kv_data = [{}]  # drop the key GGUFWriter adds itself; we copy every key in its own order
        w.data_alignment = self.alignment
        for rec in self.kv:
            w.add_key_value(rec.key, rec.value, rec.vtype, rec.sub_type)
        for t in self.plan:
            byte_shape = (*reversed([int(d) for d in t.shape[1:]]), t.row_bytes)
            w.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=t.type)
        buf = io.BytesIO()
        w.fout, w.state = [buf], WriterState.EMPTY     # gguf then serializes into memory
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.fout = None
        return buf.getvalue()

    def open(self) -> "GGUFOutput":
        self._out.open()
        self._out.write(self.header)
        self._out.write(bytes(_pad(len(self.header), self.alignment) - len(self.header)))
        return self

    def write(self, name: str, data: np.ndarray) -> None:
        self.write_parts(name, (data,))

    def write_parts(self, name: str, parts: Iterable[np.ndarray]) -> None:
        """Write the next planned tensor from consecutive pieces of its bytes (a converter's row ranges
        or experts), so it never has to be whole in memory."""
        if self._out.tmp is None:
            raise FormatError(f"{self.path}: write() before open()")
        if self._next >= len(self.plan) or self.plan[self._next].name != name:
            want = self.plan[self._next].name if self._next < len(self.plan) else "nothing"
            raise FormatError(f"{self.path}: tensor {name!r} written out of order (expected {want})")
        t = self.plan[self._next]
        done = 0
        for data in parts:
            buf = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
            if done + buf.nbytes > t.nbytes:
                break
            self._out.write(buf)
            done += buf.nbytes
        else:
            buf = None
        if buf is not None or done != t.nbytes:
            got = done + (buf.nbytes if buf is not None else 0)
            raise FormatError(f"{self.path}: tensor {name!r} has {'more than ' if buf is not None else ''}{got} "
                              f"bytes, planned {t.nbytes}")
        self._out.write(bytes(_pad(t.nbytes, self.alignment) - t.nbytes))
        self._next += 1
        pause_point("gguf.tensor")

    @property
    def complete(self) -> bool:
        """Every planned tensor has been written."""
        return self._next == len(self.plan)

    def commit(self) -> Path:
        if self._next != len(self.plan):
            self.abort()
            raise FormatError(f"{self.path}: only {self._next} of {len(self.plan)} tensors were written")
        self._out.commit()
        self.committed = True
        return self.path

    def abort(self) -> None:
        self._out.abort()

    @property
    def tmp(self) -> Path | None:
        return self._out.tmp

    def __enter__(self) -> "GGUFOutput":
        return self.open()

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            self.abort()


def _pad(n: int, align: int) -> int:
    return (n + align - 1) // align * align


def copy_gguf(src: str | os.PathLike, dst: str | os.PathLike) -> Path:
    """Rewrite a GGUF through GGUFOutput unchanged (metadata order, tensor order, alignment)."""
    with GGUFModel(src) as m:
        with GGUFOutput(dst, m.kv, [Tensor(t.name, t.shape, t.type) for t in m.tensors], m.alignment) as out:
            for t in m.tensors:
                out.write(t.name, t.data)
            return out.commit()
