"""``quantkit bench``: llama-bench's lists, test order, procedure, statistic and printers.

Fast: a tiny llama written here with gguf.GGUFWriter (F32/Q8_0, 2 layers) and tiny -p/-n/-r. The
reference samples in tests/data/bench/ come from llama.cpp's llama-bench (see the README there).
Timings are never asserted; a fake clock injects them where the statistic is checked.
"""

from __future__ import annotations

import ctypes
import io
import json
import math
import os
import sqlite3
from pathlib import Path

import gguf
import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as T

from quantkit import isa
from quantkit.cli import main
from quantkit.cli.lists import parse_bool_list, parse_int_range, parse_pair
from quantkit.jit import get_threads, set_threads
from quantkit.pipelines import bench as B
from quantkit.quants import quantize

DATA = Path(__file__).parent / "data" / "bench"
TINY = dict(n_layer=2, n_embd=64, n_ff=128, n_head=4, n_head_kv=2, n_vocab=96, n_ctx=64)


def write_tiny(path: Path, *, with_tokenizer: bool = False) -> Path:
    c, rng = TINY, np.random.default_rng(0)
    E, F, V, H, HKV = c["n_embd"], c["n_ff"], c["n_vocab"], c["n_head"], c["n_head_kv"]
    hd = E // H
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.block_count", c["n_layer"])
    w.add_uint32("llama.embedding_length", E)
    w.add_uint32("llama.feed_forward_length", F)
    w.add_uint32("llama.attention.head_count", H)
    w.add_uint32("llama.attention.head_count_kv", HKV)
    w.add_uint32("llama.context_length", c["n_ctx"])
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_uint32("llama.vocab_size", V)
    w.add_uint32("general.file_type", 7)

    def add(name, n_in, n_out, qt=T.Q8_0):
        x = (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)
        if qt == T.F32:
            w.add_tensor(name, x)
        else:
            w.add_tensor(name, quantize(x, qt), raw_dtype=qt)

    add("token_embd.weight", E, V)
    for i in range(c["n_layer"]):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(E, np.float32))
        add(p + "attn_q.weight", E, E)
        add(p + "attn_k.weight", E, HKV * hd)
        add(p + "attn_v.weight", E, HKV * hd)
        add(p + "attn_output.weight", E, E)
        w.add_tensor(p + "ffn_norm.weight", np.ones(E, np.float32))
        add(p + "ffn_gate.weight", E, F)
        add(p + "ffn_up.weight", E, F)
        add(p + "ffn_down.weight", F, E)
    w.add_tensor("output_norm.weight", np.ones(E, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(write_tiny(tmp_path_factory.mktemp("bench") / "tiny.gguf"))


def params(model: str, **kw) -> B.BenchParams:
    p = B.BenchParams(models=[model], n_prompt=[8], n_gen=[2], reps=2, n_threads=[1])
    for k, v in kw.items():
        setattr(p, k, v)
    return p


# -- lists and order ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("512", [512]), ("1,2,3", [1, 2, 3]), ("1-4", [1, 2, 3, 4]), ("16-64+16", [16, 32, 48, 64]),
    ("1-8*2", [1, 2, 4, 8]), ("1-9*3,100", [1, 3, 9, 100]), ("0", [0]), ("5-3", []), ("1,", [1]),
])
def test_parse_int_range(text, want):
    assert parse_int_range(text) == want


@pytest.mark.parametrize("text", ["", "x", "1-", "1-4-", "-1", "1-8*1", "1-8+0", "1,,2", "4 ", "1-4/2"])
def test_parse_int_range_errors(text):
    with pytest.raises(ValueError):
        parse_int_range(text)


def test_other_parsers():
    assert parse_pair("512,128") == (512, 128)
    assert parse_bool_list("0,1") == [False, True]
    assert B.parse_cpu_mask("0x0") == set() and B.parse_cpu_mask("0x5") == {0, 2} and B.parse_cpu_mask("f0") == {4, 5, 6, 7}
    for bad, fn in (("1", parse_pair), ("1,x", parse_pair), ("2", parse_bool_list), ("0xg", B.parse_cpu_mask),
                    ("0X3", B.parse_cpu_mask)):
        with pytest.raises(ValueError):
            fn(bad)


