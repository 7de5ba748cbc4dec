"""Compile ahead of time what the commands compile on their first run (numba caches it on disk).

``warm_codecs`` runs every registered type's quantizer (ggml's reference path and, where the type has
one, the importance-weighted path) and dequantizer on a few blocks: what ``quantize`` and ``roundtrip``
compile. ``warm_model`` opens a model and runs ``run``'s own warm-up of a long prompt (a batch and one
decode step), batches of short prompts (their own product and attention kernels) and a scored batch
with every position's logits (``perplexity``'s path): what ``run``, ``bench`` and ``perplexity``
compile for that model's set of weight types (tests/test_warmup.py checks that they then load nothing).
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np

from quantkit.quants import TRAITS, dequantize, quantize, traits


def warm_codecs(types: Iterable | None = None, on_type: Callable[[str], None] | None = None) -> list[str]:
    """Quantize and dequantize two rows of 256 values with each type (every registered one by default)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 256), dtype=np.float32)
    w = rng.random(256, dtype=np.float32) + np.float32(0.5)
    done = []
    for t in (types if types is not None else TRAITS):
        tr = traits(t)
        if on_type:
            on_type(tr.qtype.name)
        if not tr.requires_imatrix:  # ggml has no reference path for IQ2_XXS, IQ2_XS, IQ1_S
            dequantize(quantize(x, tr.qtype), tr.qtype)
        if tr.uses_imatrix:
            dequantize(quantize(x, tr.qtype, imatrix=w), tr.qtype)
        done.append(tr.qtype.name)
    return done


def warm_model(path, n_ctx: int = 128) -> None:
    """Load ``path`` and run the kernels ``run`` / ``bench`` / ``perplexity`` use on it, then close it."""
    import quantkit.formats.sigbus  # noqa: F401  (the long jobs' SIGBUS handler: a cached cfunc, built on import)
    from quantkit.model.forward import PARALLEL_ATTENTION_MIN_TOKENS
    from quantkit.pipelines.generate import warm_up
    from quantkit.pipelines.loading import open_model
    from quantkit.pipelines.perplexity import nll_rows

    om = open_model(path, tokenizer=False)
    with om.model:
        n_ctx = min(n_ctx, om.model.config.n_ctx_train)
        runner = om.runner(n_ctx)
        ids = np.arange(1, n_ctx // 2 + 1, dtype=np.int64) % om.model.config.n_vocab
        warm_up(runner, ids)
        # prompts under BLAS_ATTENTION_MIN_TOKENS: per-token products and numba's attention, serial
        # under PARALLEL_ATTENTION_MIN_TOKENS tokens and parallel from there
        for n in (2, PARALLEL_ATTENTION_MIN_TOKENS):
            runner.forward(ids[:n], 0, logits="last")
            runner.reset()
        logits = runner.forward(ids, 0, logits="all")
        nll_rows(logits[:-1], ids[1:])
        runner.reset()
