"""Importance-matrix collection and combining, as llama-imatrix (tools/imatrix/imatrix.cpp).

Collection: the forward pass calls ``Collector`` with the input ``x`` (rows, ne0) of every matrix
product that has at least 16 rows (``quantkit.model.forward.COLLECT_MIN_ROWS``). Products over
``blk.*`` weights, and ``output.weight`` with ``process_output``, add each column's sum of squares to
that weight's entry and the row count to its count; ``token_embd`` is a row lookup, never a product,
so it is never collected. Sums are accumulated in float64 (llama.cpp adds float32 products into
float32 one row at a time) and stored as float32.

Chunking and PPL follow ``compute_imatrix``: the text is tokenized once (BOS first if the vocab adds
it), ``--chunk N`` drops the first N chunks, at least ``2*n_ctx`` tokens must remain, each chunk runs
from an empty cache with BOS in its first position when the vocab adds BOS, and the running PPL is
computed on the second half of each chunk.

Saving: the chunk number is ``max(counts) // chunk_size`` (``chunk_size`` = the per-sequence context,
i.e. ``-c``); when it crosses a multiple of ``out_freq`` the output is saved, and a multiple of
``save_freq`` writes a snapshot ``<out>.at_<chunk>``. llama.cpp checks this inside the callback, so its
periodic files can hold a chunk for some tensors only; here it is checked after each whole chunk.
Every save is atomic (temporary file, then rename) and rounds the in-memory sums to the float32 the
file holds, so ``--resume`` continues a killed run from its last save to the uninterrupted run's bytes.

``--in-file`` loading reconstructs llama.cpp's raw form: GGUF sums and counts are added as they are;
a legacy ``.dat`` contributes ``value * chunk_size`` and ``ncall * chunk_size``.

``--show-statistics`` is ``quantkit.pipelines.imatrix_stats``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from quantkit.errors import FormatError, QuantkitError
from quantkit.formats.imatrix import (Entry, Imatrix, imatrix_gguf_output, load_imatrix, save_imatrix_dat,
                                     save_imatrix_gguf)
from quantkit.jit import njit_parallel, prange
from quantkit.pipelines.chunks import ChunkError, Log, chunk_targets, count_chunks, need_tokens, run_chunks
from quantkit.pipelines.perplexity import PerplexityResult, chunk_sums, nll_rows

class ImatrixError(QuantkitError):
    """A request llama-imatrix would refuse (mismatched files, weights missing from the model, ...)."""


# -- the accumulator ---------------------------------------------------------------------------

@dataclass
class Accumulator:
    """Raw sums (float64 [n_mat, ne0]) and counts (float64 [n_mat]) per weight name, plus datasets."""

    chunk_size: int
    sums: dict = field(default_factory=dict)
    counts: dict = field(default_factory=dict)
    datasets: list = field(default_factory=list)
    sources: dict = field(default_factory=dict)     # name -> file that first brought the entry

    def add_file(self, im: Imatrix) -> None:
        """llama-imatrix's ``load_imatrix``: accumulate one loaded file in raw form."""
        for name, e in im.entries.items():
            if im.legacy:
                s = e.sums.astype(np.float64) * self.chunk_size
                c = np.array([float(e.counts[0]) * self.chunk_size])
            else:
                s = e.sums.astype(np.float64)
                c = e.counts.astype(np.float64)
            have = self.sums.get(name)
            if have is None:
                self.sums[name] = s.copy()
                self.counts[name] = c.copy()
                self.sources[name] = im.source
                continue
            if have.size != s.size:
                raise ImatrixError(f"{im.source}: entry {name!r} has {s.shape[0]} x {s.shape[1]} values, but "
                                   f"{self.sources[name]} gave it {have.shape[0]} x {have.shape[1]}")
            if have.shape != s.shape:
                s = s.reshape(have.shape)
            have += s
            cc = self.counts[name]
            if cc.size == 1 and c.size > 1:
                cc = self.counts[name] = np.full(c.size, cc[0])
            elif c.size == 1 and cc.size > 1:
                c = np.full(cc.size, c[0])
            elif cc.size != c.size:
                raise ImatrixError(f"{im.source}: entry {name!r} has {c.size} counts, but "
                                   f"{self.sources[name]} gave it {cc.size}")
            cc += c
        self.datasets.extend(im.datasets)

    def last_chunk(self) -> int:
        mx = 0.0
        for c in self.counts.values():
            if c.size:
                mx = max(mx, float(c.max()))
        return int(mx) // self.chunk_size

    def fold(self) -> None:
        """Round the sums and counts to the float32 a saved file holds, so that the state after a save
        is the saved file (a run resumed from it continues bit for bit)."""
        for name in self.sums:
            self.sums[name] = self.sums[name].astype(np.float32).astype(np.float64)
            self.counts[name] = self.counts[name].astype(np.float32).astype(np.float64)

    def to_imatrix(self, datasets: list[str]) -> Imatrix:
        entries = {}
        for name in self.sums:
            s, c = self.sums[name], self.counts[name]
            # one count for several matrices (a 3D tensor's plain mul_mat): llama-imatrix saves their
            # sums as one row (n_mat = the counts' size)
            entries[name] = Entry((s if c.size == s.shape[0] else s.reshape(c.size, -1)).astype(np.float32),
                                  c.astype(np.float32))
        return Imatrix(entries, list(datasets), self.last_chunk(), self.chunk_size)


