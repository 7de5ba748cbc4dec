"""Make tests/data/arch/<arch>-<variant>.npz from the real llama.cpp, for tests/test_arch.py.

Run under a reference venv that has numpy, gguf and llama-cpp-python (its Python package, here pointed
at a llama.cpp build of the same commit with LLAMA_CPP_LIB_PATH), never quantkit's:

    LLAMA_CPP_LIB_PATH=$QUANTKIT_LLAMA_CPP/build/bin PYTHONPATH=$QUANTKIT_LLAMA_CPP/../.. \\
        $QUANTKIT_LLAMA_PY tools/make_arch_golden.py [WORKDIR [NAME ...]]

(``$QUANTKIT_LLAMA_CPP/../..`` is the llama-cpp-python source the llama.cpp directory came from.)

For each tiny model of tests/archmodels.py (qwen2, qwen3, gemma3, the mixture-of-experts qwen3moe,
mixtral, qwen2moe and gpt-oss, and deepseek2 / deepseek2-lite with multi-head latent attention; the hybrids lfm2 and lfm2moe, short convolutions between attention layers; qwen3next with gated DeltaNet layers; variants F16 and Q; only the NAMEs given, when any), written to WORKDIR (default: a temporary
directory, removed at the end; "-" for that default with NAMEs) by the same function the tests call:

* ``ids``: N_EVAL token ids drawn with a fixed seed; ``logits``: llama.cpp's float32 logits of every
  position, the N_EVAL ids in one batch (n_ubatch 512).
* ``self_max`` / ``self_mean``: llama.cpp against itself -- the same ids one token at a time: the max and
  mean |logit difference| from its batch, its rounding noise on that file.
* ``greedy``: the first N_PROMPT ids as one batch, then N_GREEDY argmax tokens fed back one at a time;
  ``greedy_gap``: llama.cpp's top-2 logit gap at each step.
* ``sha256``: of the model file, so the tests know they run the file llama.cpp ran.

For the models of ``LONG`` (llama4, whose chunked attention llama.cpp fixes at 8192 positions whatever
the file says, and whose query temperature changes at position 8191) also <arch>-long-F16.npz: ``ids``,
N_LONG token ids drawn with a fixed seed, evaluated in one batch (n_ctx and n_batch LONG_CTX, n_ubatch
512); ``rows``: the last N_LONG_ROWS positions, across the first chunk's end; ``logits`` there.

It drives llama.cpp through tools/make_run_golden.py's ``Ref`` (the low-level API, use_extra_bufts =
false, 2 threads, flash attention and the KV cache type at their defaults: auto and f16).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import llama_cpp as L
import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
import archmodels  # noqa: E402
from make_run_golden import N_CTX, Ref, sha256  # noqa: E402  (n_ctx 1024, n_ubatch 512, 2 threads)

OUT_DIR = HERE.parent / "tests" / "data" / "arch"
N_EVAL = 48
N_PROMPT = 8
N_GREEDY = 16
SEED = 1234
#: the models whose long golden is made, and its length: 64 positions past llama4's 8192-position chunk
LONG = {"llama4": 8192 + 64}
LONG_CTX = 8448
N_LONG_ROWS = 128


def golden(path: Path, n_vocab: int) -> dict:
    rng = np.random.default_rng(SEED)
    ids = rng.integers(0, n_vocab - 3, N_EVAL)
    ref = Ref(path)
    batch = ref.eval(ids, all_logits=True)
    ref.reset()
    single = np.concatenate([ref.eval([t]) for t in ids])
    ref.reset()
    logits = ref.eval(ids[:N_PROMPT])[-1]
    greedy, gaps = [], []
    for _ in range(N_GREEDY):
        top = np.sort(logits)[-2:]
        greedy.append(int(np.argmax(logits)))
        gaps.append(float(top[1] - top[0]))
        logits = ref.eval([greedy[-1]])[-1]
    ref.close()
    d = np.abs(single - batch)
    print(f"{path.name}: self max {d.max():.2e} mean {d.mean():.2e}, greedy {greedy}", file=sys.stderr)
    return dict(ids=ids.astype(np.int32), logits=batch.astype(np.float32), self_max=np.float32(d.max()),
                self_mean=np.float32(d.mean()), greedy=np.array(greedy, np.int32),
                greedy_gap=np.array(gaps, np.float32), sha256=np.array(sha256(path)),
                made_by=np.array(f"tools/make_arch_golden.py, llama-cpp-python {L.__version__}, n_ctx {N_CTX}, "
                                 f"n_ubatch 512, 2 threads, use_extra_bufts=false"))


def long_golden(path: Path, n_vocab: int, n: int) -> dict:
    import make_run_golden

    make_run_golden.N_CTX = LONG_CTX     # Ref's n_ctx and n_batch: the whole sequence in one llama_decode
    ids = np.random.default_rng(SEED + 1).integers(0, n_vocab - 3, n)
    ref = Ref(path)
    logits = ref.eval(ids, all_logits=True)
    ref.close()
    make_run_golden.N_CTX = N_CTX
    rows = np.arange(n - N_LONG_ROWS, n)
    return dict(ids=ids.astype(np.int32), rows=rows.astype(np.int32), logits=logits[rows].astype(np.float32),
                sha256=np.array(sha256(path)),
                made_by=np.array(f"tools/make_arch_golden.py (long), llama-cpp-python {L.__version__}, n_ctx "
                                 f"{LONG_CTX}, n_batch {LONG_CTX}, n_ubatch 512, 2 threads, use_extra_bufts=false"))


def main() -> None:
    scratch = tempfile.TemporaryDirectory()  # removed at exit
    work = Path(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1] != "-" else Path(scratch.name)
    names = set(sys.argv[2:])
    L.llama_backend_init()
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for arch, spec in {**archmodels.SPECS, **archmodels.MOE_SPECS, **archmodels.MLA_SPECS,
                       **archmodels.DELTANET_SPECS}.items():
        if names and arch not in names:
            continue
        for variant in archmodels.VARIANTS:
            path = archmodels.write_model(work / f"tiny-{arch}-{variant}.gguf", arch, variant)
            np.savez_compressed(OUT_DIR / f"{arch}-{variant}.npz", **golden(path, spec["n_vocab"]))
            if arch in LONG and variant == "F16":
                np.savez_compressed(OUT_DIR / f"{arch}-long-{variant}.npz", **long_golden(path, spec["n_vocab"],
                                                                                          LONG[arch]))


if __name__ == "__main__":
    main()
