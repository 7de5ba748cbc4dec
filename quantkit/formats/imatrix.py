"""Importance-matrix files in both formats llama.cpp writes (tools/imatrix/imatrix.cpp's ``save_imatrix`` /
``save_imatrix_legacy``, read back as common ``common_imatrix_load`` and tools/quantize/quantize.cpp's ``load_imatrix`` do).

* GGUF (default since PR #9400): ``general.type = "imatrix"``, ``imatrix.datasets`` (str array),
  ``imatrix.chunk_count`` and ``imatrix.chunk_size`` (u32), and per weight (sorted by weight name)
  two F32 tensors: ``<name>.in_sum2`` [ne0, n_mat] raw sums of squared activations, then
  ``<name>.counts`` [1, n_mat] token counts (a trailing n_mat of 1 is not stored, as ggml does).
* Legacy ``.dat``: int32 entry count; per entry (sorted names) int32 name length, the name, int32
  ncall, int32 nval, float32 values (means times ncall); then optionally int32 last_chunk and the
  dataset name.

In memory an ``Imatrix`` keeps the raw GGUF form (sums and counts per matrix) so files can be merged,
converted and continued exactly as llama-imatrix does.
"""

from __future__ import annotations

import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from quantkit.errors import FormatError
from quantkit.formats.atomic import write_bytes
from quantkit.formats.gguf_io import KV, GGUFModel, GGUFOutput, Tensor


@dataclass
class Entry:
    sums: np.ndarray  # float32 [n_mat, ne0]: sum over tokens of x_j**2
    counts: np.ndarray  # float32 [n_mat]: tokens seen per matrix (expert)

    @property
    def n_mat(self) -> int:
        return int(self.sums.shape[0])

    @property
    def ne0(self) -> int:
        return int(self.sums.shape[1])


@dataclass
class Imatrix:
    entries: dict[str, Entry] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    source: str = ""
    #: the file's own chunk_count line for legacy files (last_chunk trailer), for reporting
    legacy: bool = False

    def weights(self, name: str) -> np.ndarray | None:
        """Per-column quantization weights for one tensor as llama-quantize derives them.

        Returns float32 [n_mat, ne0] (one row per expert), or None when there is no entry.
        GGUF files: sums / count, with every weight 1.0 for a matrix whose count is 0. Legacy files
        are stored here in raw form (value*chunk_size, ncall*chunk_size), which gives value / ncall.
        """
        e = self.entries.get(name)
        if e is None:
            return None
        out = np.empty_like(e.sums, dtype=np.float32)
        for i in range(e.n_mat):
            c = np.float32(e.counts[i])
            if c == 0:
                out[i] = 1.0
            else:
                out[i] = e.sums[i] / c
        return out

    def filtered(self, include: tuple[str, ...] = (), exclude: tuple[str, ...] = ()) -> "Imatrix":
        """Keep entries whose name contains one of ``include``, then drop those containing ``exclude``."""
        keep = {}
        for k, v in self.entries.items():
            if include and not any(s in k for s in include):
                continue
            if exclude and any(s in k for s in exclude):
                continue
            keep[k] = v
        return Imatrix(keep, list(self.datasets), self.chunk_count, self.chunk_size, self.source, self.legacy)

    def check_finite(self) -> None:
        for k, e in self.entries.items():
            if not (np.isfinite(e.sums).all() and np.isfinite(e.counts).all()):
                raise FormatError(f"{self.source}: imatrix contains non-finite value in entry {k!r}")
            if (e.sums < 0).any() or (e.counts < 0).any():
                raise FormatError(f"{self.source}: imatrix contains a negative value in entry {k!r}")

    def merge(self, other: "Imatrix") -> None:
        """Accumulate ``other`` into this one (llama-imatrix --in-file)."""
        for k, e in other.entries.items():
            mine = self.entries.get(k)
            if mine is None:
                self.entries[k] = Entry(e.sums.copy(), e.counts.copy())
                continue
            if mine.sums.shape != e.sums.shape:
                raise FormatError(
                    f"{other.source}: entry {k!r} has shape {e.sums.shape[::-1]}, "
                    f"but {mine.sums.shape[::-1]} was loaded before"
                )
            mine.sums += e.sums
            mine.counts += e.counts
        self.datasets.extend(other.datasets)
        self.chunk_count += other.chunk_count
        if not self.chunk_size:
            self.chunk_size = other.chunk_size


