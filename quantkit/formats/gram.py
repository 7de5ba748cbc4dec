"""The Gram-matrix file of ``quantize --optimize --optimize-stats FILE`` (quantkit's own; llama.cpp has none).

A numpy ``.npz`` archive (no pickles): ``m0, m1, ...`` the distinct Gram matrices ``sum x^T x``
(float64 n x n), and ``meta``, UTF-8 JSON as uint8: ``{"version": 1, "identity": {...}, "names":
{weight: index}, "rows": [rows of each matrix]}``. ``identity`` says what made it (model file, text,
chunks); a file made otherwise is refused by the caller. Written atomically.
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

VERSION = 1


def save_grams(path: str | os.PathLike, names: dict[str, int], mats: list[np.ndarray], rows: list[int],
               identity: dict) -> Path:
    meta = {"version": VERSION, "identity": identity, "names": names, "rows": [int(r) for r in rows]}
    buf = io.BytesIO()
    arrays = {f"m{i}": np.ascontiguousarray(m, dtype=np.float64) for i, m in enumerate(mats)}
    np.savez(buf, meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    return write_bytes(path, buf.getvalue(), "the Gram matrices")


def load_grams(path: str | os.PathLike) -> tuple[dict[str, int], list[np.ndarray], list[int], dict]:
    """``(names, mats, rows, identity)`` as saved; one line for a file that is not one."""
    p = Path(path)
    try:
        with np.load(p, allow_pickle=False) as z:
            meta = json.loads(bytes(z["meta"]).decode())
            if meta.get("version") != VERSION:
                raise FormatError(f"{p}: Gram file version {meta.get('version')!r}, this quantkit reads {VERSION}")
            rows = [int(r) for r in meta["rows"]]
            mats = [z[f"m{i}"] for i in range(len(rows))]
            names = {str(k): int(v) for k, v in meta["names"].items()}
    except FormatError:
        raise
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise FormatError(f"{p}: not a quantkit Gram file ({e})") from None
    for m in mats:
        if m.ndim != 2 or m.shape[0] != m.shape[1] or m.dtype != np.float64:
            raise FormatError(f"{p}: a Gram matrix of shape {m.shape} ({m.dtype}) is not square float64")
    if any(not 0 <= i < len(mats) for i in names.values()):
        raise FormatError(f"{p}: a weight names a matrix the file does not have")
    return names, mats, rows, meta.get("identity", {})
