"""``quantkit bench``: llama-bench's test matrix, procedure, statistic and printers.

What is reproduced (tools/llama-bench/llama-bench.cpp of the llama.cpp vendored with ggml 0.25.3):

* Lists: comma lists, repeated flags and ranges ``a-b``, ``a-b+step``, ``a-b*mult`` (``parse_int_range``);
  the Cartesian product in llama-bench's loop order (model outermost, so it is reloaded as rarely as
  possible; each ``-p`` value a pp test, each ``-n`` value a tg test, each ``-pg`` pair a combined test).
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
* The Runner (quantkit.model.forward) has no state save/restore: the KV adapter at the end of this module
  copies the depth prefix of its caches and sets its position.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import product
from typing import Any, Callable, Iterable, TextIO

import numpy as np

from quantkit import __version__
from quantkit.errors import ModelError, QuantkitError
from quantkit.formats.ggml_types import ftype_label, guess_ftype

# -- parameters -------------------------------------------------------------------------------------


class BenchError(QuantkitError):
    """A bench request cannot be run (bad list, unreadable model, affinity refused)."""


_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?:([+*])(\d+))?)?(?:,|$)")


def parse_int_range(s: str) -> list[int]:
    """llama-bench's ``parse_int_range``: ``first[-last[(+|*)step]]``, comma-separated.

    ``"1-8*2"`` -> [1, 2, 4, 8]; ``"16-64+16,128"`` -> [16, 32, 48, 64, 128]. Raises ValueError."""
    out: list[int] = []
    rest = s
    while rest:
        m = _RANGE.match(rest)
        if m is None:
            break
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        op = m.group(3) or "+"
        step = int(m.group(4)) if m.group(4) is not None else 1
        i = first
        while i <= last:
            out.append(i)
            nxt = i + step if op == "+" else i * step
            if nxt <= i:
                raise ValueError(f"invalid range {m.group(0).rstrip(',')!r} (it never grows)")
            i = nxt
        rest = rest[m.end():]
    if rest or not s:
        raise ValueError(f"invalid range format {s!r} (expected N, N-M, N-M+STEP or N-M*MULT, comma-separated)")
    return out


def parse_bool_list(s: str) -> list[bool]:
    """``--cpu-strict 0,1``: each item 0 or 1."""
    out = []
    for item in s.split(","):
        if item.strip() not in ("0", "1"):
            raise ValueError(f"invalid boolean {item!r} in {s!r} (expected 0 or 1)")
        out.append(item.strip() == "1")
    return out


def parse_pair(s: str) -> tuple[int, int]:
    """``-pg PP,TG``."""
    parts = s.split(",")
    if len(parts) != 2:
        raise ValueError(f"invalid pair {s!r} (expected PP,TG)")
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(f"invalid pair {s!r} (expected two integers PP,TG)") from None
    if a < 0 or b < 0:
        raise ValueError(f"invalid pair {s!r} (negative token count)")
    return a, b


def parse_cpu_mask(s: str) -> set[int]:
    """ggml's ``parse_cpu_mask``: hex digits (optional ``0x``), bit i = CPU i; at most 128 digits."""
    body = s[2:] if s.startswith("0x") else s
    body = body[:128]
    if not body or any(c not in "0123456789abcdefABCDEF" for c in body):
        raise ValueError(f"invalid cpu mask {s!r} (expected hex digits, e.g. 0x3)")
    v = int(body, 16)
    return {i for i in range(v.bit_length()) if v >> i & 1}


def default_threads() -> int:
    """llama.cpp's ``common_cpu_get_num_math`` on Linux: one thread per physical core (distinct
    ``thread_siblings`` sets), else hardware threads (halved above 4)."""
    sib = set()
    cpu = 0
    while True:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings") as f:
                sib.add(f.read().strip())
        except OSError:
            break
        cpu += 1
    if sib:
        return len(sib)
    n = os.cpu_count() or 4
    return n if n <= 4 else n // 2


