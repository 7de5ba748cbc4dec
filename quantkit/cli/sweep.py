"""``quantkit sweep``: several quantizations of one model, measured against it, as a table and a Pareto plot."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from quantkit.cli import main
from quantkit.cli.options import chunks_option, ctx_option, model_option, text_option, threads_option


@main.command()
@model_option(required=True, metavar="FILE",
              help="The source GGUF (F16/BF16/F32), the reference every point is measured against.")
@click.option("--imatrix", "imatrix_path", type=click.Path(exists=True, dir_okay=False), default=None, metavar="FILE",
              help="Importance matrix used for every point (needed by --target-bpw points).")
@click.option("--types", default="", metavar="T1,T2,...",
              help="File types to quantize to with llama.cpp's mixes, e.g. Q2_K,Q3_K_M,Q4_K_M,Q5_K_M,Q6_K,Q8_0.")
@click.option("--target-bpw", "targets", default="", metavar="B1,B2,...",
              help="Target BPWs to quantize to with `quantize --target-bpw` (file type --target-ftype).")
@click.option("--target-ftype", default="Q4_K_M", show_default=True, metavar="TYPE",
              help="The file type recorded in the metadata of the --target-bpw points.")
@text_option(type=click.Path(exists=True, dir_okay=False),
             help="Evaluation text (default: the built-in evaluation half).")
@chunks_option(type=click.IntRange(min=1), default=10, help="Chunks of the text to evaluate.")
@ctx_option(type=click.IntRange(min=16), default=512, show_default=True, help="Tokens per chunk.")
@click.option("--format", "fmt", type=click.Choice(["md", "csv", "json"]), default="md", show_default=True,
              help="Format of the table printed on stdout (all three are written to DIR).")
@click.option("--bench", is_flag=True,
              help="Also time every file as `quantkit bench` does (llama-bench's pp and tg tests): columns pp_ts "
                   "and tg_ts in tokens/s.")
@click.option("--bench-pp", type=click.IntRange(min=0), default=512, show_default=True, metavar="N",
              help="With --bench: prompt tokens of the pp test (0: no pp test).")
@click.option("--bench-tg", type=click.IntRange(min=0), default=128, show_default=True, metavar="N",
              help="With --bench: generated tokens of the tg test (0: no tg test).")
@click.option("--bench-reps", type=click.IntRange(min=1), default=5, show_default=True, metavar="N",
              help="With --bench: repetitions of each test.")
@click.option("--cluster", "cluster", default=None, metavar="ADDRESS",
              help="Run the points as jobs on the Dask distributed cluster whose scheduler is at ADDRESS "
                   "(tcp://host:8786; needs quantkit[cluster]); every worker must see the files at the same "
                   "paths (docs/sweep.md).")
@click.option("-o", "--output-dir", "out_dir", type=click.Path(file_okay=False), required=True, metavar="DIR",
              help="Where the quantized files, the per-point records, the table and the plot go.")
@threads_option
def sweep(model_path, imatrix_path, types, targets, target_ftype, text_file, n_chunks, n_ctx, fmt, bench, bench_pp,
          bench_tg, bench_reps, cluster, out_dir, threads):
    """Quantize a model to several types and target BPWs and measure each: size, BPW, PPL, KLD and
    same-top-p against the source's logits (computed once). Rerunning skips the points already measured
    for the same inputs. Writes DIR/sweep.{md,csv,json} and, with matplotlib (quantkit[plot]), the
    Pareto plot DIR/sweep.png.
    """
    from quantkit.pipelines import sweep as sp
    from quantkit.formats.atomic import write_bytes

    if bench and bench_pp == bench_tg == 0:
        raise click.UsageError("--bench with --bench-pp 0 and --bench-tg 0 has nothing to time")
    if cluster is not None:
        from quantkit.pipelines.cluster import EXTRA_NOTE, available

        if not available():
            raise click.ClickException(EXTRA_NOTE)
    try:
        points = sp.parse_points(types, targets, target_ftype)
    except sp.SweepError as e:
        raise click.UsageError(str(e)) from None
    if imatrix_path is None and any(p.target_bpw is not None for p in points):
        raise click.UsageError("--target-bpw points need --imatrix FILE")
    err = lambda s: click.echo(s, err=True)  # noqa: E731
    sw = sp.Sweep(Path(model_path), Path(imatrix_path) if imatrix_path else None, points, Path(out_dir),
                  text_file, n_chunks, n_ctx, threads,
                  sp.BenchSpec(bench_pp, bench_tg, bench_reps) if bench else None)

    def progress(i, n, label):
        err(f"sweep: {i}/{n} points done ({label})")

    rows = sp.run_sweep(sw, log=err, progress=progress, cluster=cluster)
    d = Path(out_dir)
    for f in ("md", "csv", "json"):
        write_bytes(d / f"sweep.{f}", sp.table(rows, f, bench).encode(), f"the {f} table")
    title = f"{Path(model_path).name}: KLD vs size, {n_chunks} chunks of {n_ctx}"
    if sp.plot(rows, d / "sweep.png", title):
        err(f"wrote {d / 'sweep.png'}")
    else:
        err("note: matplotlib is not installed (pip install 'quantkit[plot]'): no plot, the table is in "
            f"{d / 'sweep.md'}")
    sys.stdout.write(sp.table(rows, fmt, bench))
