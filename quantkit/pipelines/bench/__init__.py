"""``quantkit bench``: llama-bench's test matrix, procedure, statistic and printers.

What is reproduced (tools/llama-bench/llama-bench.cpp of the llama.cpp vendored with ggml 0.25.3):

* Lists: comma lists, repeated flags and ranges ``a-b``, ``a-b+step``, ``a-b*mult`` (parsed by the command
  line, ``quantkit.cli.lists``); the Cartesian product in llama-bench's loop order (model outermost, so it
  is reloaded as rarely as possible; each ``-p`` value a pp test, each ``-n`` value a tg test, each ``-pg``
  pair a combined test).
* Procedure per test: a fresh context of ``n_prompt + n_gen + n_depth`` positions; warmup (one prompt run
  for pp tests, one generated token for tg tests) unless ``no_warmup``; then per repetition: clear the KV
  cache, restore or compute the depth prefill (one cached depth state, reused as llama-bench does), start
  the timer, decode ``n_prompt`` random tokens in batches of ``n_batch``, generate ``n_gen`` tokens one at
  a time, stop the timer. Tokens are ``rand() % n_vocab`` from glibc's ``rand()`` with its default seed
  (1), continued over the whole run, with BOS first when the vocab adds BOS -- the very token ids
  llama-bench feeds on glibc. They are drawn just before the timer starts: the same sequence, no Python
  in the timed part but the forward calls.
* Statistic: per repetition ``t/s = (n_prompt + n_gen) * 1e9 / t_ns``; mean and sample stddev (n-1) with
  llama-bench's formula ``sqrt(sum(x^2)/(n-1) - mean^2*n/(n-1))`` (0 below two samples); ``avg_ns`` and
  ``stddev_ns`` in integer nanoseconds (exact integers here; llama-bench's uint64 square sum wraps when
  samples exceed ~1.9 s).
* Printers md/csv/json/jsonl/sql with llama-bench's fields, order, widths and quoting.

What differs, on purpose:

* ``build_commit`` is ``quantkit-<version>`` and ``build_number`` 0; ``backends`` is ``CPU``;
  ``type_k``/``type_v`` are ``f32`` (quantkit's KV cache is float32); the GPU/offload/fit fields hold
  llama-bench's defaults, which quantkit cannot change.
* Three fields after the reference ones (after ``samples_ts`` in json/jsonl): ``compile_s`` (time inside
  numba's compiler lock -- compiling or loading cached kernels -- during the test; it all happens in an
  untimed priming pass, never in t/s), ``peak_rss_mib`` (peak resident memory during the test: VmHWM
  after resetting it through /proc/self/clear_refs, else the process peak from getrusage) and
  ``rss_bound_mib`` (model file size + KV cache + ``RSS_OVERHEAD_MIB``, the bound the issue asks for).
  The peak covers the whole test: loading the model (the first test of a model), building its Runner,
  priming, warmup and the repetitions.
* The depth prefix is kept with the Runner's ``save_prefix`` / ``restore_prefix`` (a copy of the first
  positions of its K and V caches), where llama-bench uses ``llama_state_seq_get_data`` / ``_set_data``.

The modules, one concern each: ``params`` (the test matrix and its checks), ``glibc_rand``,
``model_desc`` (the model cell: description, size, parameter count), ``results`` (fields and statistic),
``printers``, ``host`` (default threads, CPU pinning, peak RSS, compile clock), ``session`` (the run, and
``bench_model(path)``: one file's pp and tg speed, for other pipelines).
"""

from __future__ import annotations

from quantkit.errors import BenchError
from quantkit.pipelines.bench.glibc_rand import GlibcRand
from quantkit.pipelines.bench.host import Affinity, CompileClock, cpu_info, default_threads, parse_cpu_mask
from quantkit.pipelines.bench.model_desc import ModelInfo, ftype_name, model_info, size_label
from quantkit.pipelines.bench.params import BenchParams, Instance, instances, validate
from quantkit.pipelines.bench.printers import (PRINTERS, CsvPrinter, JsonlPrinter, JsonPrinter, MarkdownPrinter,
                                               Printer, SqlPrinter, make_printer)
from quantkit.pipelines.bench.results import (ALL_FIELDS, EXTRA_FIELDS, FIELDS, RSS_OVERHEAD_MIB, TestResult,
                                              field_type, stats_ns, stats_ts)
from quantkit.pipelines.bench.session import BenchSession, ModelSpeed, bench_model, run_bench

__all__ = ["ALL_FIELDS", "Affinity", "BenchError", "BenchParams", "BenchSession", "CompileClock", "CsvPrinter",
           "EXTRA_FIELDS", "FIELDS", "GlibcRand", "Instance", "JsonPrinter", "JsonlPrinter", "MarkdownPrinter",
           "ModelInfo", "ModelSpeed", "PRINTERS", "Printer", "RSS_OVERHEAD_MIB", "SqlPrinter", "TestResult",
           "bench_model", "cpu_info", "default_threads", "field_type", "ftype_name",
           "instances", "make_printer", "model_info", "parse_cpu_mask", "run_bench", "size_label", "stats_ns",
           "stats_ts", "validate"]