@dataclass
class BenchParams:
    """Every list is a test dimension; defaults are llama-bench's."""

    models: list[str] = field(default_factory=list)
    n_prompt: list[int] = field(default_factory=lambda: [512])
    n_gen: list[int] = field(default_factory=lambda: [128])
    n_pg: list[tuple[int, int]] = field(default_factory=list)
    n_depth: list[int] = field(default_factory=lambda: [0])
    n_batch: list[int] = field(default_factory=lambda: [2048])
    n_ubatch: list[int] = field(default_factory=lambda: [512])
    n_threads: list[int] = field(default_factory=lambda: [default_threads()])
    cpu_mask: list[str] = field(default_factory=lambda: ["0x0"])
    cpu_strict: list[bool] = field(default_factory=lambda: [False])
    reps: int = 5
    no_warmup: bool = False
    progress: bool = False
    verbose: bool = False

    def non_default(self, name: str) -> bool:
        """llama-bench shows a md column when several values or a non-default value were given."""
        v = getattr(self, name)
        return len(v) > 1 or v != getattr(BenchParams(), name)


@dataclass(frozen=True)
class Instance:
    model: str
    n_prompt: int
    n_gen: int
    n_depth: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    cpu_mask: str
    cpu_strict: bool

    @property
    def n_ctx(self) -> int:
        return self.n_prompt + self.n_gen + self.n_depth

    @property
    def name(self) -> str:
        if self.n_prompt > 0 and self.n_gen == 0:
            s = f"pp{self.n_prompt}"
        elif self.n_gen > 0 and self.n_prompt == 0:
            s = f"tg{self.n_gen}"
        else:
            s = f"pp{self.n_prompt}+tg{self.n_gen}"
        return s + (f" @ d{self.n_depth}" if self.n_depth > 0 else "")


def instances(p: BenchParams) -> list[Instance]:
    """llama-bench's ``get_cmd_params_instances``: the loops nest model, n_batch, n_ubatch, threads,
    cpu_mask, cpu_strict, depth (the parameters quantkit varies), then pp, tg and pg tests."""
    out = []
    for m, nb, nub, nt, cm, cs, nd in product(p.models, p.n_batch, p.n_ubatch, p.n_threads, p.cpu_mask,
                                              p.cpu_strict, p.n_depth):
        base = dict(model=m, n_depth=nd, n_batch=nb, n_ubatch=nub, n_threads=nt, cpu_mask=cm, cpu_strict=cs)
        out += [Instance(n_prompt=n, n_gen=0, **base) for n in p.n_prompt if n != 0]
        out += [Instance(n_prompt=0, n_gen=n, **base) for n in p.n_gen if n != 0]
        out += [Instance(n_prompt=a, n_gen=b, **base) for a, b in p.n_pg if (a, b) != (0, 0)]
    return out


def validate(p: BenchParams) -> None:
    """Checks llama-bench leaves to crashes; raises BenchError with one line."""
    import numba

    top = numba.config.NUMBA_NUM_THREADS
    if p.reps < 1:
        raise BenchError(f"repetitions must be >= 1, got {p.reps}")
    for nt in p.n_threads:
        if nt < 1 or nt > top:
            raise BenchError(f"threads {nt} is outside 1..{top} (numba's NUMBA_NUM_THREADS; set that "
                             f"environment variable to allow more)")
    for name in ("n_batch", "n_ubatch"):
        for v in getattr(p, name):
            if v < 1:
                raise BenchError(f"{name} must be >= 1, got {v}")
    for cm in p.cpu_mask:
        try:
            parse_cpu_mask(cm)
        except ValueError as e:
            raise BenchError(str(e)) from None
    for m in p.models:
        if not os.path.isfile(m):
            raise BenchError(f"{m}: no such model file" if not os.path.exists(m) else f"{m}: not a file")


# -- the C library's rand() -------------------------------------------------------------------------


