"""The run: a session that loads each model once, primes, warms up and times every test in order
(llama-bench's procedure, described in this package's docstring), and ``run_bench`` around it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

import numpy as np

from quantkit.errors import BenchError, ModelError
from quantkit.pipelines.bench.glibc_rand import GlibcRand
from quantkit.pipelines.bench.host import Affinity, CompileClock, cpu_info, peak_rss_bytes, reset_peak_rss
from quantkit.pipelines.bench.model_desc import ModelInfo, model_info
from quantkit.pipelines.bench.params import BenchParams, Instance, instances, validate
from quantkit.pipelines.bench.printers import Printer
from quantkit.pipelines.bench.results import RSS_OVERHEAD_MIB, TestResult


Progress = Callable[[str], None]


@dataclass
class _Loaded:
    path: str
    model: Any      # loading.OpenModel
    info: ModelInfo
    add_bos: bool
    bos: int
    n_vocab: int
    primed: set = field(default_factory=set)


class BenchSession:
    """Runs instances one after the other, keeping the model loaded while consecutive tests share it."""

    def __init__(self, params: BenchParams, clock_ns: Callable[[], int] = time.perf_counter_ns,
                 progress: Progress | None = None, log: Progress | None = None):
        self.params = params
        self.clock_ns = clock_ns
        self.progress = progress or (lambda s: None)
        self.log = log or (lambda s: None)
        self.rand = GlibcRand(1)
        self.affinity = Affinity()
        self.cpu_info = cpu_info()
        self.loaded: _Loaded | None = None
        self.runner = None
        self.depth_state: tuple[str, int, np.ndarray, np.ndarray] | None = None  # (model, depth, K, V)
        self.compile_in_timed_s = 0.0

    # model ----------------------------------------------------------------------------------------
    def _load(self, path: str) -> _Loaded:
        if self.loaded is not None and self.loaded.path == path:
            return self.loaded
        self.close_model()
        from quantkit.pipelines.loading import open_model

        t0 = time.perf_counter()
        om = open_model(path, on_tokenizer_error=lambda e: self.log(f"{path}: tokenizer unreadable ({e}); no BOS"))
        tok, llama = om.tok, om.model
        add_bos, bos = False, 0
        if tok is not None:
            add_bos, bos = bool(tok.add_bos), (tok.bos_id if tok.bos_id is not None else 0)
        self.loaded = _Loaded(path, om, model_info(path, llama.gguf), add_bos, int(bos), llama.config.n_vocab)
        self.log(f"loaded {path} in {time.perf_counter() - t0:.2f} s: {self.loaded.info.desc}, "
                 f"add_bos={add_bos}, n_vocab={self.loaded.n_vocab}")
        return self.loaded

    def close_model(self) -> None:
        self.runner = None
        if self.loaded is not None:
            self.loaded.model.close()
            self.loaded = None

    # token draws, in llama-bench's order of rand() calls ------------------------------------------------
    def _prompt_tokens(self, n: int, n_batch: int) -> list[np.ndarray]:
        lm, chunks, done = self.loaded, [], 0
        while done < n:
            k = min(n - done, n_batch)
            t = np.empty(k, np.int64)
            t[0] = lm.bos if done == 0 and lm.add_bos else self.rand() % lm.n_vocab
            for j in range(1, k):
                t[j] = self.rand() % lm.n_vocab
            chunks.append(t)
            done += k
        return chunks

    def _gen_tokens(self, n: int) -> list[np.ndarray]:
        lm = self.loaded
        first = lm.bos if lm.add_bos else self.rand() % lm.n_vocab
        toks = [first] + [self.rand() % lm.n_vocab for _ in range(n)]  # one rand() after every decode
        return [np.array([t], np.int64) for t in toks[:n]]

    # the pieces of a test -------------------------------------------------------------------------------
    def _decode(self, chunks: list[np.ndarray]) -> None:
        fwd = self.runner.forward
        for c in chunks:
            fwd(c, logits="last")

    def _prime(self, inst: Instance) -> None:
        """Compile (or load from numba's cache) every kernel path the test will take, untimed: one forward
        of each distinct sub-batch size the test's prompt runs produce, and one single-token step."""
        sizes = set()
        for n in (inst.n_prompt, inst.n_depth):
            for c0 in range(0, n, inst.n_batch):
                c = min(inst.n_batch, n - c0)
                for u0 in range(0, c, inst.n_ubatch):
                    sizes.add(min(inst.n_ubatch, c - u0))
        if inst.n_gen:
            sizes.add(1)
        todo = sorted(sizes - self.loaded.primed)
        if not todo:
            return
        # the test's own runner (its context and batch hold every size): a second Runner would make a
        # second huge-page copy of the weights, and the timed one could then get fewer huge pages
        r = self.runner
        for s in todo:
            r.reset()
            r.forward(np.zeros(s, np.int64), logits="last")
        r.reset()
        self.loaded.primed.update(todo)

    def _depth(self, inst: Instance, rep: int) -> None:
        ds = self.depth_state
        R, i, n = self.params.reps, self._idx, self._count
        if ds is not None and ds[0] == inst.model and ds[1] == inst.n_depth:
            self.runner.restore_prefix(*ds[2:])
            self.progress(f"llama-bench: benchmark {i}/{n}: depth run {rep}/{R} (cached)")
            return
        self.progress(f"llama-bench: benchmark {i}/{n}: depth run {rep}/{R}")
        self._decode(self._prompt_tokens(inst.n_depth, inst.n_batch))
        self.depth_state = (inst.model, inst.n_depth, *self.runner.save_prefix(inst.n_depth))

    def run_test(self, inst: Instance, idx: int, count: int) -> TestResult:
        from quantkit.jit import set_threads
        from quantkit.model.forward import return_freed_memory

        self._idx, self._count = idx, count
        P = self.params
        self.progress(f"llama-bench: benchmark {idx}/{count}: starting")
        self.runner = None  # the previous test's buffers and KV cache go before this test's are made
        return_freed_memory()
        reset_peak_rss()
        lm = self._load(inst.model)
        try:
            self.runner = lm.model.runner(inst.n_ctx, n_batch=inst.n_ubatch)
        except ModelError as e:     # names the file
            raise BenchError(f"{inst.name}: {e}") from None
        kv_bytes = self.runner.key_cache.nbytes + self.runner.value_cache.nbytes
        result = TestResult(inst, lm.info, datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            self.cpu_info, rss_bound_mib=(lm.info.file_size + kv_bytes) / 2**20 + RSS_OVERHEAD_MIB)
        set_threads(inst.n_threads)
        self.affinity.apply(inst.cpu_mask, inst.cpu_strict)
        self.runner.reset()
        with CompileClock() as cc:
            self._prime(inst)
            self.affinity.apply(inst.cpu_mask, inst.cpu_strict)  # workers the first parallel call started
            if not P.no_warmup:
                if inst.n_prompt > 0:
                    self.progress(f"llama-bench: benchmark {idx}/{count}: warmup prompt run")
                    self._decode(self._prompt_tokens(inst.n_prompt, inst.n_batch))
                if inst.n_gen > 0:
                    self.progress(f"llama-bench: benchmark {idx}/{count}: warmup generation run")
                    self._decode(self._gen_tokens(1))
            compile_untimed = cc.total
            for rep in range(1, P.reps + 1):
                self.runner.reset()
                if inst.n_depth > 0:
                    self._depth(inst, rep)
                prompt = self._prompt_tokens(inst.n_prompt, inst.n_batch) if inst.n_prompt else []
                gen = self._gen_tokens(inst.n_gen) if inst.n_gen else []
                if prompt:
                    self.progress(f"llama-bench: benchmark {idx}/{count}: prompt run {rep}/{P.reps}")
                if gen:
                    self.progress(f"llama-bench: benchmark {idx}/{count}: generation run {rep}/{P.reps}")
                before = cc.total
                t0 = self.clock_ns()
                self._decode(prompt)
                self._decode(gen)
                t1 = self.clock_ns()
                if cc.total > before:
                    self.compile_in_timed_s += cc.total - before
                    self.log(f"warning: {inst.name}: {cc.total - before:.3f} s of numba compilation fell inside "
                             f"timed repetition {rep} (counted in its t/s)")
                result.samples_ns.append(max(1, t1 - t0))
        result.compile_s = compile_untimed
        result.peak_rss_mib = peak_rss_bytes() / 2**20
        over = result.peak_rss_mib - (lm.info.file_size + kv_bytes) / 2**20
        self.log(f"{inst.name}: compile {result.compile_s:.2f} s (untimed), peak RSS {result.peak_rss_mib:.1f} MiB "
                 f"= file {lm.info.file_size / 2**20:.1f} + KV {kv_bytes / 2**20:.1f} + {over:.1f} "
                 f"(bound: file + KV + {RSS_OVERHEAD_MIB} = "
                 f"{result.rss_bound_mib:.1f} MiB)")
        return result


def run_bench(params: BenchParams, printers: Iterable[Printer], progress: Progress | None = None,
              log: Progress | None = None, on_test: Callable[[TestResult], None] | None = None,
              session: BenchSession | None = None) -> list[TestResult]:
    """Header, every instance in order (each printed as it finishes), footer."""
    validate(params)
    printers = list(printers)
    insts = instances(params)
    s = session or BenchSession(params, progress=progress, log=log)
    for p in printers:
        p.header(params)
    results = []
    try:
        for k, inst in enumerate(insts, 1):
            r = s.run_test(inst, k, len(insts))
            results.append(r)
            for p in printers:
                p.test(r)
                p.out.flush()
            if on_test is not None:
                on_test(r)
    finally:
        s.close_model()
        s.affinity.restore()
    for p in printers:
        p.footer()
        p.out.flush()
    return results


@dataclass(frozen=True)
class ModelSpeed:
    """One model file's prompt and generation speed (mean t/s over the repetitions, and the sample
    stddev), with the two tests' full results."""

    pp_ts: float
    tg_ts: float
    pp_stddev: float
    tg_stddev: float
    results: tuple[TestResult, ...]


def bench_model(path: str, n_prompt: int = 512, n_gen: int = 128, reps: int = 5, threads: int | None = None,
                log: Progress | None = None) -> ModelSpeed:
    """``quantkit bench -m PATH -p n_prompt -n n_gen -r reps [-t threads]`` without a printer: the pp and
    tg speed of one model file (the entry point for other pipelines, e.g. a sweep that benches its files)."""
    if n_prompt < 1 or n_gen < 1:
        raise BenchError(f"bench_model needs a prompt and a generation test, got pp{n_prompt} tg{n_gen}")
    p = BenchParams(models=[str(path)], n_prompt=[n_prompt], n_gen=[n_gen], reps=reps)
    if threads:
        p.n_threads = [threads]
    pp, tg = run_bench(p, [], log=log)
    return ModelSpeed(pp.avg_ts, tg.avg_ts, pp.stdev_ts, tg.stdev_ts, (pp, tg))
