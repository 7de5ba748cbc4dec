"""``quantkit sweep``: quantize one model several ways and measure each against the source (docs/sweep.md).

Points are file types (``Q4_K_M``: the llama.cpp mix) and target BPWs (``bpw4.5``: ``quantize
--target-bpw``). The source's logits over the evaluation text are computed once (llama-perplexity's
KL-divergence base file, ``base.kld``); every point is then quantized, and its size, BPW, PPL, KLD and
same-top-p measured against that base. Each finished point is recorded in ``DIR/<label>.json`` with a
key of its inputs (source and imatrix file identity, options, text, chunks): a rerun skips the points
whose record has the same key, so an interrupted sweep resumes where it stopped.

With ``--bench`` each point's file is also timed by the bench pipeline (llama-bench's pp and tg tests,
``bench_point``); the speeds are kept in the same record under a key of their own (the point's key and
the test sizes), so adding ``--bench`` to a finished sweep only times the files.

With ``--cluster ADDRESS`` the base logits and then the points are jobs on a Dask cluster
(``pipelines.cluster``): the records are written here as the jobs finish, the files by the workers
(through ``formats.atomic``, so a worker killed mid-job leaves no file under a real name; its hidden
temporary file is removed once the jobs are done).

The table (``sweep.md``, ``sweep.csv``, ``sweep.json``) and the Pareto plot (``sweep.png``: size vs KLD,
every point labelled, the frontier drawn; needs matplotlib, the ``quantkit[plot]`` extra) are written at
the end.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from quantkit.errors import QuantkitError
from quantkit.formats.atomic import write_bytes

Log = Callable[[str], None]
COLUMNS = ("label", "kind", "size_mib", "bpw", "ppl", "kld", "kld_unc", "same_top", "pareto")
#: with --bench: prompt processing and generation speed (tokens/s, llama-bench's avg_ts)
BENCH_COLUMNS = ("pp_ts", "tg_ts")


class SweepError(QuantkitError):
    """A sweep that cannot be run as asked."""


@dataclass(frozen=True)
class Point:
    label: str          # "Q4_K_M" or "bpw4.5"
    ftype: str          # the file type written in the metadata
    target_bpw: float | None = None

    @property
    def kind(self) -> str:
        return "target-bpw" if self.target_bpw is not None else "mix"


def parse_points(types: str, targets: str, target_ftype: str = "Q4_K_M") -> list[Point]:
    """Points from ``--types Q4_K_M,Q6_K`` and ``--target-bpw 3.5,4.5``."""
    from quantkit.errors import PolicyError
    from quantkit.typenames import parse_ftype

    points = []
    for t in (x.strip() for x in (types or "").split(",")):
        if t:
            try:
                points.append(Point(parse_ftype(t).name, t.upper()))
            except PolicyError as e:
                raise SweepError(str(e)) from None
    for t in (x.strip() for x in (targets or "").split(",")):
        if t:
            try:
                v = float(t)
            except ValueError:
                raise SweepError(f"--target-bpw takes comma-separated numbers, got {t!r}") from None
            if not 0 < v < 64:
                raise SweepError(f"--target-bpw {t}: must be between 0 and 64")
            points.append(Point(f"bpw{v:g}", target_ftype, v))
    if not points:
        raise SweepError("nothing to sweep: give --types and/or --target-bpw")
    labels = [p.label for p in points]
    if len(set(labels)) != len(labels):
        raise SweepError(f"a point is given twice: {', '.join(sorted({x for x in labels if labels.count(x) > 1}))}")
    return points


def file_identity(path: str | os.PathLike | None) -> str:
    """Path, size and modification time: what a rerun compares to decide a result still holds."""
    if path is None:
        return "-"
    st = os.stat(path)
    return f"{os.path.abspath(path)}:{st.st_size}:{st.st_mtime_ns}"


def point_key(point: Point, base_key: str, imatrix) -> str:
    doc = [base_key, file_identity(imatrix), point.label, point.ftype, point.target_bpw]
    return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class BenchSpec:
    """``--bench``: llama-bench's pp and tg tests (``-p``, ``-n``, ``-r``; 0 skips a test)."""
    n_prompt: int = 512
    n_gen: int = 128
    reps: int = 5

    def key(self, point_key: str, threads: int | None) -> str:
        doc = [point_key, self.n_prompt, self.n_gen, self.reps, threads]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:32]