class GlibcRand:
    """glibc's ``rand()`` (the TYPE_3 additive generator, r[i] = r[i-3] + r[i-31]) from ``srand(seed)``;
    llama-bench never seeds, so its sequence starts from seed 1."""

    def __init__(self, seed: int = 1):
        r = [0] * 34
        r[0] = seed & 0xFFFFFFFF or 1
        for i in range(1, 31):
            hi, lo = divmod(r[i - 1] if r[i - 1] < 2**31 else r[i - 1] - 2**32, 127773)
            word = 16807 * lo - 2836 * hi
            r[i] = (word + 2147483647 if word < 0 else word) & 0xFFFFFFFF
        for i in range(31, 34):
            r[i] = r[i - 31]
        self._r = r[-34:]
        for _ in range(310):
            self._next()

    def _next(self) -> int:
        r = self._r
        v = (r[-31] + r[-3]) & 0xFFFFFFFF
        r.append(v)
        del r[0]
        return v

    def __call__(self) -> int:
        return self._next() >> 1


# -- the model cell, size and parameter count --------------------------------------------------------

def ftype_name(meta: dict[str, Any], tensor_types: list[tuple[str, str]]) -> str:
    """``general.file_type`` when present, else guessed like llama.cpp (prefixed "(guessed) ")."""
    if "general.file_type" in meta:
        return ftype_label(int(meta["general.file_type"]))

    def key(item):  # weights_map's order: layer number (-1 outside blk.N.), then name
        m = re.match(r"blk\.(-?\d+)\.", item[0])
        return (int(m.group(1)) if m else -1, item[0].encode())

    return "(guessed) " + guess_ftype(t for _, t in sorted(tensor_types, key=key)).label


def size_label(meta: dict[str, Any]) -> str:
    """llama.cpp's ``llm_type_name`` as each architecture's ``load_arch_hparams`` sets it (src/models/
    llama.cpp, qwen2.cpp, qwen3.cpp, gemma3.cpp), "?B" when unknown."""
    arch = str(meta.get("general.architecture", ""))
    n_layer = int(meta.get(f"{arch}.block_count", 0) or 0)
    n_embd = int(meta.get(f"{arch}.embedding_length", 0) or 0)
    n_head = int(meta.get(f"{arch}.attention.head_count", 0) or 0)
    if arch == "qwen2":
        return {24: "0.5B" if n_embd == 1024 else "1B", 28: "1.5B" if n_embd == 1536 else "7B", 32: "7B",
                36: "3B", 40: "4B" if n_head == 20 else "13B", 48: "14B", 64: "32B", 80: "70B"}.get(n_layer, "?B")
    if arch == "qwen3":
        return {28: "0.6B" if n_embd == 1024 else "1.7B", 36: "4B" if n_embd == 2560 else "8B", 40: "14B",
                64: "32B"}.get(n_layer, "?B")
    if arch == "gemma3":
        return {18: "270M", 26: "1B", 32: "8B", 34: "4B", 48: "12B", 62: "27B"}.get(n_layer, "?B")
    if arch != "llama":
        return "?B"
    n_expert = int(meta.get(f"{arch}.expert_count", 0) or 0)
    n_vocab = meta.get(f"{arch}.vocab_size")
    if n_vocab is None:
        n_vocab = len(meta.get("tokenizer.ggml.tokens", []) or [])
    n_head_kv = int(meta.get(f"{arch}.attention.head_count_kv", n_head) or 0)
    if n_expert == 8:
        return {32: "8x7B", 56: "8x22B"}.get(n_layer, "?B")
    if n_layer == 32:
        return "3B" if n_vocab == 49152 else ("7B" if n_vocab < 40000 else "8B")
    if n_layer == 80:
        return "65B" if n_head == n_head_kv else "70B"
    return {16: "1B", 22: "1B", 26: "3B", 28: "3B", 30: "256M", 36: "8B", 40: "13B", 48: "34B",
            60: "30B"}.get(n_layer, "?B")


@dataclass(frozen=True)
class ModelInfo:
    filename: str
    desc: str       # llama_model_desc: "<arch> <size label> <file type>"
    size: int       # bytes of all tensors (llama_model_size)
    n_params: int   # elements of all tensors (llama_model_n_params)
    file_size: int


def model_info(path: str, gg) -> ModelInfo:
    """From an open ``GGUFModel``."""
    meta = gg.metadata
    arch = str(meta.get("general.architecture", "")) or "unknown"
    ft = ftype_name(meta, [(t.name, t.type.name) for t in gg.tensors])
    return ModelInfo(path, f"{arch} {size_label(meta)} {ft}", sum(t.nbytes for t in gg.tensors),
                     sum(t.n_elements for t in gg.tensors), int(gg.file_size))


