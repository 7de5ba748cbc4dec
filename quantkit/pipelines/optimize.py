"""``quantize --optimize``: the same types as llama-quantize, better values inside each block.

1. **Calibration, a layer at a time** (``Calibration``): the chunks of calibration text (the built-in
   calibration half unless a file is given; chunked as llama-imatrix's) are embedded, then taken through
   the source model one layer at a time, all chunks through layer L before any goes on to L + 1 (the
   residual streams of all chunks are kept, ``chunks x n_ctx x n_embd`` float32). While layer L runs,
   every ``blk.L`` matrix product's input ``x`` adds ``x^T x`` to that weight's Gram matrix; products that
   share one input (q/k/v, gate/up) share one matrix. Only the layer being quantized has its Gram
   matrices in memory: peak memory is one layer's matrices, their factor and the residual streams.
2. **Per tensor** (``optimized_tensor``): a weight with a Gram matrix and a type in
   ``quants.gptq.SUPPORTED`` is quantized by ``quants.gptq.sweep`` (error compensation around the type's
   own codec; the method is explained there and in docs/optimize.md), and also as llama-quantize would;
   row by row, the one with the lower output error ``e H e^T`` is kept. Every other tensor (token_embd,
   3D expert tensors, a type not swept) is llama-quantize's bytes.
3. **Statistics kept and resumed** (``--optimize-stats DIR``): each layer's Gram matrices are saved to
   DIR as soon as they are complete, with the residual streams after that layer; a later run (or the
   same one interrupted and started again) reads the layers saved and goes on from the last.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from quantkit.errors import QuantkitError

Log = Callable[[str], None]

#: rows of a Gram matrix added per product (a tile of its lower triangle, one float32 product each)
GRAM_TILE = 512


class OptimizeError(QuantkitError):
    """A calibration that cannot run (too little text, a model quantkit cannot run)."""


def layer_of(name: str) -> int | None:
    """The layer index of a ``blk.N.*`` tensor name, else None."""
    parts = name.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() else None


@dataclass
class Grams:
    """Per weight name of one layer, its input Gram matrix ``sum x^T x`` (float32, shared between weights
    with one input) and the rows that made it."""

    mats: dict = field(default_factory=dict)
    rows: dict = field(default_factory=dict)
    _factors: dict = field(default_factory=dict)

    def distinct(self) -> tuple[dict[str, int], list[np.ndarray], list[int]]:
        """(name -> index, the distinct matrices, the rows of each)."""
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
        return names, mats, rows

    def finish(self) -> "Grams":
        """The sums complete: each matrix's lower triangle mirrored to its upper, in place, by row blocks."""
        for m in self.distinct()[1]:
            for i0 in range(0, m.shape[0], GRAM_TILE):
                i1 = min(m.shape[0], i0 + GRAM_TILE)
                m[i0:i1, i1:] = m[i1:, i0:i1].T
                blk = m[i0:i1, i0:i1]
                blk[...] = np.tril(blk) + np.tril(blk, -1).T
        return self

    @classmethod
    def of(cls, names: dict[str, int], mats: list[np.ndarray], rows: list[int]) -> "Grams":
        g = cls()
        for n, i in names.items():
            g.mats[n] = mats[i]
            g.rows[n] = rows[i]
        return g

    def factor(self, name: str, qk: int, sub: int):
        """``quants.gptq.factor`` of the weight's mean Gram matrix, its Cholesky factor made once per input;
        the Gram matrix itself is freed once factored (every later use goes through the factor)."""
        from quantkit.quants.gptq import factor, reverse_cholesky, reversed_gram

        group = self.rows[name], tuple(sorted(n for n in self.mats if self.mats[n] is self.mats[name]))
        key = (group, qk, sub)
        f = self._factors.get(key)
        if f is None:
            rc = self._factors.get(group)
            if rc is None:
                a = reversed_gram(self.mats[name], 1.0 / max(1, self.rows[name]))
                empty = np.zeros((0, 0), np.float32)   # the Gram matrix freed before the factorization:
                for n in group[1]:                     # an empty stand-in, the name known, its input shared
                    self.mats[n] = empty
                rc = self._factors[group] = reverse_cholesky(a)
                del a
            f = self._factors[key] = factor(None, qk, sub, rc=rc)
        return f


def add_gram(g: np.ndarray, x: np.ndarray) -> None:
    """``g``'s lower triangle += that of ``x^T x`` (``g`` float32 n x n, ``x`` float32 rows x n): tiles of
    ``GRAM_TILE`` rows, each one float32 product on one-thread BLAS, on the row threads (the same sums
    for any thread count)."""
    from quantkit.jit import blas_one_thread, run_tasks

    n = g.shape[0]

    def tile(i0: int, i1: int) -> None:
        g[i0:i1, :i1] += x[:, i0:i1].T @ x[:, :i1]

    with blas_one_thread():
        run_tasks([lambda a=i0: tile(a, min(n, a + GRAM_TILE)) for i0 in range(0, n, GRAM_TILE)])


class GramCollector:
    """The runner's ``collect`` hook: ``x^T x`` of every ``blk.*`` product's input. A product whose input
    is the previous product's array (q, k, v; gate, up) shares that weight's matrix."""

    def __init__(self, grams: Grams):
        self.g = grams
        self._last: tuple[object, str] | None = None

    def __call__(self, name: str, x: np.ndarray, expert=None) -> None:
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
            g.mats[name] = np.zeros((x.shape[1], x.shape[1]), np.float32)
            g.rows[name] = 0
        elif shared and g.mats[name] is g.mats[last[1]]:
            return  # added already through the weight that shares this input
        add_gram(g.mats[name], np.ascontiguousarray(x, dtype=np.float32))
        m = g.mats[name]
        for n in g.mats:  # every weight sharing the matrix counts the rows
            if g.mats[n] is m:
                g.rows[n] += x.shape[0]


