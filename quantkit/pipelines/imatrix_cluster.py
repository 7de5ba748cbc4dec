"""``quantkit imatrix --cluster ADDRESS``: one collection split by chunk ranges over a Dask cluster's
workers (``pipelines.cluster``), merged into the very file one process writes (docs/imatrix-perplexity.md).

Why the merge is exact. The one-process run (``pipelines.imatrix.collect``) keeps float64 sums: each
matrix product's rows are summed per column from zero (``_add_col_sumsq``) and that partial sum is then
added to the running sum, product after product, chunk after chunk; at every save the running sums are
rounded to the float32 the file holds (``Accumulator.fold``). Float addition is not associative, so
adding per-worker totals would differ in the last bits. Instead each job returns, per chunk, every
product's partial sums and row count (``collect_part``) -- each chunk runs from an empty cache, so its
activations are the same in any process -- and the merge adds them here in chunk order and call order
(``merge_part``), with the saves at the same chunks. The result is the one-process run's sums, counts,
saves and PPL, bit for bit; llama-imatrix's own float32 order (tools/imatrix/imatrix.cpp,
``IMatrixCollector::collect_imatrix``: ``e.values[j] += x*x`` row by row) is not reproduced by either.

A job holds its chunks' partial sums until it returns (per chunk: the collected weights' input columns
in float64, 1.1 MiB for SmolLM2-135M), so jobs are short ranges: by default two per worker.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from typing import Callable

import numpy as np

from quantkit.pipelines import chunks as ch
from quantkit.pipelines import cluster as cl
from quantkit.pipelines.imatrix import (Accumulator, ChunkEnd, ChunkPart, CollectOptions, CollectResult, Collector,
                                        ImatrixError, SaveOptions, chunk_tokens, collect_part, merge_part)
from quantkit.pipelines.perplexity import PerplexityResult


def tokens_digest(tokens: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i4").tobytes()).hexdigest()


def _range_job(model_path: str, text_file: str | None, opts: CollectOptions, first: int, end: int,
               digest: str) -> list[ChunkPart]:
    """On a worker: chunks ``first .. end-1``, each kept apart."""
    cl.worker_threads()
    text, _ = ch.read_text(text_file, "calibration")
    model, tok, runner = ch.open_for_chunks(model_path, opts.n_ctx, opts.n_batch)
    with model:
        tokens = ch.tokenize(tok, text, opts.n_ctx, text_file or "the built-in calibration text", opts.parse_special)
        if tokens_digest(tokens) != digest:
            raise ImatrixError(f"a worker read other tokens from {text_file or 'the built-in text'} than the "
                               f"coordinator: the text must be the same file on every machine")
        return collect_part(runner, tokens, ch.add_bos_id(tok), opts, first, end)


def collect_on_cluster(address: str, model_path: str | os.PathLike, text_file: str | None, tokens: np.ndarray,
                       acc: Accumulator, datasets: list[str], opts: CollectOptions, save_opts: SaveOptions, *,
                       start: int = 0, chunks_per_job: int | None = None,
                       on_chunk: Callable[[int, float | None], None] | None = None,
                       log: Callable[[str], None] = lambda s: None,
                       check: Callable[[], None] = lambda: None) -> CollectResult:
    """``collect`` with the chunks as jobs on the cluster at ``address``; ``tokens`` are the coordinator's
    own tokenization (each job checks it read the same). Saves, ``on_chunk`` and the result as
    ``collect``'s, in chunk order, as soon as the jobs before have returned."""
    _, n_chunk = chunk_tokens(tokens, opts)
    res = CollectResult(n_chunk=n_chunk, ppl=PerplexityResult(opts.n_ctx, n_chunk) if opts.compute_ppl else None)
    end = ChunkEnd(acc, datasets, opts, save_opts, res, check)
    collector = Collector(acc, opts.process_output)
    model_path = os.path.abspath(model_path)
    text_file = None if text_file is None else os.path.abspath(text_file)
    client = cl.connect(address)
    try:
        cl.check_storage(client, [p for p in (model_path, text_file) if p is not None])
        n_workers = max(1, len(client.scheduler_info()["workers"]))
        size = chunks_per_job or max(1, math.ceil((n_chunk - start) / (2 * n_workers)))
        digest = tokens_digest(tokens)
        jobs = {f"{a}-{min(a + size, n_chunk) - 1}": (model_path, text_file, opts, a, min(a + size, n_chunk), digest)
                for a in range(start, n_chunk, size)}
        log(f"compute_imatrix: {n_chunk - start} chunks as {len(jobs)} jobs on {n_workers} workers at {address}")
        waiting: dict[int, list[ChunkPart]] = {}
        nxt = start

        def on_result(key: str, parts: list[ChunkPart]) -> None:
            nonlocal nxt
            waiting[parts[0].index] = parts
            while nxt in waiting:
                for part in waiting.pop(nxt):
                    value = merge_part(collector, end, part)
                    if on_chunk:
                        on_chunk(part.index, value)
                    nxt = part.index + 1

        t0 = time.perf_counter()
        cl.run_jobs(client, _range_job, jobs, prefix="quantkit-imatrix", on_result=on_result)
        res.seconds = time.perf_counter() - t0
    finally:
        client.close()
    if nxt != n_chunk:
        raise ImatrixError(f"the cluster returned chunks up to {nxt - 1} of {n_chunk}")
    return res