# -- one test's result, its fields and statistics ---------------------------------------------------

FIELDS = [
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
    "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads", "cpu_mask", "cpu_strict", "poll",
    "type_k", "type_v", "n_gpu_layers", "n_cpu_moe", "split_mode", "main_gpu", "no_kv_offload", "flash_attn",
    "devices", "tensor_split", "tensor_buft_overrides", "load_mode", "lazy_mode", "embeddings",
    "no_op_offload", "no_host", "repack", "fit_target", "fit_min_ctx", "n_prompt", "n_gen", "n_depth",
    "test_time", "avg_ns", "stddev_ns", "avg_ts", "stddev_ts",
]
EXTRA_FIELDS = ["compile_s", "peak_rss_mib", "rss_bound_mib"]
#: MiB over the model file and the KV cache that a test's peak RSS may reach (issue #13's bound)
RSS_OVERHEAD_MIB = 150
ALL_FIELDS = FIELDS + EXTRA_FIELDS

_INT = {"build_number", "n_batch", "n_ubatch", "n_threads", "poll", "model_size", "model_n_params",
        "n_gpu_layers", "main_gpu", "n_prompt", "n_gen", "n_depth", "avg_ns", "stddev_ns", "no_op_offload",
        "n_cpu_moe", "fit_target", "fit_min_ctx", "flash_attn"}
_BOOL = {"no_kv_offload", "cpu_strict", "embeddings", "no_host", "repack"}
_FLOAT = {"avg_ts", "stddev_ts", "compile_s", "peak_rss_mib", "rss_bound_mib"}


def field_type(name: str) -> str:
    return "INT" if name in _INT else "BOOL" if name in _BOOL else "FLOAT" if name in _FLOAT else "STRING"


def _avg(v):
    return sum(v) / len(v) if v else 0


def _stdev(v, mean):
    """llama-bench's ``stdev``: sqrt(sum(x^2)/(n-1) - mean^2*n/(n-1)), 0 for fewer than two samples."""
    n = len(v)
    if n <= 1:
        return 0.0
    return math.sqrt(max(0.0, sum(x * x for x in v) / (n - 1) - mean * mean * n / (n - 1)))


def stats_ns(samples_ns: list[int]) -> tuple[int, int]:
    """(avg_ns, stddev_ns) in llama-bench's integer arithmetic (without its uint64 wraparound)."""
    n = len(samples_ns)
    if not n:
        return 0, 0
    mean = sum(samples_ns) // n
    if n == 1:
        return mean, 0
    var = sum(t * t for t in samples_ns) // (n - 1) - mean * mean * n // (n - 1)
    return mean, int(math.sqrt(max(0, var)))


def stats_ts(samples_ns: list[int], n_tokens: int) -> tuple[list[float], float, float]:
    """(per-repetition t/s, mean, sample stddev)."""
    ts = [1e9 * n_tokens / t for t in samples_ns]
    mean = _avg(ts)
    return ts, float(mean), _stdev(ts, mean)


