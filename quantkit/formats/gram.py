"""The statistics directory of ``quantize --optimize --optimize-stats DIR`` (quantkit's own; llama.cpp has none).

``DIR/identity.json``: what made the statistics (model file size, text, chunks, context; a run made
otherwise is refused in one line). ``DIR/layer-N.npz``, one per layer as soon as its sums are complete:
a numpy ``.npz`` archive (no pickles), ``m0, m1, ...`` the layer's distinct Gram matrices ``sum x^T x``
(float32 n x n, symmetric) and ``meta``, UTF-8 JSON as uint8: ``{"version": 2, "names": {weight: index},
"rows": [rows of each matrix]}``. ``DIR/streams.npz``: the calibration chunks' residual streams (float32
chunks x n_ctx x n_embd) after the layer ``meta`` names, so that a run can go on from the last layer
saved. Every file is written atomically.
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path

import numpy as np

from quantkit.errors import FormatError
from quantkit.formats.atomic import write_bytes

VERSION = 2


def _write_npz(path: Path, meta: dict, arrays: dict, what: str) -> None:
    buf = io.BytesIO()
    np.savez(buf, meta=np.frombuffer(json.dumps({"version": VERSION, **meta}).encode(), dtype=np.uint8), **arrays)
    write_bytes(path, buf.getvalue(), what)


def _read_npz(path: Path, read):
    """``read(z, meta)`` of the archive at ``path``; one line for a file that is not one of ours."""
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("version") != VERSION:
                raise FormatError(f"{path}: statistics file version {meta.get('version')!r}, this quantkit reads {VERSION}")
            return read(z, meta)
    except FormatError:
        raise
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: not a quantkit statistics file ({e})") from None


class GramStore:
    """One statistics directory (module docstring)."""

    def __init__(self, root: Path):
        self.root = root

    def load_layer(self, layer: int) -> tuple[dict[str, int], list[np.ndarray], list[int]] | None:
        """``(names, mats, rows)`` of layer ``layer`` as saved, or None when it was not."""
        p = self.root / f"layer-{layer}.npz"
        if not p.exists():
            return None

        def read(z, meta):
            rows = [int(r) for r in meta["rows"]]
            mats = [z[f"m{i}"] for i in range(len(rows))]
            return {str(k): int(v) for k, v in meta["names"].items()}, mats, rows

        names, mats, rows = _read_npz(p, read)
        for m in mats:
            if m.ndim != 2 or m.shape[0] != m.shape[1] or m.dtype != np.float32:
                raise FormatError(f"{p}: a Gram matrix of shape {m.shape} ({m.dtype}) is not square float32")
        if any(not 0 <= i < len(mats) for i in names.values()):
            raise FormatError(f"{p}: a weight names a matrix the file does not have")
        return names, mats, rows

    def save_layer(self, layer: int, names: dict[str, int], mats: list[np.ndarray], rows: list[int],
                   streams: np.ndarray, after: int) -> None:
        """Layer ``layer``'s matrices, then the residual streams after layer ``after``."""
        _write_npz(self.root / f"layer-{layer}.npz", {"names": names, "rows": [int(r) for r in rows]},
                   {f"m{i}": np.ascontiguousarray(m, dtype=np.float32) for i, m in enumerate(mats)},
                   "the Gram matrices")
        _write_npz(self.root / "streams.npz", {"layer": after}, {"x": streams}, "the residual streams")

    def load_hidden(self, layer: int) -> np.ndarray | None:
        """The residual streams after layer ``layer`` when those saved are, else None."""
        p = self.root / "streams.npz"
        if not p.exists():
            return None
        return _read_npz(p, lambda z, meta: np.array(z["x"], dtype=np.float32) if meta.get("layer") == layer else None)


def open_store(path: str | os.PathLike, identity: dict) -> GramStore:
    """The statistics directory at ``path`` (made when missing); one line when another run made it."""
    root = Path(path)
    ident = root / "identity.json"
    if root.exists() and not root.is_dir():
        raise FormatError(f"{root}: not a directory (--optimize-stats keeps a directory of statistics)")
    if ident.exists():
        try:
            saved = json.loads(ident.read_text())
        except (OSError, ValueError):
            raise FormatError(f"{ident}: not a quantkit statistics identity") from None
        if saved != identity:
            diff = ", ".join(f"{k} {saved.get(k)!r} there, {v!r} here" for k, v in identity.items() if saved.get(k) != v)
            raise FormatError(f"{root}: statistics made otherwise ({diff}); remove it or give another directory")
    else:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise FormatError(f"{root}: cannot make the statistics directory ({e.strerror})") from None
        write_bytes(ident, json.dumps(identity).encode(), "the statistics identity")
    return GramStore(root)