def bench_point(path: Path, spec: BenchSpec, threads: int | None) -> dict:
    """Time one file with the bench pipeline (the sweep's one call into it): ``pp_ts``/``tg_ts`` are
    llama-bench's avg_ts of the pp and tg tests, ``*_sd`` their stddev; None for a test not run."""
    from quantkit.pipelines.bench import BenchParams, default_threads, run_bench

    params = BenchParams(models=[str(path)], n_prompt=[spec.n_prompt], n_gen=[spec.n_gen],
                         n_threads=[threads or default_threads()], reps=spec.reps)
    out = {"pp_ts": None, "pp_sd": None, "tg_ts": None, "tg_sd": None}
    for r in run_bench(params, []):
        kind = "pp" if r.inst.n_gen == 0 else "tg"
        out[f"{kind}_ts"], out[f"{kind}_sd"] = r.avg_ts, r.stdev_ts
    out.update(bench_pp=spec.n_prompt, bench_tg=spec.n_gen, bench_reps=spec.reps,
               bench_threads=params.n_threads[0])
    return out


@dataclass
class Sweep:
    model: Path
    imatrix: Path | None
    points: list[Point]
    out_dir: Path
    text_file: str | None = None
    n_chunks: int = 10
    n_ctx: int = 512
    threads: int | None = None
    bench: BenchSpec | None = None
    results: list[dict] = field(default_factory=list)

    @property
    def base_key(self) -> str:
        doc = [file_identity(self.model), file_identity(self.text_file), self.n_chunks, self.n_ctx]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:32]


def _base_ready(sw: Sweep) -> bool:
    keyf = sw.out_dir / "base.key"
    return (sw.out_dir / "base.kld").exists() and keyf.exists() and keyf.read_text().strip() == sw.base_key


def _base(sw: Sweep, log: Log) -> Path:
    """The source's log-probs over the evaluation text (made once, kept with its key)."""
    from quantkit.pipelines import chunks as ch
    from quantkit.pipelines import perplexity as pp

    path = sw.out_dir / "base.kld"
    if _base_ready(sw):
        log(f"sweep: base logits {path} already made for these inputs")
        return path
    text, where = ch.read_text(sw.text_file, "evaluation")
    model, tok, runner = ch.open_for_chunks(sw.model, sw.n_ctx, sw.n_ctx)
    with model:
        tokens = ch.tokenize(tok, text, sw.n_ctx, sw.text_file or "the built-in evaluation text")
        log(f"sweep: base logits of {sw.model} over {where}")
        res = pp.perplexity(runner, tokens, sw.n_ctx, sw.n_chunks, ch.add_bos_id(tok), base_out=path)
    write_bytes(sw.out_dir / "base.key", (sw.base_key + "\n").encode(), "the base logits' key")
    log(f"sweep: base PPL {res.ppl:.4f}")
    return path


def _quantize_and_measure(sw: Sweep, point: Point, base_path: Path, log: Log) -> dict:
    from quantkit.formats.logits import open_logits
    from quantkit.pipelines import perplexity as pp
    from quantkit.pipelines.chunks import add_bos_id, open_for_chunks
    from quantkit.pipelines.quantize import QuantizeOptions, quantize_file

    gguf_path = sw.out_dir / f"{point.label}.gguf"
    opts = QuantizeOptions(ftype=point.ftype, threads=sw.threads,
                           imatrix=None if sw.imatrix is None else str(sw.imatrix), target_bpw=point.target_bpw,
                           tensor_type_out=str(sw.out_dir / f"{point.label}.tensor-types.txt")
                           if point.target_bpw is not None else None)
    t0 = time.perf_counter()
    plan, _ = quantize_file(sw.model, gguf_path, opts, log=lambda s: log(s) if s.startswith("target-bpw") else None)
    t_quant = time.perf_counter() - t0
    base = open_logits(base_path)
    model, tok, runner = open_for_chunks(gguf_path, base.n_ctx, base.n_ctx)
    with model:
        res = pp.kl_divergence(runner, base, -1, add_bos_id(tok))
    s = res.stats()
    return {
        "label": point.label, "kind": point.kind, "ftype": point.ftype, "target_bpw": point.target_bpw,
        "file": gguf_path.name, "size": plan.size_out, "file_size": gguf_path.stat().st_size,
        "size_mib": plan.size_out / 1024 / 1024, "bpw": 8.0 * plan.size_out / max(1, plan.n_elements),
        "ppl": s["ppl"], "ppl_unc": s["ppl_unc"], "kld": s["kld"], "kld_unc": s["kld_unc"],
        "same_top": s["same_top"], "same_top_unc": s["same_top_unc"], "n_tokens": s["count"],
        "quantize_s": t_quant, "kld_s": res.seconds,
    }