def cpu_info() -> str:
    """The CPU's brand string, as ggml's CPU backend describes the device."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "CPU"


@dataclass
class TestResult:
    inst: Instance
    model: ModelInfo
    test_time: str
    cpu_info: str
    samples_ns: list[int] = field(default_factory=list)
    compile_s: float = 0.0
    peak_rss_mib: float = 0.0
    rss_bound_mib: float = 0.0

    @property
    def samples_ts(self) -> list[float]:
        return stats_ts(self.samples_ns, self.inst.n_prompt + self.inst.n_gen)[0]

    @property
    def avg_ts(self) -> float:
        return stats_ts(self.samples_ns, self.inst.n_prompt + self.inst.n_gen)[1]

    @property
    def stdev_ts(self) -> float:
        return stats_ts(self.samples_ns, self.inst.n_prompt + self.inst.n_gen)[2]

    def values(self) -> list[str]:
        """Every field of ALL_FIELDS as llama-bench's ``get_values`` renders it (std::to_string)."""
        i, m = self.inst, self.model
        avg_ns, sd_ns = stats_ns(self.samples_ns)
        b = lambda x: "1" if x else "0"  # noqa: E731
        return [
            f"quantkit-{__version__}", "0", self.cpu_info, "", "CPU", m.filename, m.desc, str(m.size),
            str(m.n_params), str(i.n_batch), str(i.n_ubatch), str(i.n_threads), i.cpu_mask, b(i.cpu_strict), "50",
            "f32", "f32", "-1", "0", "layer", "0", b(False), "-1", "auto", "0.00", "none", "auto", "auto",
            b(False), "0", b(False), b(False), "0", "0", str(i.n_prompt), str(i.n_gen), str(i.n_depth),
            self.test_time, str(avg_ns), str(sd_ns), f"{self.avg_ts:f}", f"{self.stdev_ts:f}",
            f"{self.compile_s:f}", f"{self.peak_rss_mib:f}", f"{self.rss_bound_mib:f}",
        ]

    def as_dict(self) -> dict[str, str]:
        return dict(zip(ALL_FIELDS, self.values()))


# -- printers ---------------------------------------------------------------------------------------


def _g(x: float) -> str:
    """A double through std::ostream's default format (%g, 6 significant digits)."""
    return f"{x:g}"


class Printer(ABC):
    def __init__(self, out: TextIO):
        self.out = out

    def header(self, params: BenchParams) -> None:
        pass

    @abstractmethod
    def test(self, r: TestResult) -> None:
        """Print one finished test."""

    def footer(self) -> None:
        pass


class CsvPrinter(Printer):
    @staticmethod
    def escape(v: str) -> str:
        return '"' + v.replace('"', '""') + '"'

    def header(self, params):
        self.out.write(",".join(ALL_FIELDS) + "\n")

    def test(self, r):
        self.out.write(",".join(self.escape(v) for v in r.values()) + "\n")


def _json_value(name: str, v: str) -> str:
    t = field_type(name)
    if t == "STRING":
        return json.dumps(v, ensure_ascii=False)
    if t == "BOOL":
        return "false" if v == "0" else "true"
    return v


def _json_items(r: TestResult) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    vals = r.values()
    ref = [(f, _json_value(f, v)) for f, v in zip(FIELDS, vals)]
    extra = [(f, _json_value(f, v)) for f, v in zip(EXTRA_FIELDS, vals[len(FIELDS):])]
    return ref, extra


class JsonPrinter(Printer):
    first = True

    def header(self, params):
        self.out.write("[\n")

    def test(self, r):
        if not self.first:
            self.out.write(",\n")
        self.first = False
        ref, extra = _json_items(r)
        w = self.out.write
        w("  {\n")
        for f, v in ref:
            w(f'    "{f}": {v},\n')
        w(f'    "samples_ns": [ {", ".join(str(t) for t in r.samples_ns)} ],\n')
        w(f'    "samples_ts": [ {", ".join(_g(t) for t in r.samples_ts)} ],\n')
        w(",\n".join(f'    "{f}": {v}' for f, v in extra) + "\n")
        w("  }")
        self.out.flush()

    def footer(self):
        self.out.write("\n]\n")


class JsonlPrinter(Printer):
    def test(self, r):
        ref, extra = _json_items(r)
        s = "{" + "".join(f'"{f}": {v}, ' for f, v in ref)
        s += f'"samples_ns": [ {", ".join(str(t) for t in r.samples_ns)} ],'
        s += f'"samples_ts": [ {", ".join(_g(t) for t in r.samples_ts)} ]'
        s += "".join(f', "{f}": {v}' for f, v in extra) + "}\n"
        self.out.write(s)
        self.out.flush()