def test_instances_cartesian_order():
    p = B.BenchParams(models=["a", "b"], n_prompt=[1, 2], n_gen=[3, 0], n_pg=[(4, 5)], n_depth=[0, 7],
                      n_threads=[1, 2])
    got = [(i.model, i.n_threads, i.n_depth, i.name) for i in B.instances(p)]
    want = []
    for m in "ab":                      # the model outermost: loaded once each
        for t in (1, 2):
            for d in (0, 7):
                sfx = f" @ d{d}" if d else ""
                want += [(m, t, d, "pp1" + sfx), (m, t, d, "pp2" + sfx), (m, t, d, "tg3" + sfx),
                         (m, t, d, "pp4+tg5" + sfx)]
    assert got == want
    assert B.Instance("m", 512, 128, 0, 2048, 512, 2, "0x0", False).n_ctx == 640


# -- the statistic -----------------------------------------------------------------------------------

def test_statistic_formula():
    ns = [1_000_000_000, 2_000_000_000, 4_000_000_000]
    ts, mean, sd = B.stats_ts(ns, 100)
    assert ts == [100.0, 50.0, 25.0]
    assert mean == pytest.approx(175 / 3)
    assert sd == pytest.approx(np.std(ts, ddof=1), rel=1e-12)
    avg_ns, sd_ns = B.stats_ns(ns)
    assert avg_ns == 2_333_333_333        # llama-bench's integer arithmetic, term by term:
    assert sd_ns == int(math.sqrt(sum(t * t for t in ns) // 2 - avg_ns * avg_ns * 3 // 2))
    assert abs(sd_ns - math.sqrt(np.var(ns, ddof=1))) < 2
    assert B.stats_ts([5], 10)[2] == 0.0 and B.stats_ns([5]) == (5, 0)


def test_glibc_rand_sequence():
    g = B.GlibcRand(1)
    got = [g() for _ in range(1000)]
    assert got[:3] == [1804289383, 846930886, 1681692777]   # glibc's rand() after srand(1)
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        pytest.skip("no glibc here")
    libc.srand(1)
    assert got == [libc.rand() for _ in range(1000)]


class FakeClock:
    """Each timed repetition takes 1, 2, 3 ... ms."""

    def __init__(self):
        self.t, self.calls = 0, 0

    def __call__(self) -> int:
        self.calls += 1
        if self.calls % 2 == 0:
            self.t += (self.calls // 2) * 1_000_000
        return self.t


def test_injected_timings_and_md(tiny):
    p = params(tiny, reps=3)
    s = B.BenchSession(p, clock_ns=FakeClock())
    out = io.StringIO()
    res = B.run_bench(p, [B.MarkdownPrinter(out)], session=s)
    assert [r.samples_ns for r in res] == [[1_000_000, 2_000_000, 3_000_000], [4_000_000, 5_000_000, 6_000_000]]
    ts = [8e9 / t for t in (1e6, 2e6, 3e6)]
    assert res[0].avg_ts == pytest.approx(np.mean(ts)) and res[0].stdev_ts == pytest.approx(np.std(ts, ddof=1))
    lines = out.getvalue().splitlines()
    assert lines[0] == ("| model                          |       size |     params | backend    | threads "
                        "|            test |                  t/s |")
    assert lines[1] == ("| ------------------------------ | ---------: | ---------: | ---------- | ------: "
                        "| --------------: | -------------------: |")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[0] == "llama ?B Q8_0" and cells[3] == "CPU" and cells[4] == "1" and cells[5] == "pp8"
    assert cells[6] == f"{np.mean(ts):.2f} ± {np.std(ts, ddof=1):.2f}"
    assert all(len(ln) == len(lines[0]) for ln in lines[:4])
    assert lines[-2] == ""
    assert lines[-1] == f"build: quantkit-{__import__('quantkit').__version__} (0), kernels: {isa.describe()}"
    # the level each matrix type's kernels ran at, from the types' records
    from quantkit.kernels.cpu_traits import describe

    assert lines[-4] == "" and lines[-3] == f"kernels by type: {describe(res[0].model.matrix_types)}"
    assert res[0].model.matrix_types and lines[-3].startswith(f"kernels by type: {res[0].model.matrix_types[0]} row ")


def test_md_optional_columns(tiny):
    p = params(tiny, n_batch=[4, 8], n_prompt=[8], n_gen=[0], reps=1)
    out = io.StringIO()
    B.run_bench(p, [B.MarkdownPrinter(out)])
    head = [c.strip() for c in out.getvalue().splitlines()[0].strip("|").split("|")]
    assert head == ["model", "size", "params", "backend", "threads", "n_batch", "test", "t/s"]


def test_model_cells_match_llama_bench():
    """The bundled SmolLM2 as llama-bench names it (tests/data/bench/llama-bench.md)."""
    from quantkit.formats.gguf_io import GGUFModel
    from quantkit.formats.locate import bundled_model

    ref = [c.strip() for c in (DATA / "llama-bench.md").read_text().splitlines()[2].strip("|").split("|")]
    path = str(bundled_model())
    with GGUFModel(path) as g:
        info = B.model_info(path, g)
    r = B.TestResult(B.Instance(path, 16, 0, 0, 2048, 512, 2, "0x0", False), info, "t", "cpu", [10**9])
    assert [B.MarkdownPrinter.cell(f, r) for f in ("model", "size", "params", "backend")] == ref[:4]
    ref_csv = (DATA / "llama-bench.csv").read_text().splitlines()[1]
    assert f'"{info.desc}","{info.size}","{info.n_params}"' in ref_csv


def test_ftype_guess_and_size_label():
    meta = {"general.architecture": "llama", "llama.block_count": 30}
    assert B.size_label(meta) == "256M" and B.size_label({**meta, "llama.block_count": 3}) == "?B"
    tt = [("token_embd.weight", "Q6_K"), ("blk.0.a", "Q4_K"), ("blk.1.a", "Q4_K"), ("blk.10.b", "Q6_K")]
    assert B.ftype_name({}, tt) == "(guessed) Q4_K - Medium"
    assert B.ftype_name({"general.file_type": 15}, tt) == "Q4_K - Medium"


# -- machine-readable printers against llama-bench's own output -------------------------------------

def _run(tiny, fmt: str, **kw) -> str:
    out = io.StringIO()
    B.run_bench(params(tiny, **kw), [B.make_printer(fmt, out)])
    return out.getvalue()


def test_csv_fields(tiny):
    ref_head = (DATA / "llama-bench.csv").read_text().splitlines()[0].split(",")
    assert ref_head == B.FIELDS
    lines = _run(tiny, "csv").splitlines()
    assert lines[0].split(",") == B.FIELDS + B.EXTRA_FIELDS
    row = dict(zip(B.ALL_FIELDS, [v.strip('"') for v in lines[1].split('","')]))
    assert row["backends"] == "CPU" and row["n_prompt"] == "8" and row["n_gen"] == "0" and row["model_type"] == "llama ?B Q8_0"
    assert row["build_commit"].startswith("quantkit-") and float(row["peak_rss_mib"]) > 0
    assert len(lines) == 3


def test_json_and_jsonl_fields(tiny):
    ref = json.loads((DATA / "llama-bench.json").read_text())
    ref_keys = list(ref[0])
    assert ref_keys == B.FIELDS + ["samples_ns", "samples_ts"]
    got = json.loads(_run(tiny, "json"))
    assert len(got) == 2 and list(got[0]) == ref_keys + B.EXTRA_FIELDS
    for k in ref_keys:
        assert type(got[0][k]) is type(ref[0][k]), k
    assert len(got[0]["samples_ns"]) == 2 and got[0]["compile_s"] >= 0
    ref_l = [json.loads(ln) for ln in (DATA / "llama-bench.jsonl").read_text().splitlines()]
    got_l = [json.loads(ln) for ln in _run(tiny, "jsonl").splitlines()]
    assert list(ref_l[0]) == ref_keys and [list(o) for o in got_l] == [ref_keys + B.EXTRA_FIELDS] * 2


def test_sql_loads_into_sqlite(tiny):
    db = sqlite3.connect(":memory:")
    db.executescript(_run(tiny, "sql"))
    cols = [r[1] for r in db.execute("PRAGMA table_info(llama_bench)")]
    assert cols == B.ALL_FIELDS
    rows = db.execute("SELECT n_prompt, n_gen, avg_ts, typeof(avg_ts), typeof(n_prompt) FROM llama_bench").fetchall()
    assert [(r[0], r[1]) for r in rows] == [(8, 0), (0, 2)] and rows[0][3:] == ("real", "integer")
    ref = sqlite3.connect(":memory:")
    ref.executescript((DATA / "llama-bench.sql").read_text())
    assert [r[1] for r in ref.execute("PRAGMA table_info(llama_bench)")] == B.FIELDS


# -- the procedure -----------------------------------------------------------------------------------

def test_kv_cleared_and_depth_restored_each_repetition(tiny):
    p = params(tiny, n_prompt=[6], n_gen=[2], n_depth=[5], reps=3)
    events = []
    s = B.BenchSession(p)

    def progress(line):
        events.append((line.split(": ", 2)[-1], s.runner.n_past if s.runner is not None else None))

    s.progress = progress
    B.run_bench(p, [B.CsvPrinter(io.StringIO())], session=s)
    timed = [(e, n) for e, n in events if e.startswith(("prompt run", "generation run"))]
    assert len(timed) == 6 and all(n == 5 for _, n in timed)     # cleared, then the depth prefix only
    depth = [e for e, _ in events if e.startswith("depth run")]
    assert depth == ["depth run 1/3", "depth run 2/3 (cached)", "depth run 3/3 (cached)"] + \
        [f"depth run {i}/3 (cached)" for i in (1, 2, 3)]
    assert events[0][0] == "starting" and "warmup prompt run" in [e for e, _ in events]


def test_depth_restore_equals_recompute(tiny):
    """The cached depth state is the state a fresh prefill leaves."""
    from quantkit.model.forward import Runner
    from quantkit.model.llama import Llama

    with Llama(tiny) as m:
        r = Runner(m, 16, 8)
        toks = np.arange(1, 7)
        r.forward(toks)
        k, v, st = r.save_prefix(6)
        want = r.forward([3]).copy()
        r.reset()
        assert r.n_past == 0
        r.forward(np.full(10, 9))                # overwrite the cache
        r.reset()
        r.restore_prefix(k, v, st)
        assert r.n_past == 6
        np.testing.assert_array_equal(r.forward([3]), want)


def test_compile_time_kept_apart(tiny):
    import numba

    with B.CompileClock() as cc:
        numba.njit(lambda x: x + 1)(1)
    assert cc.total > 0
    p = params(tiny, no_warmup=True, n_ubatch=[3], n_prompt=[7])   # sub-batch sizes 3 and 1: new paths
    s = B.BenchSession(p)
    res = B.run_bench(p, [B.CsvPrinter(io.StringIO())], session=s)
    assert s.compile_in_timed_s == 0.0
    assert all(r.compile_s >= 0 for r in res)


def test_affinity_mask(tiny):
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity on this OS")
    a = B.Affinity()
    first = min(a.initial)
    a.apply(hex(1 << first), False)
    assert os.sched_getaffinity(0) == {first}
    a.restore()
    assert os.sched_getaffinity(0) == a.initial
    with pytest.raises(B.BenchError, match="none of CPUs"):
        a.apply(hex(1 << 1000), False)


def test_affinity_strict_pins_numba_workers_to_their_own_cpus():
    """--cpu-strict: numba's worker k (found by thread id, the main thread is worker 0) on the k-th CPU
    of the mask, each alone; threads that are not numba's (OpenBLAS's pool) keep the whole mask."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no sched_setaffinity on this OS")
    a = B.Affinity()
    cpus = sorted(a.initial)[:2]
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    before = get_threads()
    set_threads(2)
    try:
        a.apply(hex((1 << cpus[0]) | (1 << cpus[1])), True)
        workers = B.host._numba_worker_tids()
        assert len(workers) == 2 and workers[0] == os.getpid()
        assert [os.sched_getaffinity(t) for t in workers] == [{cpus[0]}, {cpus[1]}]
        others = [t for t in B.Affinity._tasks() if t not in workers]
        assert all(os.sched_getaffinity(t) == set(cpus) for t in others)
    finally:
        a.restore()
        set_threads(before)
    assert os.sched_getaffinity(0) == a.initial


# -- the command line --------------------------------------------------------------------------------

def cli(*args):
    return CliRunner().invoke(main, ["bench", *args])


def test_cli_formats(tiny):
    r = cli("-m", tiny, "-p", "8", "-n", "2", "-r", "2", "-t", "1", "-o", "jsonl", "-oe", "csv", "--progress")
    assert r.exit_code == 0, r.output
    objs = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [(o["n_prompt"], o["n_gen"], o["n_threads"]) for o in objs] == [(8, 0, 1), (0, 2, 1)]
    assert "llama-bench: benchmark 1/2: starting" in r.stderr and "generation run 2/2" in r.stderr
    assert ",".join(B.ALL_FIELDS) in r.stderr


def assert_one_line_error(result, code: int, needle: str) -> None:
    assert result.exit_code == code, result.output
    assert "Traceback" not in result.output
    err = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert err[-1].startswith("Error:") and needle in err[-1], result.stderr


def test_cli_errors(tiny, tmp_path):
    assert_one_line_error(cli("-m", str(tmp_path / "nope.gguf"), "-p", "8", "-n", "0"), 1, "no such model file")
    assert_one_line_error(cli("-m", tiny, "-o", "xml"), 2, "xml")
    assert_one_line_error(cli("-m", tiny, "-p", "5-x"), 2, "invalid range format")
    assert_one_line_error(cli("-m", tiny, "-pg", "5"), 2, "PP,TG")
    assert_one_line_error(cli("-m", tiny, "-C", "0xzz"), 2, "cpu mask")
    assert_one_line_error(cli("-m", tiny, "-t", "0", "-p", "8", "-n", "0"), 1, "threads 0")
    assert_one_line_error(cli("-m", tiny, "-p", "100", "-n", "0", "-r", "1"), 1, "context")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf")
    assert_one_line_error(cli("-m", str(bad), "-p", "8", "-n", "0"), 1, "not a GGUF")


def test_cli_help_lists_options():
    r = cli("--help")
    assert r.exit_code == 0
    for opt in ("--model", "--n-prompt", "--n-gen", "-pg", "--n-depth", "--threads", "--repetitions",
                "--batch-size", "--no-warmup", "--output", "--output-err", "--progress", "--cpu-mask", "--cpu-strict"):
        assert opt in r.output


def test_bench_model_entry_point(tiny):
    """``bench_model``: one pp and one tg test of one file, as ``quantkit bench -p N -n M`` runs them."""
    s = B.bench_model(tiny, n_prompt=8, n_gen=2, reps=2, threads=1)
    assert [r.inst.name for r in s.results] == ["pp8", "tg2"]
    assert [len(r.samples_ns) for r in s.results] == [2, 2] and all(r.inst.n_threads == 1 for r in s.results)
    assert (s.pp_ts, s.tg_ts) == (s.results[0].avg_ts, s.results[1].avg_ts) and s.pp_ts > 0 and s.tg_ts > 0
    with pytest.raises(B.BenchError, match="pp0"):
        B.bench_model(tiny, n_prompt=0)
