"""``quantize --optimize``: the same types as llama-quantize, better values inside each block.

1. **Calibration** (``collect_grams``): the source model runs ``chunks`` chunks of ``n_ctx`` tokens of
   calibration text (the built-in calibration half unless a file is given; chunked as llama-imatrix's),
   and every ``blk.*`` matrix product's input ``x`` adds ``x^T x`` to that weight's Gram matrix
   (float64). Products that share one input (q/k/v, gate/up) share one matrix.
2. **Per tensor** (``optimized_tensor``): a weight with a Gram matrix and a type in
   ``quants.gptq.SUPPORTED`` is quantized by ``quants.gptq.sweep`` (error compensation around the type's
   own codec; the method is explained there and in docs/optimize.md), and also as llama-quantize would;
   row by row, the one with the lower output error ``e H e^T`` is kept. Every other tensor (token_embd,
   3D expert tensors, a type not swept) is llama-quantize's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from quantkit.errors import QuantkitError

Log = Callable[[str], None]


class OptimizeError(QuantkitError):
    """A calibration that cannot run (too little text, a model quantkit cannot run)."""


@dataclass
class Grams:
    """Per weight name, its input Gram matrix ``sum x^T x`` (float64, shared between weights with one
    input) and the rows that made it."""

    mats: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)
    _factors: dict = field(default_factory=dict)

    def mean(self, name: str) -> np.ndarray | None:
        g = self.mats.get(name)
        return None if g is None else g / max(1, self.rows[name])

    def save(self, path, identity: dict) -> None:
        from quantkit.formats.gram import save_grams

        index: dict[int, int] = {}
        mats = []
        for m in self.mats.values():
            if id(m) not in index:
                index[id(m)] = len(mats)
                mats.append(m)
        names = {n: index[id(m)] for n, m in self.mats.items()}
        rows = [0] * len(mats)
        for n, i in names.items():
            rows[i] = self.rows[n]
        save_grams(path, names, mats, rows, identity)

    @classmethod
    def load(cls, path, identity: dict) -> "Grams":
        """The matrices saved in ``path``, refused in one line when another model, text or chunking made them."""
        from quantkit.formats.gram import load_grams

        names, mats, rows, saved = load_grams(path)
        if saved != identity:
            diff = ", ".join(f"{k} {saved.get(k)!r} there, {v!r} here" for k, v in identity.items() if saved.get(k) != v)
            raise OptimizeError(f"{path}: Gram matrices made otherwise ({diff}); remove it or give another file")
        g = cls()
        for n, i in names.items():
            g.mats[n] = mats[i]
            g.rows[n] = rows[i]
        return g

    def factor(self, name: str, qk: int, sub: int) -> np.ndarray:
        """``quants.gptq.factor`` of the weight's mean Gram matrix, made once per (input, block, step)."""
        from quantkit.kernels.mul_mat import blas_one_thread
        from quantkit.quants.gptq import factor

        key = (id(self.mats[name]), qk, sub)
        p = self._factors.get(key)
        if p is None:
            with blas_one_thread():  # the same P for any thread count
                p = self._factors[key] = factor(self.mean(name), qk, sub)
        return p


class GramCollector:
    """The runner's ``collect`` hook: ``x^T x`` of every ``blk.*`` product's input, in float64. A product
    whose input is the previous product's array (q, k, v; gate, up) shares that weight's matrix."""

    def __init__(self, grams: Grams):
        self.g = grams
        self._last: tuple[object, str] | None = None

    def __call__(self, name: str, x: np.ndarray, expert=None) -> None:
        from quantkit.kernels.mul_mat import blas_one_thread

        if expert is not None or not name.startswith("blk."):
            return
        g = self.g
        last, self._last = self._last, (x, name)
        shared = last is not None and last[0] is x and last[1] in g.mats
        if name not in g.mats:
            if shared:
                g.mats[name] = g.mats[last[1]]
                g.rows[name] = g.rows[last[1]]
                return
            g.mats[name] = np.zeros((x.shape[1], x.shape[1]), np.float64)
            g.rows[name] = 0
        elif shared and g.mats[name] is g.mats[last[1]]:
            return  # added already through the weight that shares this input
        xd = np.asarray(x, dtype=np.float64)
        with blas_one_thread():  # x^T x summed the same way for any thread count
            g.mats[name] += xd.T @ xd
        m = g.mats[name]
        for n in g.mats:  # every weight sharing the matrix counts the rows
            if g.mats[n] is m:
                g.rows[n] += x.shape[0]


def collect_grams(path, text_file: str | None, n_chunks: int, n_ctx: int, log: Log = lambda s: None,
                  on_chunk: Callable[[], None] = lambda: None, stats=None) -> Grams:
    """The Gram matrices of every ``blk.*`` weight over ``n_chunks`` chunks of ``n_ctx`` tokens.
    ``stats``: a file to read them from when it exists (made from the same model size, text, chunks and
    context), else to save them to."""
    import os

    from quantkit.pipelines import chunks as ch

    text, dataset = ch.read_text(text_file, "calibration")
    identity = {"model_size": os.path.getsize(path), "text": dataset, "chunks": n_chunks, "ctx": n_ctx}
    if stats is not None and os.path.exists(stats):
        log(f"optimize: Gram matrices from {stats}")
        return Grams.load(stats, identity)
    model, tok, runner = ch.open_for_chunks(path, n_ctx, n_ctx)
    grams = Grams()
    with model:
        tokens = ch.tokenize(tok, text, n_ctx, text_file or "the built-in calibration text")
        n = ch.count_chunks(tokens.size, n_ctx, n_chunks)
        log(f"optimize: calibration on {n} chunks of {n_ctx} tokens of {dataset}")
        runner.collect = GramCollector(grams)
        try:
            ch.run_chunks(runner, tokens, n_ctx, n, ch.add_bos_id(tok), "none", lambda i, out: on_chunk(),
                          check=model.gguf.check_unchanged, name="optimize")
        finally:
            runner.collect = None
    if stats is not None:
        grams.save(stats, identity)
        log(f"optimize: Gram matrices saved to {stats}")
    return grams


def optimized_tensor(job, grams: Grams, rows_f32: np.ndarray) -> tuple[np.ndarray, float] | None:
    """``job``'s bytes with compensation and the fraction of rows that took them, or None when the
    tensor is not swept (no Gram matrix, a 3D experts tensor, a type ``quants.gptq`` does not sweep).
    ``rows_f32``: the tensor's decoded float32 rows (n_rows, ne0)."""
    from quantkit.quants import traits
    from quantkit.quants.gptq import SUB_STEP, SUPPORTED, compensate

    h = grams.mean(job.src.name)
    if h is None or job.target not in SUPPORTED or len(job.src.shape) != 2:
        return None
    cls = traits(job.target)
    P = grams.factor(job.src.name, cls.block_size, SUB_STEP[job.target])
    data, taken = compensate(rows_f32, job.target, h, P, None if job.imatrix is None else job.imatrix[0])
    return data, float(np.mean(taken))