class SqlPrinter(Printer):
    SQL_TYPE = {"STRING": "TEXT", "BOOL": "INTEGER", "INT": "INTEGER", "FLOAT": "REAL"}

    def header(self, params):
        w = self.out.write
        w("CREATE TABLE IF NOT EXISTS llama_bench (\n")
        for k, f in enumerate(ALL_FIELDS):
            w(f"  {f} {self.SQL_TYPE[field_type(f)]}{',' if k < len(ALL_FIELDS) - 1 else ''}\n")
        w(");\n\n")

    def test(self, r):
        vals = ", ".join("'" + v.replace("'", "''") + "'" for v in r.values())
        self.out.write(f"INSERT INTO llama_bench ({', '.join(ALL_FIELDS)}) VALUES ({vals});\n")


class MarkdownPrinter(Printer):
    WIDTH = {"model": -30, "t/s": 20, "size": 10, "params": 10, "n_threads": 7, "n_batch": 7, "n_ubatch": 8,
             "test": 15}
    DISPLAY = {"n_threads": "threads"}

    def __init__(self, out):
        super().__init__(out)
        self.fields: list[str] = []

    @classmethod
    def width(cls, f: str) -> int:
        if f in cls.WIDTH:
            return cls.WIDTH[f]
        w = max(len(f), 10)
        return -w if field_type(f) == "STRING" else w

    def header(self, params):
        self.fields = ["model", "size", "params", "backend", "n_threads"]  # threads: always on CPU
        self.fields += [f for f in ("cpu_mask", "cpu_strict", "n_batch", "n_ubatch") if params.non_default(f)]
        self.fields += ["test", "t/s"]
        head = sep = "|"
        for f in self.fields:
            w = self.width(f)
            head += f" {self._pad(self.DISPLAY.get(f, f), w)} |"
            sep += f" {'-' * (abs(w) - 1)}{':' if w > 0 else '-'} |"
        self.out.write(head + "\n" + sep + "\n")

    @staticmethod
    def _pad(s: str, w: int) -> str:
        return s.ljust(-w) if w < 0 else s.rjust(w)

    @staticmethod
    def cell(f: str, r: TestResult) -> str:
        m = r.model
        if f == "model":
            return m.desc
        if f == "size":
            return f"{m.size / 1024 / 1024:.2f} MiB" if m.size < 1024**3 else f"{m.size / 1024**3:.2f} GiB"
        if f == "params":
            return f"{m.n_params / 1e6:.2f} M" if m.n_params < 1000**3 else f"{m.n_params / 1e9:.2f} B"
        if f == "backend":
            return "CPU"
        if f == "test":
            return r.inst.name
        if f == "t/s":
            return f"{r.avg_ts:.2f} ± {r.stdev_ts:.2f}"
        return r.as_dict()[f]

    def test(self, r):
        self.out.write("|" + "".join(f" {self._pad(self.cell(f, r), self.width(f))} |" for f in self.fields) + "\n")

    def footer(self):
        self.out.write(f"\nbuild: quantkit-{__version__} (0)\n")


PRINTERS: dict[str, type[Printer]] = {"csv": CsvPrinter, "json": JsonPrinter, "jsonl": JsonlPrinter,
                                      "md": MarkdownPrinter, "sql": SqlPrinter}


def make_printer(fmt: str, out: TextIO) -> Printer:
    try:
        return PRINTERS[fmt](out)
    except KeyError:
        raise BenchError(f"unknown output format {fmt!r} (one of {', '.join(PRINTERS)})") from None


# -- thread affinity ---------------------------------------------------------------------------------


_WORKER_TIDS = None


def _numba_worker_tids() -> list[int]:
    """The Linux thread ids of numba's workers 0..get_num_threads()-1 (worker 0 is the calling thread):
    a parallel loop in which every worker writes its ``gettid()`` at its ``numba.get_thread_id()``."""
    global _WORKER_TIDS
    import ctypes

    import numba

    from quantkit.jit import get_threads

    if _WORKER_TIDS is None:
        gettid = ctypes.CDLL(None).gettid
        gettid.restype, gettid.argtypes = ctypes.c_int, []

        @numba.njit(parallel=True, cache=False)     # a ctypes pointer cannot go into numba's cache
        def tids(out):
            for i in numba.prange(out.shape[0] * 256):
                out[numba.get_thread_id()] = gettid()

        _WORKER_TIDS = tids
    out = np.zeros(get_threads(), np.int64)
    _WORKER_TIDS(out)
    return [int(t) for t in out if t > 0]


