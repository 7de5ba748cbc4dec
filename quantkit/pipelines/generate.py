"""Text generation: prompt in one batch, then one token at a time, streamed through a callback.

``generate(runner, prompt_ids, n_predict, sampler, on_token)`` stops at an end-of-generation token,
after ``n_predict`` tokens (-1: no limit), when the context is full, or on Ctrl-C -- in every case it
returns a ``Generation`` with the tokens and llama.cpp-style timings (the interruption is recorded,
not raised, so the caller can still print the timings).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from quantkit import interrupt
from quantkit.errors import ModelError
from quantkit.kernels import PREFILL_MIN_TOKENS
from quantkit.model.forward import BLAS_ATTENTION_MIN_TOKENS, Runner
from quantkit.model.sampling import Sampler


@dataclass
class Timings:
    load_s: float = 0.0
    n_prompt: int = 0
    prompt_s: float = 0.0
    n_eval: int = 0          # tokens run through the model after the prompt (llama.cpp's "runs")
    eval_s: float = 0.0
    n_sample: int = 0
    sample_s: float = 0.0
    total_s: float = 0.0

    @staticmethod
    def _line(label: str, seconds: float, n: int, unit: str) -> str:
        ms = seconds * 1e3
        if n:
            return (f"{label:>17} = {ms:10.2f} ms / {n:5d} {unit:<6} ({ms / n:8.2f} ms per token, "
                    f"{n / seconds if seconds > 0 else float('inf'):8.2f} tokens per second)")
        return f"{label:>17} = {ms:10.2f} ms / {n:5d} {unit}"

    def report(self) -> str:
        """The lines llama.cpp prints as llama_perf_sampler_print / llama_perf_context_print."""
        return "\n".join([
            self._line("sampling time", self.sample_s, self.n_sample, "runs"),
            f"{'load time':>17} = {self.load_s * 1e3:10.2f} ms",
            self._line("prompt eval time", self.prompt_s, self.n_prompt, "tokens"),
            self._line("eval time", self.eval_s, self.n_eval, "runs"),
            f"{'total time':>17} = {self.total_s * 1e3:10.2f} ms / {self.n_prompt + self.n_eval:5d} tokens",
        ])


@dataclass
class Generation:
    tokens: list[int] = field(default_factory=list)     # generated ids (the EOG token not included)
    stop: str = ""                                      # "eog", "length", "context" or "interrupted"
    timings: Timings = field(default_factory=Timings)


def check_prompt(n_prompt: int, n_ctx: int) -> None:
    if n_prompt == 0:
        raise ModelError("the prompt is empty (no tokens)")
    if n_prompt >= n_ctx:
        raise ModelError(f"the prompt is {n_prompt} tokens, too long for a context of {n_ctx} "
                         f"(raise -c, up to the model's trained length)")


def warm_up(runner: Runner, prompt_ids: Sequence[int]) -> None:
    """What llama.cpp's warmup run is for: a short batch of the prompt and one decode step compile (or
    load from numba's cache) the kernels of the prompt's path and of the per-token path, so that their
    cost counts as load time and not in the prompt's or the generation's tokens/s. The cache is cleared
    after. From ``PREFILL_MIN_TOKENS`` (products) and ``BLAS_ATTENTION_MIN_TOKENS`` (attention) tokens on
    a prompt takes the BLAS path whatever its length, so that many tokens load it."""
    warm = np.asarray(prompt_ids[:max(PREFILL_MIN_TOKENS, BLAS_ATTENTION_MIN_TOKENS)], dtype=np.int64)
    runner.forward(warm, 0, logits="last")
    if warm.size > 1:
        runner.forward(warm[:1], int(warm.size), logits="last")
    runner.reset()


def generate(runner: Runner, prompt_ids: Sequence[int], n_predict: int, sampler: Sampler,
             on_token: Callable[[int], None] | None = None,
             is_eog: Callable[[int], bool] | None = None, load_s: float = 0.0) -> Generation:
    """Run the prompt, then sample up to ``n_predict`` tokens (-1: until EOG or a full context)."""
    if n_predict < -1:
        raise ModelError(f"n_predict must be >= -1 (-1 = no limit), got {n_predict}")
    prompt = np.asarray(prompt_ids, dtype=np.int64).reshape(-1)
    check_prompt(prompt.size, runner.n_ctx)
    out = Generation(timings=Timings(load_s=load_s))
    tm = out.timings
    t_start = time.perf_counter()
    runner.reset()
    for t in prompt:
        sampler.accept(int(t))
    try:
        t0 = time.perf_counter()
        logits = runner.forward(prompt)
        tm.prompt_s = time.perf_counter() - t0
        tm.n_prompt = int(prompt.size)
        while True:
            if n_predict >= 0 and len(out.tokens) >= n_predict:
                out.stop = "length"
                break
            t0 = time.perf_counter()
            tok = sampler.sample(logits[-1])
            sampler.accept(tok)
            tm.sample_s += time.perf_counter() - t0
            tm.n_sample += 1
            if is_eog is not None and is_eog(tok):
                out.stop = "eog"
                break
            out.tokens.append(tok)
            if on_token is not None:
                on_token(tok)
            if n_predict >= 0 and len(out.tokens) >= n_predict:
                out.stop = "length"
                break
            if runner.n_past >= runner.n_ctx:
                out.stop = "context"
                break
            t0 = time.perf_counter()
            logits = runner.forward([tok])
            tm.eval_s += time.perf_counter() - t0
            tm.n_eval += 1
    except KeyboardInterrupt as e:
        interrupt.handled(e)
        out.stop = "interrupted"
    tm.total_s = time.perf_counter() - t_start + load_s
    return out

