"""Where a decode step's time goes: the compiled step run with some products skipped.

The step reads each matrix's row count from its table (``DecodeStep.wt`` / ``ot``); setting it to 0
skips that product (the other ops still run on whatever the buffers hold: the timing is what counts,
not the logits). Per configuration, ``--tokens`` steps at positions 0.. (wall and CPU ms per token,
best of ``--rounds``, the configurations interleaved in each round), so the difference of "full" and
"no X" is the cost of X inside the step, and "only X" (everything else skipped) beside it.

    .venv/bin/python benchmarks/bench_decode_parts.py \\
        llama-3.2-1b-Q4_K_M.gguf --threads 1
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from quantkit.jit import set_threads
from quantkit.model.decode import MATS
from quantkit.model.forward import Runner
from quantkit.model.llama import load

J = {name: j for j, name in enumerate(MATS)}
QKVO = [J["attn_q"], J["attn_k"], J["attn_v"], J["attn_output"]]
GATEUP = [J["ffn_gate"], J["ffn_up"]]
DOWN = [J["ffn_down"]]
#: name -> (matrices skipped, output product run)
CONFIGS = {
    "full": ([], True), "no output": ([], False), "no ffn_down": (DOWN, True),
    "no gate/up": (GATEUP, True), "no q/k/v/o": (QKVO, True), "no products": (QKVO + GATEUP + DOWN, False),
    "only q/k/v/o": (GATEUP + DOWN, False), "only gate/up": (QKVO + DOWN, False),
    "only ffn_down": (QKVO + GATEUP, False), "only output": (QKVO + GATEUP + DOWN, True),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    set_threads(args.threads)
    m = load(args.model)
    r = Runner(m, n_ctx=max(64, args.tokens + 1), type_kv="f16")
    st = r.step
    if st is None:
        raise SystemExit("this model has no compiled decode step")
    logits = np.empty(m.config.n_vocab, np.float32)
    wt0, ot0 = st.wt.copy(), st.ot.copy()

    def run(name):
        skip, want = CONFIGS[name]
        st.wt[:] = wt0
        st.ot[:] = ot0
        st.wt[:, skip, 2] = 0
        t0, c0 = time.perf_counter(), time.process_time()
        for p in range(args.tokens):
            st.run(1 + p, p, r._kc, r._vc, r.state, r.rope_cos, r.rope_sin, r._scores, logits, want)
        return (time.perf_counter() - t0) / args.tokens * 1e3, (time.process_time() - c0) / args.tokens * 1e3

    for name in CONFIGS:  # first token packs the x8 copies; one pass warms everything
        run(name)
    res = {n: [] for n in CONFIGS}
    for _ in range(args.rounds):
        for n in CONFIGS:
            res[n].append(run(n))
    st.wt[:] = wt0
    st.ot[:] = ot0
    print(f"{os.path.basename(args.model)}, {args.threads} thread(s), {args.tokens} tokens, load average "
          f"{os.getloadavg()[0]:.1f}; ms per token, best of {args.rounds}")
    print("| configuration | wall | CPU |\n| --- | ---: | ---: |")
    for n, v in res.items():
        print(f"| {n} | {min(w for w, _ in v):.2f} | {min(c for _, c in v):.2f} |")


if __name__ == "__main__":
    main()