class Affinity:
    """``-C/--cpu-mask`` and ``--cpu-strict`` for numba's OpenMP workers.

    Linux's ``sched_setaffinity`` acts on one thread, so every thread of the process (/proc/self/task) is
    set: with a mask and no strict, all get the mask; strict pins numba's worker k (the main thread is
    worker 0; ids from ``_numba_worker_tids``) to the k-th CPU of the mask, round-robin, like ggml's
    strict threadpool, and lets the other threads (OpenBLAS's) use the whole mask. Mask 0 restores the
    affinity the process started with. Applied before a test's priming pass and again before its warmup,
    so workers started by the first parallel call are covered too."""

    def __init__(self):
        self.supported = hasattr(os, "sched_setaffinity") and hasattr(os, "sched_getaffinity")
        self.initial = set(os.sched_getaffinity(0)) if self.supported else set()
        self.current: tuple[str, bool] = ("0x0", False)

    @staticmethod
    def _tasks() -> list[int]:
        try:
            tids = sorted(int(t) for t in os.listdir("/proc/self/task"))
        except OSError:
            return [0]
        pid = os.getpid()
        return [pid] + [t for t in tids if t != pid] if pid in tids else tids

    def apply(self, mask: str, strict: bool) -> None:
        cpus = parse_cpu_mask(mask)
        if not cpus and self.current == ("0x0", False):
            return
        if not self.supported:
            if cpus:
                raise BenchError(f"--cpu-mask {mask}: pinning threads is not supported on this OS "
                                 f"(Python has no os.sched_setaffinity here)")
            return
        if not cpus:
            usable = sorted(self.initial)
        else:
            usable = sorted(cpus & self.initial)
            if not usable:
                raise BenchError(f"--cpu-mask {mask}: none of CPUs {sorted(cpus)} is available to this process "
                                 f"(allowed: {sorted(self.initial)})")
        target = {tid: set(usable) for tid in self._tasks()}
        if cpus and strict:
            # numba's workers, identified by their thread ids, each on its own CPU (the caller is worker
            # 0); every other thread (OpenBLAS's pool, ...) may use the whole mask. Pinning by creation
            # order instead put OpenBLAS's thread on the second CPU and numba's second worker beside the
            # main thread: tg128 fell from ~175 to ~20 t/s on two cores.
            for k, tid in enumerate(_numba_worker_tids()):
                target[tid] = {usable[k % len(usable)]}
        for tid, cpu_set in target.items():
            try:
                os.sched_setaffinity(tid, cpu_set)
            except ProcessLookupError:  # the thread ended meanwhile
                continue
            except OSError as e:
                raise BenchError(f"--cpu-mask {mask}: sched_setaffinity refused ({e.strerror})") from None
        self.current = (mask, strict) if cpus else ("0x0", False)

    def restore(self) -> None:
        self.apply("0x0", False)


# -- memory -----------------------------------------------------------------------------------------


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) for this process; False where not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import resource

    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ru if sys.platform == "darwin" else ru * 1024


# -- compile-time accounting -------------------------------------------------------------------------


class CompileClock:
    """Seconds spent inside numba's compiler lock (compiling, or loading cached machine code)."""

    def __init__(self):
        from numba.core import event

        self._event = event
        self.total = 0.0
        self._depth = 0
        self._t0 = 0.0
        self._listener = None

    def __enter__(self):
        ev, clock = self._event, self

        class _L(ev.Listener):
            def on_start(self, e):
                if clock._depth == 0:
                    clock._t0 = time.perf_counter()
                clock._depth += 1

            def on_end(self, e):
                clock._depth -= 1
                if clock._depth == 0:
                    clock.total += time.perf_counter() - clock._t0

        self._listener = _L()
        ev.register("numba:compiler_lock", self._listener)
        return self

    def __exit__(self, *exc):
        self._event.unregister("numba:compiler_lock", self._listener)


# -- the run ----------------------------------------------------------------------------------------

Progress = Callable[[str], None]