def measure_point(sw: Sweep, point: Point, base_path: Path, rec: dict | None, log: Log) -> dict:
    """One point's record: quantized and measured unless ``rec`` (its record for the same inputs) is
    given, then timed when ``sw.bench`` asks for speeds the record does not hold."""
    if rec is None:
        rec = _quantize_and_measure(sw, point, base_path, log)
        rec["key"] = point_key(point, sw.base_key, sw.imatrix)
    if sw.bench is not None and rec.get("bench_key") != sw.bench.key(rec["key"], sw.threads):
        log(f"sweep: timing {point.label} (bench)")
        rec.update(bench_point(sw.out_dir / rec["file"], sw.bench, sw.threads))
        rec["bench_key"] = sw.bench.key(rec["key"], sw.threads)
    return rec


def _record(sw: Sweep, point: Point) -> dict | None:
    """The point's record when it was measured for these inputs (and its file is still there)."""
    rec_path = sw.out_dir / f"{point.label}.json"
    if not rec_path.exists():
        return None
    try:
        rec = json.loads(rec_path.read_text())
    except ValueError:
        return None
    if rec.get("key") == point_key(point, sw.base_key, sw.imatrix) and (sw.out_dir / rec.get("file", "")).exists():
        return rec
    return None


def outputs(sw: Sweep) -> list[Path]:
    """Every file the sweep writes in DIR before the table (each through formats.atomic)."""
    out = [sw.out_dir / "base.kld", sw.out_dir / "base.key"]
    for p in sw.points:
        out += [sw.out_dir / f"{p.label}{ext}" for ext in (".gguf", ".json", ".tensor-types.txt")]
    return out


# -- jobs on a Dask cluster (pipelines.cluster): module-level functions, run by the workers ---------

def _base_job(sw: Sweep) -> str:
    from quantkit.pipelines.cluster import worker_threads

    worker_threads()
    return str(_base(sw, lambda s: None))


def _point_job(sw: Sweep, point: Point, base_path: Path, rec: dict | None) -> dict:
    from quantkit.pipelines.cluster import worker_threads

    worker_threads()
    return measure_point(sw, point, base_path, rec, lambda s: None)


def run_sweep(sw: Sweep, log: Log = lambda s: None, progress: Callable[[int, int, str], None] | None = None,
              cluster: str | None = None) -> list[dict]:
    """Measure every point (skipping those already measured for the same inputs), here or as jobs on
    the Dask cluster at ``cluster``; then mark the Pareto frontier."""
    sw.out_dir.mkdir(parents=True, exist_ok=True)
    if sw.imatrix is None and any(p.target_bpw is not None for p in sw.points):
        raise SweepError("target-bpw points need --imatrix")
    n = len(sw.points)
    done: dict[str, dict] = {}
    todo: dict[str, tuple[Point, dict | None]] = {}
    for point in sw.points:
        rec = _record(sw, point)
        if rec is not None and (sw.bench is None or rec.get("bench_key") == sw.bench.key(rec["key"], sw.threads)):
            log(f"sweep: {point.label} already measured for these inputs")
            done[point.label] = rec
            if progress:
                progress(len(done), n, point.label)
        else:
            todo[point.label] = (point, rec)

    def finish(label: str, rec: dict) -> None:
        write_bytes(sw.out_dir / f"{label}.json", (json.dumps(rec, indent=1) + "\n").encode(), "the sweep record")
        done[label] = rec
        if progress:
            progress(len(done), n, label)

    if cluster is None:
        base_path = _base(sw, log)
        for i, (label, (point, rec)) in enumerate(todo.items()):
            log(f"sweep: [{len(done) + 1}/{n}] {label}")
            finish(label, measure_point(sw, point, base_path, rec, log))
    elif todo:
        _run_on_cluster(sw, cluster, todo, finish, log)
    results = [done[p.label] for p in sw.points]
    mark_pareto(results)
    sw.results = results
    return results