# -- reading -------------------------------------------------------------------------------------

def load_imatrix(path: str | os.PathLike) -> Imatrix:
    """Read either format (GGUF tried first, as llama.cpp's loader does)."""
    p = Path(path)
    if not p.is_file():
        raise FormatError(f"{p}: no such imatrix file")
    with open(p, "rb") as f:
        magic = f.read(4)
    im = _load_gguf(p) if magic == b"GGUF" else _load_legacy(p)
    im.check_finite()
    return im


def _load_gguf(p: Path) -> Imatrix:
    with GGUFModel(p) as m:
        missing = [k for k in ("imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size") if k not in m.metadata]
        if missing:
            raise FormatError(f"{p}: missing imatrix metadata ({', '.join(missing)}); is this an imatrix file?")
        sums: dict[str, Tensor] = {}
        counts: dict[str, Tensor] = {}
        for t in m.tensors:
            if t.name.endswith(".in_sum2"):
                sums[t.name[: -len(".in_sum2")]] = t
            elif t.name.endswith(".counts"):
                counts[t.name[: -len(".counts")]] = t
            else:
                raise FormatError(f"{p}: unexpected tensor {t.name!r} in an imatrix file")
        if set(sums) != set(counts):
            odd = sorted(set(sums) ^ set(counts))[0]
            raise FormatError(f"{p}: mismatched sums and counts for {odd!r}")
        entries = {}
        for name in sums:
            s, c = sums[name], counts[name]
            if s.type != GGMLQuantizationType.F32 or c.type != GGMLQuantizationType.F32:
                raise FormatError(f"{p}: entry {name!r} must be F32 (got {s.type.name}/{c.type.name})")
            ne0 = s.shape[0]
            n_mat = s.shape[1] if len(s.shape) > 1 else 1
            cnt = c.data.view(np.float32).reshape(-1).copy()
            if cnt.size != n_mat:
                raise FormatError(f"{p}: entry {name!r} has {cnt.size} counts for {n_mat} matrices")
            entries[name] = Entry(s.data.view(np.float32).reshape(n_mat, ne0).copy(), cnt)
        ds = m.metadata["imatrix.datasets"]
        datasets = [ds] if isinstance(ds, str) else list(ds)
        return Imatrix(entries, datasets, int(m.metadata["imatrix.chunk_count"]),
                       int(m.metadata["imatrix.chunk_size"]), str(p))


def _load_legacy(p: Path) -> Imatrix:
    data = p.read_bytes()
    size = len(data)
    pos = 0

    def take(fmt: str, what: str):
        nonlocal pos
        n = struct.calcsize(fmt)
        if pos + n > size:
            raise FormatError(f"{p}: truncated legacy imatrix while reading {what} at byte {pos}")
        v = struct.unpack_from(fmt, data, pos)
        pos += n
        return v

    (n_entries,) = take("<i", "the entry count")
    # each entry needs at least 12 bytes: a header claiming more than the file holds is refused
    if n_entries <= 0 or n_entries * 12 > size:
        raise FormatError(f"{p}: not an imatrix file (entry count {n_entries} does not fit {size} bytes)")
    raw: list[tuple[str, int, np.ndarray]] = []
    for i in range(n_entries):
        (ln,) = take("<i", f"entry {i} name length")
        if ln <= 0 or pos + ln > size:
            raise FormatError(f"{p}: entry {i} has an invalid name length {ln}")
        name = data[pos: pos + ln].decode("utf-8", errors="replace")
        pos += ln
        ncall, nval = take("<ii", f"entry {name!r} header")
        if nval <= 0 or pos + 4 * nval > size:
            raise FormatError(f"{p}: entry {name!r} claims {nval} values beyond the file size")
        vals = np.frombuffer(data, dtype="<f4", count=nval, offset=pos).astype(np.float32)
        pos += 4 * nval
        raw.append((name, ncall, vals))
    last_chunk = 0
    datasets: list[str] = []
    if pos + 4 <= size:
        (last_chunk,) = take("<i", "the chunk trailer")
        if pos + 4 <= size:
            (dl,) = take("<i", "the dataset name length")
            if dl < 0 or pos + dl > size:
                raise FormatError(f"{p}: invalid dataset name length {dl}")
            datasets.append(data[pos: pos + dl].decode("utf-8", errors="replace"))
            pos += dl
    # Legacy values are means scaled by ncall; keep them in the raw form llama.cpp reconstructs
    # (sums = value * chunk_size, counts = ncall * chunk_size) with chunk_size 1 when unknown, so that
    # weights() gives value / ncall, and value itself when ncall == 0.
    entries = {}
    for name, ncall, vals in raw:
        if ncall == 0:
            entries[name] = Entry(vals.reshape(1, -1).copy(), np.ones(1, dtype=np.float32))
        else:
            entries[name] = Entry(vals.reshape(1, -1).copy(), np.array([ncall], dtype=np.float32))
    return Imatrix(entries, datasets, int(last_chunk), 0, str(p), legacy=True)