@dataclass
class _Loaded:
    path: str
    llama: Any
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
        from quantkit.model.llama import Llama

        t0 = time.perf_counter()
        llama = Llama(path)
        meta = llama.metadata
        add_bos, bos = False, 0
        if "tokenizer.ggml.model" in meta:
            from quantkit.model.tokenizer import Tokenizer

            try:
                tok = Tokenizer.from_metadata(meta)
                add_bos, bos = bool(tok.add_bos), (tok.bos_id if tok.bos_id is not None else 0)
            except QuantkitError as e:
                self.log(f"{path}: tokenizer unreadable ({e}); no BOS")
        self.loaded = _Loaded(path, llama, model_info(path, llama.gguf), add_bos, int(bos), llama.config.n_vocab)
        self.log(f"loaded {path} in {time.perf_counter() - t0:.2f} s: {self.loaded.info.desc}, "
                 f"add_bos={add_bos}, n_vocab={self.loaded.n_vocab}")
        return self.loaded

    def close_model(self) -> None:
        self.runner = None
        if self.loaded is not None:
            self.loaded.llama.close()
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
        _kv_clear(r)
        self.loaded.primed.update(todo)

    def _depth(self, inst: Instance, rep: int) -> None:
        ds = self.depth_state
        R, i, n = self.params.reps, self._idx, self._count
        if ds is not None and ds[0] == inst.model and ds[1] == inst.n_depth:
            _kv_restore(self.runner, ds[2], ds[3])
            self.progress(f"llama-bench: benchmark {i}/{n}: depth run {rep}/{R} (cached)")
            return
        self.progress(f"llama-bench: benchmark {i}/{n}: depth run {rep}/{R}")
        self._decode(self._prompt_tokens(inst.n_depth, inst.n_batch))
        self.depth_state = (inst.model, inst.n_depth, *_kv_save(self.runner, inst.n_depth))

    def run_test(self, inst: Instance, idx: int, count: int) -> TestResult:
        from quantkit.jit import set_threads
        from quantkit.model.forward import Runner

        self._idx, self._count = idx, count
        P = self.params
        self.progress(f"llama-bench: benchmark {idx}/{count}: starting")
        self.runner = None  # the previous test's buffers and KV cache go before this test's are made
        reset_peak_rss()
        lm = self._load(inst.model)
        try:
            self.runner = Runner(lm.llama, inst.n_ctx, n_batch=inst.n_ubatch)
        except ModelError as e:
            raise BenchError(f"{inst.model}: {inst.name}: {e}") from None
        kv_bytes = self.runner.key_cache.nbytes + self.runner.value_cache.nbytes
        result = TestResult(inst, lm.info, datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                            self.cpu_info, rss_bound_mib=(lm.info.file_size + kv_bytes) / 2**20 + RSS_OVERHEAD_MIB)
        set_threads(inst.n_threads)
        self.affinity.apply(inst.cpu_mask, inst.cpu_strict)
        _kv_clear(self.runner)
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
                _kv_clear(self.runner)
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


# -- KV cache adapter (the Runner has reset() but no state save/restore) ------------------------------


def _kv_clear(runner) -> None:
    """llama_memory_clear: forget every position (the Runner never reads past ``n_past``)."""
    runner.reset()


def _kv_save(runner, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``n`` positions of every layer's K and V."""
    return runner.key_cache[:, :n].copy(), runner.value_cache[:, :n].copy()


def _kv_restore(runner, k: np.ndarray, v: np.ndarray) -> None:
    """llama_state_seq_set_data: put a saved prefix back and continue after it."""
    n = k.shape[1]
    runner.key_cache[:, :n] = k
    runner.value_cache[:, :n] = v
    runner.n_past = n


__all__ = ["ALL_FIELDS", "BenchError", "BenchParams", "BenchSession", "EXTRA_FIELDS", "FIELDS", "GlibcRand",
           "Instance", "PRINTERS", "TestResult", "default_threads", "instances", "make_printer", "model_info",
           "parse_bool_list", "parse_cpu_mask", "parse_int_range", "parse_pair", "run_bench", "stats_ns",
           "stats_ts"]
