"""``quantkit sweep``: quantize one model several ways and measure each against the source (docs/sweep.md).

Points are file types (``Q4_K_M``: the llama.cpp mix) and target BPWs (``bpw4.5``: ``quantize
--target-bpw``). The source's logits over the evaluation text are computed once (llama-perplexity's
KL-divergence base file, ``base.kld``); every point is then quantized, and its size, BPW, PPL, KLD and
same-top-p measured against that base. Each finished point is recorded in ``DIR/<label>.json`` with a
key of its inputs (source and imatrix file identity, options, text, chunks): a rerun skips the points
whose record has the same key, so an interrupted sweep resumes where it stopped.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from quantkit.errors import QuantkitError
from quantkit.formats.atomic import write_bytes

Log = Callable[[str], None]
COLUMNS = ("label", "kind", "size_mib", "bpw", "ppl", "kld", "kld_unc", "same_top", "pareto")


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
    from quantkit.policy import PolicyError, parse_ftype

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
    results: list[dict] = field(default_factory=list)

    @property
    def base_key(self) -> str:
        doc = [file_identity(self.model), file_identity(self.text_file), self.n_chunks, self.n_ctx]
        return hashlib.sha256(json.dumps(doc).encode()).hexdigest()[:32]


def _base(sw: Sweep, log: Log) -> Path:
    """The source's log-probs over the evaluation text (made once, kept with its key)."""
    from quantkit.pipelines import chunks as ch
    from quantkit.pipelines import perplexity as pp

    path, keyf = sw.out_dir / "base.kld", sw.out_dir / "base.key"
    if path.exists() and keyf.exists() and keyf.read_text().strip() == sw.base_key:
        log(f"sweep: base logits {path} already made for these inputs")
        return path
    text, where = ch.read_text(sw.text_file, "evaluation")
    model, tok, runner = ch.open_for_chunks(sw.model, sw.n_ctx, sw.n_ctx)
    with model:
        tokens = ch.tokenize(tok, text, sw.n_ctx, sw.text_file or "the built-in evaluation text")
        log(f"sweep: base logits of {sw.model} over {where}")
        res = pp.perplexity(runner, tokens, sw.n_ctx, sw.n_chunks, ch.add_bos_id(tok), base_out=path)
    keyf.write_text(sw.base_key + "\n")
    log(f"sweep: base PPL {res.ppl:.4f}")
    return path


def _measure(sw: Sweep, point: Point, base_path: Path, log: Log) -> dict:
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


def run_sweep(sw: Sweep, log: Log = lambda s: None, progress: Callable[[int, int, str], None] | None = None) -> list[dict]:
    """Measure every point (skipping those already measured for the same inputs); then mark the Pareto
    frontier and write the table and the plot."""
    sw.out_dir.mkdir(parents=True, exist_ok=True)
    if sw.imatrix is None and any(p.target_bpw is not None for p in sw.points):
        raise SweepError("target-bpw points need --imatrix")
    base_path = _base(sw, log)
    results = []
    for i, point in enumerate(sw.points):
        rec_path = sw.out_dir / f"{point.label}.json"
        key = point_key(point, sw.base_key, sw.imatrix)
        if rec_path.exists():
            try:
                rec = json.loads(rec_path.read_text())
            except ValueError:
                rec = {}
            if rec.get("key") == key and (sw.out_dir / rec.get("file", "")).exists():
                log(f"sweep: {point.label} already measured for these inputs")
                results.append(rec)
                if progress:
                    progress(i + 1, len(sw.points), point.label)
                continue
        log(f"sweep: [{i + 1}/{len(sw.points)}] {point.label}")
        rec = _measure(sw, point, base_path, log)
        rec["key"] = key
        write_bytes(rec_path, (json.dumps(rec, indent=1) + "\n").encode(), "the sweep record")
        results.append(rec)
        if progress:
            progress(i + 1, len(sw.points), point.label)
    mark_pareto(results)
    sw.results = results
    return results


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
    if col == "same_top":
        return f"{100 * v:.2f} %"
    return str(v)


def table(rows: list[dict], fmt: str) -> str:
    """The results as ``md``, ``csv`` or ``json``, smallest file first."""
    rows = sorted(rows, key=lambda r: r["size"])
    if fmt == "json":
        return json.dumps(rows, indent=1) + "\n"
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(COLUMNS)
        for r in rows:
            w.writerow([r.get(c) for c in COLUMNS])
        return buf.getvalue()
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join("| " + " | ".join(_fmt(r, c) for c in COLUMNS) + " |\n" for r in rows)


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
