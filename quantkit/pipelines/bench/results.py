"""One test's result: llama-bench's fields (and quantkit's three after them), their types, and the
statistic over the repetitions."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from quantkit import __version__
from quantkit.pipelines.bench.model_desc import ModelInfo
from quantkit.pipelines.bench.params import Instance


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