def _run_on_cluster(sw: Sweep, address: str, todo: dict, finish: Callable[[str, dict], None], log: Log) -> None:
    from quantkit.formats.atomic import remove_leftovers
    from quantkit.pipelines import cluster as cl

    absolute = lambda p: None if p is None else type(p)(os.path.abspath(p))  # noqa: E731
    sw = replace(sw, model=absolute(sw.model), imatrix=absolute(sw.imatrix), text_file=absolute(sw.text_file),
                 out_dir=absolute(sw.out_dir))           # the workers' working directories may differ
    client = cl.connect(address)
    try:
        cl.check_storage(client, [p for p in (sw.model, sw.imatrix, sw.text_file, sw.out_dir) if p is not None])
        base_path = sw.out_dir / "base.kld"
        if _base_ready(sw):
            log(f"sweep: base logits {base_path} already made for these inputs")
        else:
            log(f"sweep: base logits of {sw.model} on the cluster at {address}")
            cl.run_jobs(client, _base_job, {"base": (sw,)}, prefix="quantkit-sweep",
                        on_result=lambda k, r: log(f"sweep: base logits in {r}"))
        log(f"sweep: {len(todo)} points on the cluster at {address}")
        cl.run_jobs(client, _point_job, {label: (sw, p, base_path, rec) for label, (p, rec) in todo.items()},
                    prefix="quantkit-sweep", on_result=finish)
    finally:
        client.close()
        for path in outputs(sw):      # a killed worker's temporary files: nobody writes them any more
            remove_leftovers(path)


def mark_pareto(rows: list[dict]) -> None:
    """``pareto`` True for the points no other point beats on both size and KLD."""
    for r in rows:
        r["pareto"] = not any((o["size"] <= r["size"] and o["kld"] < r["kld"])
                              or (o["size"] < r["size"] and o["kld"] <= r["kld"]) for o in rows if o is not r)


def _fmt(r: dict, col: str) -> str:
    v = r.get(col)
    if col == "pareto":
        return "*" if v else ""
    if col in ("size_mib", "ppl"):
        return f"{v:.2f}" if col == "size_mib" else f"{v:.4f}"
    if col == "bpw":
        return f"{v:.3f}"
    if col in ("kld", "kld_unc"):
        return f"{v:.5f}"
    if col in BENCH_COLUMNS:
        return "-" if v is None else f"{v:.2f}"
    if col == "same_top":
        return f"{100 * v:.2f} %"
    return str(v)


def table(rows: list[dict], fmt: str, bench: bool = False) -> str:
    """The results as ``md``, ``csv`` or ``json``, smallest file first; ``bench`` adds the speed columns
    (json always holds every field of the records)."""
    rows = sorted(rows, key=lambda r: r["size"])
    if fmt == "json":
        return json.dumps(rows, indent=1) + "\n"
    cols = COLUMNS + (BENCH_COLUMNS if bench else ())
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(cols)
        for r in rows:
            w.writerow([r.get(c) for c in cols])
        return buf.getvalue()
    head = "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols) + "\n"
    return head + "".join("| " + " | ".join(_fmt(r, c) for c in cols) + " |\n" for r in rows)


def plot(rows: list[dict], path: Path, title: str) -> bool:
    """The Pareto plot (size vs KLD) as PNG; False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for kind, marker, color in (("mix", "o", "tab:blue"), ("target-bpw", "s", "tab:red")):
        pts = [r for r in rows if r["kind"] == kind]
        if pts:
            ax.scatter([r["size_mib"] for r in pts], [r["kld"] for r in pts], marker=marker, color=color,
                       label="llama.cpp mix" if kind == "mix" else "--target-bpw", zorder=3)
    front = sorted((r for r in rows if r.get("pareto")), key=lambda r: r["size"])
    ax.plot([r["size_mib"] for r in front], [r["kld"] for r in front], "--", color="gray", label="Pareto frontier")
    for r in rows:
        ax.annotate(f"{r['label']} ({r['bpw']:.2f})", (r["size_mib"], r["kld"]), textcoords="offset points",
                    xytext=(4, 4), fontsize=7)
    ax.set_xlabel("tensor data (MiB)")
    ax.set_ylabel("KL divergence vs the source (mean)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    write_bytes(path, buf.getvalue(), "the plot")
    return True
