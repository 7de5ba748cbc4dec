"""Golden per-tensor type tables from the real llama.cpp, for tests/test_policy.py.

Run with a Python that has llama-cpp-python's package (or its source tree on PYTHONPATH, with
LLAMA_CPP_LIB_PATH naming the folder of a libllama.so built from its vendored llama.cpp), numpy and
gguf -- never with quantkit's environment:

    python tools/make_policy_golden.py [--workdir DIR] [--only NAME]    # DIR: default a temporary one

For each model below it writes a tiny llama-architecture GGUF with gguf.GGUFWriter, runs
``llama_model_quantize`` for each case (ftype and options), reads the output's tensor types with
gguf.GGUFReader, and writes tests/data/policy/<model>.json. The type rules depend only on the
layer count, the head counts, the expert count, the tensor names and each tensor's row length ne0,
so the models keep the real ne0 values and the real layer/head/expert counts but have only a few
rows per tensor. This script does not import quantkit.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import gguf
import llama_cpp
from gguf import GGMLQuantizationType as T

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "tests" / "data" / "policy"
ROWS = 4  # ne1 of every 2-D tensor; the rules never look at it

FTYPE_IDS = {
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
    "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16,
    "Q5_K_M": 17, "Q6_K": 18, "IQ2_XXS": 19, "IQ2_XS": 20, "Q2_K_S": 21, "IQ3_XS": 22, "IQ3_XXS": 23,
    "IQ1_S": 24, "IQ4_NL": 25, "IQ3_S": 26, "IQ3_M": 27, "IQ2_S": 28, "IQ2_M": 29, "IQ4_XS": 30, "IQ1_M": 31,
    "BF16": 32, "TQ1_0": 36, "TQ2_0": 37, "MXFP4_MOE": 38, "Q1_0": 40,
}


def ggml_name(t: T) -> str:
    n = t.name.lower()
    return n[:-2] + "_K" if n.endswith("_k") else n


# --------------------------------------------------------------------------------------------
# Models: (name, description, metadata, tensors [(name, shape ne0-first)])
# --------------------------------------------------------------------------------------------


def llama_model(name, description, *, n_layer, n_embd, n_ff, n_head, n_head_kv, n_vocab_rows=ROWS,
                tied=False, n_expert=0, n_ff_exp=None, arch="llama"):
    n_kv_rows = ROWS
    meta = {
        "general.architecture": arch,
        f"{arch}.block_count": n_layer,
        f"{arch}.context_length": 256,
        f"{arch}.embedding_length": n_embd,
        f"{arch}.feed_forward_length": n_ff,
        f"{arch}.attention.head_count": n_head,
        f"{arch}.attention.head_count_kv": n_head_kv,
    }
    if arch == "falcon":
        meta["falcon.attention.layer_norm_epsilon"] = 1e-5
    else:
        meta[f"{arch}.attention.layer_norm_rms_epsilon"] = 1e-5
    if n_expert:
        meta[f"{arch}.expert_count"] = n_expert
        meta[f"{arch}.expert_used_count"] = 2
    tensors = [("token_embd.weight", [n_embd, n_vocab_rows]), ("output_norm.weight", [n_embd])]
    if not tied:
        tensors.append(("output.weight", [n_embd, n_vocab_rows]))
    for i in range(n_layer):
        p = f"blk.{i}."
        if arch == "falcon":  # fused qkv, no gate
            tensors += [
                (p + "attn_norm.weight", [n_embd]),
                (p + "attn_norm.bias", [n_embd]),
                (p + "attn_qkv.weight", [n_embd, ROWS]),
                (p + "attn_output.weight", [n_embd, ROWS]),
                (p + "ffn_up.weight", [n_embd, ROWS]),
                (p + "ffn_down.weight", [n_ff, ROWS]),
            ]
            continue
        tensors += [
            (p + "attn_norm.weight", [n_embd]),
            (p + "attn_q.weight", [n_embd, ROWS]),
            (p + "attn_k.weight", [n_embd, n_kv_rows]),
            (p + "attn_v.weight", [n_embd, n_kv_rows]),
            (p + "attn_output.weight", [n_embd, ROWS]),
            (p + "ffn_norm.weight", [n_embd]),
        ]
        if n_expert:
            ff = n_ff_exp or n_ff
            tensors += [
                (p + "ffn_gate_inp.weight", [n_embd, n_expert]),
                (p + "ffn_gate_exps.weight", [n_embd, ROWS, n_expert]),
                (p + "ffn_up_exps.weight", [n_embd, ROWS, n_expert]),
                (p + "ffn_down_exps.weight", [ff, ROWS, n_expert]),
            ]
        else:
            tensors += [
                (p + "ffn_gate.weight", [n_embd, ROWS]),
                (p + "ffn_up.weight", [n_embd, ROWS]),
                (p + "ffn_down.weight", [n_ff, ROWS]),
            ]
    return {"name": name, "description": description, "metadata": meta, "tensors": tensors}


MODELS = [
    llama_model("llama28_gqa2", "28-layer llama, 16 heads / 8 kv heads (GQA 2), n_embd 3072, n_ff 8192",
                n_layer=28, n_embd=3072, n_ff=8192, n_head=16, n_head_kv=8),
    llama_model("llama40_gqa5", "40-layer llama, 40 heads / 8 kv heads (GQA 5), n_embd 5120, n_ff 13824",
                n_layer=40, n_embd=5120, n_ff=13824, n_head=40, n_head_kv=8),
    llama_model("llama80_70b", "80-layer llama, 64 heads / 8 kv heads (the 70B type), n_embd 8192, n_ff 28672",
                n_layer=80, n_embd=8192, n_ff=28672, n_head=64, n_head_kv=8),
    llama_model("moe8", "32-layer llama MoE, 8 experts (Mixtral-like), 32/8 heads, n_embd 4096, n_ff 14336",
                n_layer=32, n_embd=4096, n_ff=14336, n_head=32, n_head_kv=8, n_expert=8),
    llama_model("moe4", "24-layer llama MoE, 4 experts, 16/16 heads, n_embd 2048, n_ff_exp 1408",
                n_layer=24, n_embd=2048, n_ff=1408, n_head=16, n_head_kv=16, n_expert=4),
    llama_model("tied16", "16-layer llama with tied embeddings (no output.weight), 32/8 heads, n_embd 2048",
                n_layer=16, n_embd=2048, n_ff=8192, n_head=32, n_head_kv=8, tied=True),
    llama_model("smollm2_135m", "SmolLM2-135M shapes: 30 layers, 9/3 heads, n_embd 576, n_ff 1536, tied",
                n_layer=30, n_embd=576, n_ff=1536, n_head=9, n_head_kv=3, tied=True),
    llama_model("odd100", "8-layer llama, n_embd 100 (not a multiple of 32), n_ff 256, 4/4 heads",
                n_layer=8, n_embd=100, n_ff=256, n_head=4, n_head_kv=4),
    llama_model("llama512", "8-layer llama, n_embd 512, n_ff 1408 (not a multiple of 256), 8/2 heads (GQA 4)",
                n_layer=8, n_embd=512, n_ff=1408, n_head=8, n_head_kv=2),
    llama_model("llama576", "12-layer llama, n_embd 576 (not a multiple of 256 or 128), n_ff 1536, 9/3 heads, "
                "untied", n_layer=12, n_embd=576, n_ff=1536, n_head=9, n_head_kv=3),
    llama_model("falcon32", "32-layer falcon (fused attn_qkv, no ffn_gate), 71/1 heads, n_embd 4544, n_ff 18176",
                n_layer=32, n_embd=4544, n_ff=18176, n_head=71, n_head_kv=1, arch="falcon"),
]

# Cases: (ftype, options). Options: pure, imatrix, output_tensor_type, token_embedding_type,
# tensor_types [(pattern, type)], leave_output_tensor.
COMMON = [
    ("Q4_K_M", {}), ("Q3_K_M", {}), ("Q2_K", {}), ("Q4_0", {}), ("Q4_0", {"imatrix": True}),
    ("Q6_K", {}), ("Q8_0", {}),
]
EXTRA = [
    ("Q3_K_S", {}), ("Q3_K_L", {}), ("Q4_K_S", {}), ("Q5_K_S", {}), ("Q5_K_M", {}),
    ("Q4_1", {}), ("Q5_0", {}), ("Q5_0", {"imatrix": True}), ("Q5_1", {}),
    ("Q2_K_S", {"imatrix": True}), ("IQ4_NL", {}), ("IQ4_NL", {"imatrix": True}), ("IQ4_XS", {}),
    ("F16", {}), ("BF16", {}), ("F32", {}),
]
OPTIONS = [
    ("Q4_K_M", {"pure": True}),
    ("Q4_K_M", {"tensor_types": [(r"blk\.0\.attn_v", "q8_0")]}),
    ("Q3_K_M", {"tensor_types": [(r"blk\.0\.attn_v", "q8_0"), (r"blk\.1\.ffn_down", "q6_k")]}),
    ("Q4_K_M", {"tensor_types": [(r"blk\.[0-3]\.ffn_down", "q4_k")]}),  # override equal to D
    ("Q4_K_M", {"tensor_types": [(r"attn_v", "q5_k"), (r"blk\.1\.attn_v", "q8_0")]}),  # first match wins
    ("Q4_K_M", {"pure": True, "tensor_types": [(r"attn_output", "q8_0")]}),
    ("Q4_K_M", {"output_tensor_type": "q8_0"}),
    ("Q4_K_M", {"token_embedding_type": "q8_0"}),
    ("Q4_K_M", {"output_tensor_type": "f16", "token_embedding_type": "q5_0"}),
    ("Q4_K_M", {"leave_output_tensor": True}),
    ("Q2_K", {"pure": True}),
    ("Q2_K_S", {}),  # needs an imatrix: llama.cpp refuses
    ("Q3_K_M", {"leave_output_tensor": True, "output_tensor_type": "q8_0"}),
    ("COPY", {}),
]
#: the 1- to 3-bit IQ, ternary, MXFP4 and Q1_0 file types (Q2_0 is left out: gguf-py 0.19.0 cannot read
#: the output back). The IQ1/IQ2 ones, and Q2_K_S, need an imatrix; each is also tried without one.
LOW_BIT = [
    ("IQ2_XXS", {"imatrix": True}), ("IQ2_XS", {"imatrix": True}), ("IQ2_S", {"imatrix": True}),
    ("IQ2_M", {"imatrix": True}), ("IQ1_S", {"imatrix": True}), ("IQ1_M", {"imatrix": True}),
    ("IQ3_XXS", {}), ("IQ3_XXS", {"imatrix": True}), ("IQ3_XS", {}), ("IQ3_S", {}), ("IQ3_M", {}),
    ("TQ1_0", {}), ("TQ2_0", {}), ("MXFP4_MOE", {}), ("Q1_0", {}),
]
REFUSED = [("IQ2_XXS", {}), ("IQ1_M", {}), ("IQ2_S", {"pure": True}), ("Q2_K_S", {})]
CASES = {
    "llama28_gqa2": COMMON + EXTRA + OPTIONS + LOW_BIT + REFUSED + [
        ("IQ2_XXS", {"imatrix": True, "pure": True}), ("IQ3_XS", {"tensor_types": [(r"attn_q", "q8_0")]}),
        ("IQ3_M", {"output_tensor_type": "q8_0", "token_embedding_type": "iq4_nl"})],
    "llama512": LOW_BIT + REFUSED,
    "llama576": LOW_BIT + REFUSED,
    "llama40_gqa5": COMMON + [("Q2_K_S", {"imatrix": True}), ("IQ4_NL", {}), ("IQ4_XS", {"imatrix": True}),
                              ("Q4_K_S", {}), ("Q5_K_M", {}), ("Q3_K_L", {})] + LOW_BIT,
    "llama80_70b": COMMON + [("Q3_K_S", {}), ("Q4_K_S", {}), ("Q2_K_S", {"imatrix": True})],
    "moe8": COMMON + [("Q3_K_S", {}), ("Q4_K_S", {}), ("Q5_K_M", {}), ("Q5_0", {"imatrix": True}),
                      ("Q4_K_M", {"tensor_types": [(r"blk\.0\.ffn_down", "q8_0")]})] + LOW_BIT,
    "moe4": [("Q4_K_M", {}), ("Q2_K", {}), ("Q3_K_M", {}), ("Q4_0", {"imatrix": True}), ("MXFP4_MOE", {}),
             ("IQ2_S", {"imatrix": True}), ("IQ3_M", {}), ("IQ1_S", {"imatrix": True})],
    "tied16": COMMON + LOW_BIT + [("Q4_K_M", {"output_tensor_type": "q5_k"}), ("Q4_K_M", {"pure": True}),
                        ("Q4_K_M", {"token_embedding_type": "q4_0"}),
                        ("Q4_K_M", {"pure": True, "output_tensor_type": "q8_0"})],
    "smollm2_135m": COMMON + LOW_BIT + [("Q4_K_S", {}), ("Q5_K_M", {}), ("Q3_K_L", {}), ("IQ4_XS", {}),
                              ("Q4_K_M", {"pure": True}), ("Q4_K_M", {"output_tensor_type": "q6_k"}),
                              ("Q6_K", {"pure": True}),
                              ("Q4_K_M", {"tensor_types": [(r"attn_q", "iq4_xs"), (r"attn_k", "q5_k"),
                                                           (r"blk\.0\.", "q3_k")]}),
                              ("Q8_0", {"tensor_types": [(r"blk\.0\.attn_q", "q8_k")]})],  # error
    "odd100": [("IQ2_XXS", {"imatrix": True}), ("IQ3_S", {}), ("TQ1_0", {}), ("MXFP4_MOE", {}), ("Q1_0", {}),
               ("Q4_K_M", {}), ("Q4_K_M", {"output_tensor_type": "f16"}), ("Q8_0", {}),
               ("Q4_0", {"output_tensor_type": "f16"}), ("F16", {}),
               ("Q4_K_M", {"output_tensor_type": "f16", "tensor_types": [(r"attn_q", "q8_0")]}),
               ("Q4_K_M", {"output_tensor_type": "f16", "tensor_types": [
                   (r"blk\.0\.attn_q", "iq4_nl"), (r"blk\.0\.attn_k", "q5_1"), (r"blk\.0\.ffn_up", "q2_k"),
                   (r"blk\.1\.attn_q", "q4_1"), (r"blk\.1\.attn_k", "iq4_xs")]}),
               ("Q8_0", {"tensor_types": [(r"blk\.0\.attn_q", "q1_0")]})],  # no fallback: error
    "falcon32": [("Q4_K_M", {}), ("Q3_K_M", {}), ("Q3_K_L", {}), ("Q4_K_S", {}), ("Q2_K", {}), ("Q6_K", {}),
                 ("Q5_K_M", {}), ("IQ3_XXS", {}), ("IQ3_M", {}), ("IQ2_M", {"imatrix": True})],
}


# --------------------------------------------------------------------------------------------
# Running llama.cpp
# --------------------------------------------------------------------------------------------

_LOG: list[str] = []


@llama_cpp.llama_log_callback
def _log_cb(level, text, user_data):  # noqa: ARG001
    _LOG.append(text.decode("utf-8", "replace"))


def write_model(model: dict, path: Path) -> None:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), model["metadata"]["general.architecture"])
    for key, value in model["metadata"].items():
        if key == "general.architecture":
            continue
        if isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_uint32(key, value)
    for name, shape in model["tensors"]:
        np_shape = tuple(reversed(shape))
        if len(shape) == 1:
            w.add_tensor(name, np.ones(np_shape, np.float32))
        else:
            w.add_tensor(name, rng.standard_normal(np_shape).astype(np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run_case(model: dict, src: Path, out: Path, ftype: str, opts: dict) -> dict:
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = 1
    params.ftype = FTYPE_IDS.get(ftype, 0)
    params.only_copy = ftype == "COPY"
    params.pure = bool(opts.get("pure", False))
    params.quantize_output_tensor = not opts.get("leave_output_tensor", False)
    if "output_tensor_type" in opts:
        params.output_tensor_type = int(T[opts["output_tensor_type"].upper()])
    if "token_embedding_type" in opts:
        params.token_embedding_type = int(T[opts["token_embedding_type"].upper()])
    keep = []  # keep ctypes buffers alive during the call
    if opts.get("tensor_types"):
        arr = (llama_cpp.llama_model_tensor_override * (len(opts["tensor_types"]) + 1))()
        for i, (pat, tname) in enumerate(opts["tensor_types"]):
            b = pat.encode()
            keep.append(b)
            arr[i].pattern = b
            arr[i].type = int(T[tname.upper()])
        arr[len(opts["tensor_types"])].pattern = None
        params.tt_overrides = arr
        keep.append(arr)
    if opts.get("imatrix"):
        entries = [(n, s) for n, s in model["tensors"] if len(s) >= 2]
        arr = (llama_cpp.llama_model_imatrix_data * (len(entries) + 1))()
        for i, (n, s) in enumerate(entries):
            size = s[0] * (s[2] if len(s) > 2 else 1)
            data = (ctypes.c_float * size)(*([1.0] * size))
            nb = n.encode()
            keep += [data, nb]
            arr[i].name = nb
            arr[i].data = ctypes.cast(data, ctypes.POINTER(ctypes.c_float))
            arr[i].size = size
        arr[len(entries)].name = None
        params.imatrix = arr
        keep.append(arr)
    if out.exists():
        out.unlink()
    _LOG.clear()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(out).encode(), ctypes.byref(params))
    log = "".join(_LOG)
    case = {"ftype": ftype, "options": opts}
    if rc != 0:
        m = re.search(r"failed to quantize: (.*)", log)
        lines = [l for l in log.splitlines() if "error" in l.lower()]
        case["error"] = (m.group(1).strip() if m else lines[-1].strip() if lines
                         else f"llama_model_quantize returned {rc}")
        return case
    reader = gguf.GGUFReader(str(out))
    got = {t.name: ggml_name(t.tensor_type) for t in reader.tensors}
    case["types"] = [got[n] for n, _ in model["tensors"]]
    m = re.search(r"WARNING: (\d+) of (\d+) tensor\(s\) required fallback", log)
    case["n_fallback"] = int(m.group(1)) if m else 0
    case["manual"] = sorted(set(re.findall(r"(\S+)\s+- applying manual override", log)))
    return case


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", help="where the tiny models and outputs go (default: a temporary directory, "
                    "removed at the end)")
    ap.add_argument("--only", action="append", help="model name(s) to regenerate")
    args = ap.parse_args()
    scratch = tempfile.TemporaryDirectory()  # removed at exit
    work = Path(args.workdir or scratch.name)
    work.mkdir(parents=True, exist_ok=True)
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p())
    version = llama_cpp.__version__
    for model in MODELS:
        if args.only and model["name"] not in args.only:
            continue
        src = work / f"{model['name']}.gguf"
        write_model(model, src)
        cases = []
        for ftype, opts in CASES[model["name"]]:
            case = run_case(model, src, work / "out.gguf", ftype, opts)
            print(model["name"], ftype, opts, "ERROR " + case["error"] if "error" in case
                  else f"ok, {case['n_fallback']} fallbacks", file=sys.stderr)
            cases.append(case)
        doc = {
            "model": model["name"],
            "description": model["description"],
            "made_with": f"llama-cpp-python {version}, llama_model_quantize, tools/make_policy_golden.py",
            "source_types": "2-D and 3-D tensors F16, 1-D tensors F32",
            "metadata": model["metadata"],
            "tensors": [[n, s] for n, s in model["tensors"]],
            "cases": cases,
        }
        path = OUT_DIR / f"{model['name']}.json"
        text = json.dumps(doc, separators=(",", ":"))
        # one case per line keeps diffs readable
        text = text.replace(',{"ftype"', ',\n{"ftype"').replace('"cases":[{', '"cases":[\n{')
        path.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
