"""`quantkit sweep`: points, the Pareto frontier, and a small real sweep of the bundled SmolLM2 that is
resumed without redoing anything."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest

from conftest import run_cli
from quantkit.pipelines.sweep import Point, SweepError, mark_pareto, parse_points, table


def test_parse_points():
    assert parse_points("q4_k_m, Q8_0", "3.5,4.25") == [
        Point("Q4_K_M", "Q4_K_M"), Point("Q8_0", "Q8_0"),
        Point("bpw3.5", "Q4_K_M", 3.5), Point("bpw4.25", "Q4_K_M", 4.25)]
    assert parse_points("", "5", "Q5_K_M") == [Point("bpw5", "Q5_K_M", 5.0)]


@pytest.mark.parametrize("types,targets,msg", [
    ("", "", "nothing to sweep"),
    ("Q4_K_M,q4_k_m", "", "given twice"),
    ("Q9_K", "", "unknown ftype"),
    ("", "four", "comma-separated numbers"),
    ("", "0", "between 0 and 64"),
])
def test_parse_points_refuses(types, targets, msg):
    with pytest.raises(SweepError, match=msg):
        parse_points(types, targets)


def test_pareto_table():
    rows = [dict(label=k, size=s, kld=d) for k, s, d in
            [("a", 10, 0.5), ("b", 20, 0.2), ("c", 20, 0.3), ("d", 30, 0.2), ("e", 40, 0.01)]]
    mark_pareto(rows)
    assert {r["label"]: r["pareto"] for r in rows} == {"a": True, "b": True, "c": False, "d": False, "e": True}


def test_sweep_end_to_end_and_resume(smollm2_f16, tmp_path):
    out = tmp_path / "sweep"
    args = ["sweep", "-m", smollm2_f16, "--types", "Q8_0,Q4_0", "--chunks", "2", "-c", "128", "--format", "csv",
            "-o", out]
    res = run_cli(args)
    assert res.exit_code == 0, res.output
    rows = {r["label"]: r for r in csv.DictReader(io.StringIO(res.stdout))}
    assert set(rows) == {"Q8_0", "Q4_0"}
    q8, q4 = rows["Q8_0"], rows["Q4_0"]
    assert float(q4["size_mib"]) < float(q8["size_mib"])
    assert 0 < float(q8["kld"]) < float(q4["kld"])
    assert q8["pareto"] == q4["pareto"] == "True"
    # the sweep's KLD is what `quantkit perplexity --kl-divergence` reports for the same file and base
    kl = run_cli(["perplexity", "-m", out / "Q4_0.gguf", "--kl-divergence", "--kl-divergence-base", out / "base.kld"])
    assert kl.exit_code == 0, kl.output
    mean = float(re.search(r"Mean\s+KLD:\s+([0-9.]+)", kl.stdout).group(1))
    assert float(q4["kld"]) == pytest.approx(mean, abs=5e-7)
    for f in ("sweep.md", "sweep.csv", "sweep.json", "Q8_0.json", "Q4_0.json", "base.kld"):
        assert (out / f).exists(), f
    assert json.loads((out / "sweep.json").read_text())[0]["label"] == "Q4_0"   # smallest first
    try:
        import matplotlib  # noqa: F401
        assert (out / "sweep.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    except ImportError:
        assert "matplotlib is not installed" in res.stderr
    # a rerun measures nothing again
    mtime = (out / "Q4_0.gguf").stat().st_mtime_ns
    again = run_cli(args)
    assert again.exit_code == 0, again.output
    assert again.stderr.count("already measured") == 2 and "already made" in again.stderr
    assert (out / "Q4_0.gguf").stat().st_mtime_ns == mtime
    assert again.stdout == res.stdout


def test_sweep_usage_errors(tmp_path, smollm2_f16):
    res = run_cli(["sweep", "-m", smollm2_f16, "--target-bpw", "5", "-o", tmp_path / "s"])
    assert res.exit_code == 2 and "need --imatrix" in res.output
    res = run_cli(["sweep", "-m", smollm2_f16, "-o", tmp_path / "s"])
    assert res.exit_code == 2 and "nothing to sweep" in res.output
    assert not (tmp_path / "s").exists()


def test_table_formats():
    rows = [dict(label="x", kind="mix", size=2 * 1024 * 1024, size_mib=2.0, bpw=4.5, ppl=10.0, kld=0.01,
                 kld_unc=0.001, same_top=0.9, pareto=True)]
    md = table(rows, "md")
    assert md.splitlines()[0].startswith("| label | kind | size_mib")
    assert "| x | mix | 2.00 | 4.500 | 10.0000 | 0.01000 | 0.00100 | 90.00 % | * |" in md
    assert json.loads(table(rows, "json"))[0]["label"] == "x"


# -- --bench ------------------------------------------------------------------------------------------

BENCH = ["--bench", "--bench-pp", "32", "--bench-tg", "8", "--bench-reps", "2"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from archmodels import write_model

    return write_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3-f16.gguf", "qwen3", "F16")


def test_sweep_bench_columns_and_resume(tiny, tmp_path):
    out = tmp_path / "sweep"
    plain = ["sweep", "-m", tiny, "--types", "Q8_0,Q4_0", "--chunks", "2", "-c", "64", "-o", out]
    assert run_cli(plain).exit_code == 0
    mtimes = {f: (out / f).stat().st_mtime_ns for f in ("Q8_0.gguf", "Q4_0.gguf", "base.kld")}
    # --bench on a finished sweep only times the files
    res = run_cli(plain + BENCH + ["--format", "csv"])
    assert res.exit_code == 0, res.output
    assert res.stderr.count("already measured") == 0 and res.stderr.count("(bench)") == 2
    assert {f: (out / f).stat().st_mtime_ns for f in mtimes} == mtimes
    rows = list(csv.DictReader(io.StringIO(res.stdout)))
    assert list(rows[0])[-2:] == ["pp_ts", "tg_ts"]
    for r in rows:
        assert float(r["pp_ts"]) > 0 and float(r["tg_ts"]) > 0
    rec = json.loads((out / "Q4_0.json").read_text())
    assert (rec["bench_pp"], rec["bench_tg"], rec["bench_reps"]) == (32, 8, 2)
    # the speeds are what the bench pipeline measures for that file: llama-bench's statistic of its samples
    assert rec["tg_sd"] >= 0 and rec["pp_ts"] == float(rows[0]["pp_ts"])
    md = (out / "sweep.md").read_text().splitlines()
    assert md[0].endswith("| pp_ts | tg_ts |") and len(md[2].split("|")) == len(md[0].split("|"))
    # a rerun with the same tests measures nothing; other test sizes time the files again
    again = run_cli(plain + BENCH + ["--format", "csv"])
    assert again.stderr.count("already measured") == 2 and again.stdout == res.stdout
    other = run_cli(plain + ["--bench", "--bench-pp", "0", "--bench-tg", "4", "--bench-reps", "1"])
    assert other.exit_code == 0 and other.stderr.count("(bench)") == 2
    assert "| - |" in other.stdout                                 # no pp test: no pp speed
    assert {f: (out / f).stat().st_mtime_ns for f in mtimes} == mtimes


def test_sweep_bench_nothing_to_time(tiny, tmp_path):
    res = run_cli(["sweep", "-m", tiny, "--types", "Q8_0", "-o", tmp_path / "s", "--bench", "--bench-pp", "0",
                   "--bench-tg", "0"])
    assert res.exit_code == 2 and "nothing to time" in res.output
    assert not (tmp_path / "s").exists()


def test_remove_leftovers_takes_only_unheld_temporary_files(tmp_path):
    """A killed worker's temporary file (unlocked, however fresh) goes; a live writer's stays."""
    from quantkit.formats.atomic import AtomicWriter, remove_leftovers

    target = tmp_path / "Q4_0.gguf"
    dead = tmp_path / ".Q4_0.gguf.1-2.partial"
    dead.write_bytes(b"half")
    with AtomicWriter(target, 4) as w:
        w.write(b"live")
        assert remove_leftovers(target) == 1
        assert not dead.exists() and w.tmp.exists()
        w.commit()
    assert target.read_bytes() == b"live"