@njit_parallel
def _add_col_sumsq(x, out):
    """out[j] += sum over rows of x[r, j]^2 in float64, rows in order; prange over stripes of 64
    columns, so every column is summed by one thread in the same order for any thread count."""
    n, d = x.shape
    for s in prange((d + 63) // 64):
        c0 = s * 64
        c1 = min(d, c0 + 64)
        acc = np.zeros(c1 - c0, np.float64)
        for r in range(n):
            row = x[r, c0:c1]
            for j in range(c1 - c0):
                acc[j] += np.float64(row[j]) * np.float64(row[j])
        for j in range(c1 - c0):
            out[c0 + j] += acc[j]


class Collector:
    """The ``runner.collect`` hook: add sums of squares per input column for the selected weights.

    ``expert=(e, n_expert)``: the rows are the inputs of expert e of a 3D ``_exps`` tensor (ggml's
    mul_mat_id, which llama-imatrix collects whatever the batch size): they go to row e of the entry's
    (n_expert, n_cols) sums and to expert e's count, one per (token, slot) as llama-imatrix counts them;
    an expert no token chose keeps count 0 (``save`` reports the entry's partial data, and quantize
    decides what such a tensor gets, as llama-quantize).

    ``x`` of 3 dimensions (n_mat, rows, cols): the inputs of a 3D weight's plain mul_mat, one matrix per
    slice (MLA's per-head attn_k_b / attn_v_b): row m of the sums per slice and one count of ``rows``, as
    llama-imatrix keeps a dense 3D tensor's."""

    def __init__(self, acc: Accumulator, process_output: bool):
        self.acc = acc
        self.process_output = process_output
        self.rows_seen: dict[str, int] = {}

    def wanted(self, name: str) -> bool:
        return name.startswith("blk.") or (self.process_output and name == "output.weight")

    def __call__(self, name: str, x: np.ndarray, expert: tuple[int, int] | None = None) -> None:
        if not self.wanted(name):
            return
        if expert is not None:
            e, n_expert = expert
            s = self._entry(name, x.shape[1], n_expert)
            _add_col_sumsq(np.ascontiguousarray(x, dtype=np.float32), s[e])
            if not np.isfinite(s[e]).all():
                raise ImatrixError(f"non-finite values detected in {name}")
            self.acc.counts[name][e] += x.shape[0]
            self.rows_seen[name] = self.rows_seen.get(name, 0) + x.shape[0]
            return
        if x.ndim == 3:
            s = self._entry(name, x.shape[2], x.shape[0])
            for m in range(x.shape[0]):
                _add_col_sumsq(np.ascontiguousarray(x[m], dtype=np.float32), s[m])
            self._added(name, s, x.shape[1])
            return
        s = self._entry(name, x.shape[1])
        _add_col_sumsq(np.ascontiguousarray(x, dtype=np.float32), s[0])
        self._added(name, s, x.shape[0])

    def replay(self, name: str, rows: int, part: np.ndarray) -> None:
        """Add one product's float64 column sums made elsewhere (``Recorder``): ``_add_col_sumsq`` sums
        a call's rows from zero and then adds that to the entry, so this gives the same bits."""
        s = self._entry(name, part.size)
        s[0] += part
        self._added(name, s, rows)

    def _entry(self, name: str, n_cols: int, n_mat: int = 1) -> np.ndarray:
        """The entry's sums, (n_mat, n_cols): n_mat = the experts of a 3D tensor, else 1."""
        acc = self.acc
        s = acc.sums.get(name)
        if s is None:
            s = acc.sums[name] = np.zeros((n_mat, n_cols), np.float64)
            acc.counts[name] = np.zeros(n_mat, np.float64)
            acc.sources[name] = "this run"
        elif s.size != n_cols * n_mat:
            raise ImatrixError(f"inconsistent size for {name} ({s.size} loaded vs {n_cols * n_mat} in the model)")
        elif n_mat > 1:
            if s.shape != (n_mat, n_cols):
                s = acc.sums[name] = s.reshape(n_mat, n_cols)
            c = acc.counts[name]
            if c.size == 1:  # a loaded file's single count: one per expert (llama-imatrix's broadcast)
                acc.counts[name] = np.full(n_mat, c[0])
            elif c.size != n_mat:
                raise ImatrixError(f"inconsistent expert count for {name} ({c.size} loaded vs {n_mat})")
        return s

    def _added(self, name: str, s: np.ndarray, rows: int) -> None:
        acc = self.acc
        if not np.isfinite(s).all():
            raise ImatrixError(f"non-finite values detected in {name}")
        c = acc.counts[name]
        if c.size > 1 and (c == c[0]).all():
            c = acc.counts[name] = c[:1].copy()
        c += rows
        self.rows_seen[name] = self.rows_seen.get(name, 0) + rows


class Recorder(Collector):
    """A collector for one part of a split collection (``pipelines.cluster``): keeps, per chunk, every
    product's own column sums (float64, summed from zero as ``_add_col_sumsq`` does) instead of adding
    them up, so the merge can add them in the one-process run's order (``Collector.replay``)."""

    def __init__(self, process_output: bool):
        super().__init__(Accumulator(1), process_output)
        self.calls: list[tuple[str, int, np.ndarray]] = []

    def __call__(self, name: str, x: np.ndarray, expert: tuple[int, int] | None = None) -> None:
        if not self.wanted(name):
            return
        if expert is not None or x.ndim == 3:  # refused before any compute (check_collectable); never reached
            raise ImatrixError(f"{name}: a split collection cannot record expert or per-head products yet")
        part = np.zeros(x.shape[1], np.float64)
        _add_col_sumsq(np.ascontiguousarray(x, dtype=np.float32), part)
        self.calls.append((name, int(x.shape[0]), part))

    def take(self) -> list[tuple[str, int, np.ndarray]]:
        calls, self.calls = self.calls, []
        return calls


# -- saving ------------------------------------------------------------------------------------

@dataclass
class SaveOptions:
    out: str = "imatrix.gguf"
    fmt: str | None = None          # "gguf", "dat" or None (gguf, warning on a non-.gguf name)


def save(acc: Accumulator, datasets: list[str], opts: SaveOptions, snapshot: int = 0,
         log: Log | None = None) -> Path:
    """Write the accumulated data (atomically); ``snapshot`` > 0 writes ``<out>.at_<snapshot>``."""
    acc.fold()
    im = acc.to_imatrix(datasets)
    path = opts.out + (f".at_{snapshot}" if snapshot > 0 else "")
    if opts.fmt == "dat":
        p, stored = save_imatrix_dat(im, path)
        skipped = [n for n in sorted(im.entries) if not (im.entries[n].counts > 0).any()]
        if log:
            for n in skipped:
                log(f"save_imatrix: entry '{n:>40}' has no data - skipping")
            if stored < len(im.entries):
                log(f"save_imatrix: storing only {stored} out of {len(im.entries)} entries")
        return p
    if log:
        for n in sorted(im.entries):
            c = im.entries[n].counts
            zeros = int((c == 0).sum())
            if zeros:
                log(f"save_imatrix: entry '{n:>40}' has partial data ({100.0 * (c.size - zeros) / c.size:.2f}%)")
    return save_imatrix_gguf(im, path)


def planned_size(acc: Accumulator, model, process_output: bool, datasets: list[str], opts: SaveOptions) -> int | None:
    """The GGUF output's size once every collectable weight has data (None for the legacy format)."""
    if opts.fmt == "dat":
        return None
    entries = {n: Entry(np.zeros((1, s.shape[-1]), np.float32), np.zeros(1, np.float32)) for n, s in acc.sums.items()}
    for w in model.matrices():
        if w.name.startswith("blk.") or (process_output and w.name == "output.weight"):
            # a row of sums and a count per expert of a routed 3D tensor (mul_mat_id); one row of every
            # matrix's sums and one count for a plain 3D mul_mat (MLA's per-head attn_k_b / attn_v_b)
            n = w.n_expert if "_exps" in w.name else 1
            entries.setdefault(w.name, Entry(np.zeros((n, w.n_in * w.n_expert // n), np.float32),
                                             np.zeros(n, np.float32)))
    return imatrix_gguf_output(Imatrix(entries, list(datasets), 0, acc.chunk_size), opts.out).size


def check_output_name(opts: SaveOptions, log: Log) -> None:
    if opts.fmt is None and not opts.out.endswith(".gguf"):
        log("save_imatrix: saving imatrix using GGUF format with a different suffix than .gguf")
        log("save_imatrix: if you want the previous imatrix format, use --output-format dat")


def load_inputs(paths: list[str], chunk_size: int, log: Log | None = None) -> Accumulator:
    acc = Accumulator(chunk_size)
    for p in paths:
        if log:
            log(f"loading imatrix from '{p}'")
        acc.add_file(load_imatrix(p))
    return acc


# -- collection --------------------------------------------------------------------------------

@dataclass
class CollectOptions:
    n_ctx: int = 512
    n_batch: int = 2048
    n_chunks: int = -1
    from_chunk: int = 0
    out_freq: int = 10
    save_freq: int = 0
    process_output: bool = False
    compute_ppl: bool = True
    parse_special: bool = False


@dataclass
class CollectResult:
    n_chunk: int = 0
    n_tokens: int = 0
    seconds: float = 0.0
    first_pass_s: float = 0.0
    ppl: object = None                  # PerplexityResult when compute_ppl
    saves: list = field(default_factory=list)


def check_model_entries(acc: Accumulator, model, process_output: bool) -> None:
    """Continuing on loaded data: every loaded entry must be a weight of this model with the same
    number of input columns (llama.cpp would stop mid-run with 'inconsistent size')."""
    shapes = {w.name: w.n_in for w in model.matrices()}
    for name, s in acc.sums.items():
        if name not in shapes:
            raise ImatrixError(f"{acc.sources.get(name, '?')}: entry {name!r} names a weight that "
                               f"{model.path} does not have; is the imatrix from another model?")
        if s.shape[-1] != shapes[name]:
            raise ImatrixError(f"{acc.sources.get(name, '?')}: entry {name!r} has {s.shape[-1]} columns, but "
                               f"{model.path} has {shapes[name]} input columns for it")


def chunk_tokens(tokens: np.ndarray, opts: CollectOptions) -> tuple[np.ndarray, int]:
    """The tokens after ``--chunk`` and the number of chunks to run (llama-imatrix's checks)."""
    n_ctx = opts.n_ctx
    if opts.from_chunk > 0:
        if (opts.from_chunk + 2) * n_ctx >= tokens.size:
            raise ChunkError(f"there will be not enough tokens left after removing {opts.from_chunk} "
                             f"chunks ({tokens.size} tokens, context {n_ctx})")
        tokens = tokens[opts.from_chunk * n_ctx:]
    need_tokens(tokens, n_ctx, "the text")
    return tokens, count_chunks(tokens.size, n_ctx, opts.n_chunks)


def _logit_rows(opts: CollectOptions):
    if opts.process_output:
        return "all"
    return np.arange(opts.n_ctx // 2, opts.n_ctx - 1) if opts.compute_ppl else "none"


def _ppl_sums(logits: np.ndarray, tokens: np.ndarray, i: int, opts: CollectOptions) -> list:
    """One chunk's ``[sum nll, sum nll^2, count]`` over the second half of the chunk."""
    rows = logits[opts.n_ctx // 2:opts.n_ctx - 1] if opts.process_output else logits
    return chunk_sums(nll_rows(rows, chunk_targets(tokens, i, opts.n_ctx)))


class ChunkEnd:
    """What follows each chunk, in chunk order: the periodic saves (when the chunk number crosses a
    multiple of ``out_freq`` / ``save_freq``) and the running PPL."""

    def __init__(self, acc: Accumulator, datasets: list[str], opts: CollectOptions, save_opts: SaveOptions,
                 res: CollectResult, check: Callable[[], None] = lambda: None):
        self.acc, self.datasets, self.opts, self.save_opts, self.res, self.check = \
            acc, datasets, opts, save_opts, res, check
        self.last = acc.last_chunk()

    def __call__(self, ppl_sums: list | None) -> float | None:
        acc, opts, res = self.acc, self.opts, self.res
        res.n_tokens += opts.n_ctx
        now = acc.last_chunk()
        if now > self.last:
            step = now - self.last
            self.last = now
            self.check()              # nothing is saved from a model file that changed under the run
            if (now % opts.out_freq) // step == 0:
                res.saves.append(save(acc, self.datasets, self.save_opts))
            if opts.save_freq > 0 and (now % opts.save_freq) // step == 0:
                res.saves.append(save(acc, self.datasets, self.save_opts, snapshot=now))
        return None if res.ppl is None else res.ppl.add_sums(ppl_sums)


def check_collectable(model) -> None:
    """One line, before any compute, for a split collection (``collect_part``) of a MoE model: its
    ``Recorder`` does not keep expert products yet (one process, ``collect``, does)."""
    if getattr(model, "moe", False):
        raise ImatrixError(f"{model.path}: a split imatrix collection (--cluster) of a mixture-of-experts "
                           f"model is not supported yet (one process collects it)")


def collect(runner, tokens: np.ndarray, bos: int | None, acc: Accumulator, datasets: list[str],
            opts: CollectOptions, save_opts: SaveOptions, log: Log | None = None,
            on_chunk: Callable[[int, float | None], None] | None = None, start: int = 0,
            check: Callable[[], None] = lambda: None) -> CollectResult:
    """Evaluate the chunks with the collector hooked in; saves periodically as llama-imatrix.
    ``start``: chunks already in ``acc`` (a resumed run, see ``resume``)."""
    tokens, n_chunk = chunk_tokens(tokens, opts)
    res = CollectResult(n_chunk=n_chunk, ppl=PerplexityResult(opts.n_ctx, n_chunk) if opts.compute_ppl else None)
    end = ChunkEnd(acc, datasets, opts, save_opts, res, check)

    def chunk(i: int, logits: np.ndarray) -> None:
        value = end(_ppl_sums(logits, tokens, i, opts) if opts.compute_ppl else None)
        if on_chunk:
            on_chunk(i, value)

    runner.collect = Collector(acc, opts.process_output)
    try:
        times = run_chunks(runner, tokens, opts.n_ctx, n_chunk, bos, _logit_rows(opts), chunk, start=start, log=log,
                           check=check, name="imatrix")
    finally:
        runner.collect = None
    res.seconds, res.first_pass_s = times.seconds, times.first_pass_s
    return res


@dataclass
class ChunkPart:
    """One chunk collected apart (``collect_part``): each product's column sums and rows, in call order,
    and the chunk's PPL sums (None without PPL)."""
    index: int
    calls: list
    ppl_sums: list | None


def collect_part(runner, tokens: np.ndarray, bos: int | None, opts: CollectOptions, first: int,
                 end: int) -> list[ChunkPart]:
    """Chunks ``first .. end-1`` of a collection, each kept apart for ``merge_part`` (a split run)."""
    tokens, n_chunk = chunk_tokens(tokens, opts)
    if not 0 <= first < end <= n_chunk:
        raise ImatrixError(f"chunks {first}..{end - 1} are outside the run's {n_chunk} chunks")
    rec = Recorder(opts.process_output)
    parts: list[ChunkPart] = []

    def chunk(i: int, logits: np.ndarray) -> None:
        parts.append(ChunkPart(i, rec.take(), _ppl_sums(logits, tokens, i, opts) if opts.compute_ppl else None))

    check_collectable(runner.model)
    runner.collect = rec
    try:
        run_chunks(runner, tokens, opts.n_ctx, end, bos, _logit_rows(opts), chunk, start=first, name="imatrix")
    finally:
        runner.collect = None
    return parts


def merge_part(collector: Collector, end: ChunkEnd, part: ChunkPart) -> float | None:
    """Add one chunk collected apart, as ``collect`` adds it: its products in call order, then the chunk's
    saves and PPL. Given the chunks in order, the sums, counts, saves and PPL are the one-process run's,
    bit for bit."""
    for name, rows, sums in part.calls:
        collector.replay(name, rows, sums)
    return end(part.ppl_sums)


def resume(save_opts: SaveOptions, base: Accumulator, datasets: list[str], log: Log) -> tuple[Accumulator, int]:
    """``--resume``: the accumulator saved in ``-o`` and how many chunks of this run it holds.

    The saved file is the whole state: every save rounds the in-memory sums to the float32 the file
    holds (``Accumulator.fold``), so a run resumed from it ends with the uninterrupted run's bytes.
    ``base`` is what the ``--in-file``s gave; the saved file already contains it.
    """
    p = Path(save_opts.out)
    if not p.exists():
        log(f"resume: {p} does not exist yet; starting from the first chunk")
        return base, 0
    if save_opts.fmt == "dat":
        raise ImatrixError(f"{p}: --resume needs the GGUF format (a legacy .dat holds means, not the sums)")
    im = load_imatrix(p)
    if im.legacy:
        raise ImatrixError(f"{p}: --resume needs the GGUF format (a legacy .dat holds means, not the sums)")
    if im.chunk_size != base.chunk_size:
        raise ImatrixError(f"{p}: saved with chunks of {im.chunk_size} tokens, but -c is {base.chunk_size}")
    if im.datasets != datasets:
        raise ImatrixError(f"{p}: saved from datasets {im.datasets}, but this run has {datasets}; "
                           f"resume with the same text and --in-file options")
    done = im.chunk_count - base.last_chunk()
    if done < 0:
        raise ImatrixError(f"{p}: holds {im.chunk_count} chunks, fewer than the --in-file data alone")
    acc = Accumulator(base.chunk_size)
    acc.add_file(im)
    log(f"resume: {p} holds {done} chunk(s) of this run; continuing from chunk {done + 1}")
    return acc, done


# -- reports -----------------------------------------------------------------------------------

def coverage(acc: Accumulator, model, process_output: bool) -> list[str]:
    """Which of the model's collectable matrices have data, with how many tokens, and the input
    columns that were never activated (sum of squares exactly 0)."""
    expected = [w.name for w in model.matrices()
                if w.name.startswith("blk.") or (process_output and w.name == "output.weight")]
    have = [n for n in expected if n in acc.sums and (acc.counts[n] > 0).any()]
    lines = [f"coverage: {len(have)} of {len(expected)} collectable tensors have data"
             + ("" if not process_output or "output.weight" in expected
                else " (output.weight is tied to token_embd here: a row lookup, not collected)")]
    missing = [n for n in expected if n not in have]
    if missing:
        lines.append(f"coverage: no data for {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else ""))
    counts = sorted({int(acc.counts[n].max()) for n in have})
    if counts:
        lines.append("coverage: tokens per tensor: " + (f"{counts[0]}" if len(counts) == 1
                                                        else f"{counts[0]} .. {counts[-1]}"))
    dead_total = 0
    worst = []
    for n in have:
        dead = int((acc.sums[n] == 0).sum())
        if dead:
            dead_total += dead
            worst.append((dead, n, acc.sums[n].size))
    if dead_total:
        worst.sort(reverse=True)
        lines.append(f"coverage: {dead_total} input columns never activated, in {len(worst)} tensors: "
                     + ", ".join(f"{n} ({d}/{sz})" for d, n, sz in worst[:6]) + (" ..." if len(worst) > 6 else ""))
    else:
        lines.append("coverage: every input column of every collected tensor was activated")
    return lines


def combine(paths: list[str], chunk_size: int, datasets_extra: list[str] | None = None) -> tuple[Accumulator, list[str]]:
    """Load and accumulate ``--in-file``s (no text): the combine / convert mode."""
    if not paths:
        raise ImatrixError("no text and no --in-file to combine")
    acc = load_inputs(paths, chunk_size)
    return acc, list(acc.datasets) + list(datasets_extra or [])


def file_or_error(path: str) -> str:
    if not os.path.isfile(path):
        raise FormatError(f"{path}: no such imatrix file")
    return path
