"""What the convert golden data keeps of a GGUF (tests/test_convert.py, tools/make_convert_golden.py).

The tiny checkpoints it is made from are written by ``quantkit.checkpoints`` (the module the README's
pipeline runs as ``python -m quantkit.checkpoints``). Needs only numpy and gguf.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np


# -- what the golden data keeps of a GGUF --------------------------------------------------------------

def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, ensure_ascii=False).encode()).hexdigest()


def summarize(path: str | Path) -> dict:
    """A GGUF as JSON: every KV pair (type, value; long arrays as their length and a sha256 of their JSON)
    and every tensor (name, ggml type, GGUF shape, sha256 of its bytes), both in file order. Read with
    quantkit's subclass of gguf's reader: the same fields (tests/test_gguf_io.py compares them with stock
    gguf's), parsed without gguf's per-item recursion over the 151k-token vocabulary (~6 CPU-s a file)."""
    from gguf import GGUFValueType

    from quantkit.formats.gguf_io import _Reader

    r = _Reader(str(path), "r")
    kv = []
    for f in r.fields.values():
        if f.name.startswith("GGUF."):
            continue
        vtype = f.types[0].name
        value = f.contents()
        if f.types[0] == GGUFValueType.ARRAY:
            vtype += "/" + f.types[-1].name
            if len(value) > 16:
                value = {"len": len(value), "sha256": _digest(value)}
        kv.append([f.name, vtype, value])
    tensors = [[t.name, t.tensor_type.name, [int(d) for d in t.shape],
                hashlib.sha256(np.ascontiguousarray(t.data).view(np.uint8).tobytes()).hexdigest()]
               for t in r.tensors]
    return {"kv": kv, "tensors": tensors}