class Calibration:
    """The Gram matrices of the ``blk.L`` weights, made when a weight of layer L is first asked for
    (``grams``), one layer at a time (module docstring); ``stats``: a directory to keep them in and read
    them from (``formats.gram``)."""

    def __init__(self, path, text_file: str | None, n_chunks: int, n_ctx: int, log: Log = lambda s: None,
                 stats=None):
        import os

        from quantkit.pipelines import chunks as ch

        text, dataset = ch.read_text(text_file, "calibration")
        self.identity = {"model_size": os.path.getsize(path), "text": dataset, "chunks": n_chunks, "ctx": n_ctx}
        self.log, self.stats = log, stats
        self.model, tok, self.runner = ch.open_for_chunks(path, n_ctx, n_ctx)
        try:
            tokens = ch.tokenize(tok, text, n_ctx, text_file or "the built-in calibration text")
            n = ch.count_chunks(tokens.size, n_ctx, n_chunks)
            self.inputs = [ch.chunk_input(tokens, i, n_ctx, ch.add_bos_id(tok)) for i in range(n)]
        except BaseException:
            self.model.close()
            raise
        self.n_layers = len(self.model.layers)
        self.layer, self.current = -1, Grams()   # the layer whose matrices are held
        self.hidden: np.ndarray | None = None     # residual streams (chunks, n_ctx, n_embd) after layer ...
        self.hidden_layer = -2                    # ... this one (-1: the embeddings; -2: not made yet)
        if stats is not None:
            from quantkit.formats.gram import open_store

            self.store = open_store(stats, self.identity)
        else:
            self.store = None
        log(f"optimize: calibration on {n} chunks of {n_ctx} tokens of {dataset}, a layer at a time")

    def close(self) -> None:
        self.current = Grams()
        self.hidden = None
        self.model.close()

    def grams(self, name: str) -> Grams | None:
        """The Grams of ``name``'s layer (None for a tensor outside the layers, or of a layer passed)."""
        L = layer_of(name)
        if L is None or L < self.layer or L >= self.n_layers:
            return None
        if L > self.layer:
            self.current = Grams()         # the previous layer's matrices and factors freed first
            self.current = self._layer(L)
            self.layer = L
        return self.current

    def _layer(self, L: int) -> Grams:
        if self.store is not None:
            saved = self.store.load_layer(L)
            if saved is not None:
                self.log(f"optimize: layer {L} statistics from {self.stats}")
                return Grams.of(*saved)
        self._streams_to(L - 1)
        t0, c0 = time.perf_counter(), time.process_time()
        g = Grams()
        self.runner.collect = GramCollector(g)
        try:
            self._run(L)
        finally:
            self.runner.collect = None
        g.finish()
        self.log(f"optimize: layer {L} statistics in {time.perf_counter() - t0:.1f} s "
                 f"({time.process_time() - c0:.1f} s CPU)")
        if self.store is not None:
            self.store.save_layer(L, *g.distinct(), self.hidden, L)
        return g

    def _streams_to(self, L: int) -> None:
        """The residual streams after layer L (-1: the embeddings), from the store's or by running the
        layers up to it."""
        if self.hidden_layer == L:
            return
        if self.store is not None and self.hidden_layer < L:
            saved = self.store.load_hidden(L)
            if saved is not None:
                self.hidden, self.hidden_layer = saved, L
                return
        if self.hidden is None or self.hidden_layer > L:
            r = self.runner
            n_ctx = self.inputs[0].size
            self.hidden = np.empty((len(self.inputs), n_ctx, self.model.config.n_embd), np.float32)
            for c, toks in enumerate(self.inputs):
                r.embed(toks, self.hidden[c])
            self.hidden_layer = -1
        while self.hidden_layer < L:
            self._run(self.hidden_layer + 1)

    def _run(self, L: int) -> None:
        """Every chunk's residual stream through layer L (positions from 0, batches of the runner's size)."""
        from quantkit.kernels.mul_mat import blas_limit

        r = self.runner
        with blas_limit():
            for c in range(self.hidden.shape[0]):
                x = self.hidden[c]
                for b0 in range(0, x.shape[0], r.n_batch):
                    r.run_layer(L, x[b0:b0 + r.n_batch], b0)
                self.model.gguf.check_unchanged()
        gg = self.model.gguf
        for t in gg.tensors:   # the layer's weights leave memory (the quantize reads its own mapping)
            if layer_of(t.name) == L:
                gg.release(t)
        self.hidden_layer = L


def optimized_tensor(job, calib: Calibration, rows_f32: np.ndarray) -> tuple[np.ndarray, float] | None:
    """``job``'s bytes with compensation and the fraction of rows that took them, or None when the
    tensor is not swept (no Gram matrix, a 3D experts tensor, a type ``quants.gptq`` does not sweep).
    ``rows_f32``: the tensor's decoded float32 rows (n_rows, ne0)."""
    from quantkit.quants import traits
    from quantkit.quants.gptq import SUB_STEP, SUPPORTED, compensate

    if job.target not in SUPPORTED or len(job.src.shape) != 2:
        return None
    grams = calib.grams(job.src.name)
    if grams is None or job.src.name not in grams.mats:
        return None
    cls = traits(job.target)
    F = grams.factor(job.src.name, cls.block_size, SUB_STEP[job.target])
    data, taken = compensate(rows_f32, job.target, F, None if job.imatrix is None else job.imatrix[0])
    return data, float(np.mean(taken))