# -- writing -------------------------------------------------------------------------------------

def imatrix_gguf_output(im: Imatrix, path: str | os.PathLike) -> GGUFOutput:
    """The GGUF writer for ``im`` (not opened yet: its ``size`` is the file's exact size)."""
    names = sorted(im.entries)
    kv = [
        KV("general.type", "imatrix", GGUFValueType.STRING),
        KV("imatrix.datasets", list(im.datasets), GGUFValueType.ARRAY, GGUFValueType.STRING),
        KV("imatrix.chunk_count", int(im.chunk_count), GGUFValueType.UINT32),
        KV("imatrix.chunk_size", int(im.chunk_size), GGUFValueType.UINT32),
    ]
    # As llama-imatrix's save_imatrix: per sorted weight name, in_sum2 then counts; ggml stores
    # ggml_n_dims dimensions (trailing 1s dropped), so a dense entry is [ne0] and [1]. With the same
    # data the bytes equal llama-imatrix's.
    tensors = []
    for n in names:
        e = im.entries[n]
        dense = e.n_mat == 1
        tensors.append(Tensor(f"{n}.in_sum2", (e.ne0,) if dense else (e.ne0, e.n_mat), GGMLQuantizationType.F32))
        tensors.append(Tensor(f"{n}.counts", (1,) if dense else (1, e.n_mat), GGMLQuantizationType.F32))
    return GGUFOutput(path, kv, tensors, what="the imatrix")


def save_imatrix_gguf(im: Imatrix, path: str | os.PathLike) -> Path:
    """Write the GGUF form atomically (temporary file, then rename)."""
    with imatrix_gguf_output(im, path) as out:
        for t in out.plan:
            base, _, kind = t.name.rpartition(".")
            e = im.entries[base]
            arr = e.counts if kind == "counts" else e.sums
            out.write(t.name, np.ascontiguousarray(arr, dtype=np.float32))
        return out.commit()


def save_imatrix_dat(im: Imatrix, path: str | os.PathLike) -> tuple[Path, int]:
    """Write the legacy form atomically; returns (path, entries stored). Empty entries are skipped."""
    p = Path(path)
    chunk = max(1, int(im.chunk_size))
    parts = []
    stored = 0
    for name in sorted(im.entries):
        e = im.entries[name]
        if not (e.counts > 0).any():
            continue
        ncall = int(math.ceil(float(e.counts.max()) / chunk))
        vals = np.empty_like(e.sums)
        for i in range(e.n_mat):
            c = float(e.counts[i])
            vals[i] = (e.sums[i] / np.float32(c)) * np.float32(ncall) if c > 0 else np.float32(ncall)
        nb = name.encode()
        parts.append(struct.pack("<i", len(nb)) + nb + struct.pack("<ii", ncall, vals.size)
                     + vals.astype("<f4").tobytes())
        stored += 1
    dataset = (im.datasets[-1] if im.datasets else "").encode()
    blob = struct.pack("<i", stored) + b"".join(parts) + struct.pack("<i", int(im.chunk_count)) \
        + struct.pack("<i", len(dataset)) + dataset
    write_bytes(p, blob, "the imatrix")
    return p, stored
