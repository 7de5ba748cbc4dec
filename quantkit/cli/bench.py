"""``quantkit bench``: llama-bench's command line (the CPU subset), its procedure and its printers."""

from __future__ import annotations

import sys

import click

from quantkit.cli import main
from quantkit.cli.lists import parse_bool_list, parse_int_range, parse_pair

FORMATS = ["csv", "json", "jsonl", "md", "sql"]

EPILOG = """\b
Every test parameter (-m -p -n -pg -d -b -ub -t -C --cpu-strict) takes comma lists and can be repeated;
integer lists take ranges FIRST-LAST, FIRST-LAST+STEP or FIRST-LAST*MULT. quantkit runs the Cartesian
product, model outermost (each model is loaded once). Each -p value is a prompt test (ppN), each -n value
a generation test (tgN), each -pg pair a combined test; 0 skips.

\b
t/s per repetition = (n_prompt + n_gen) / seconds, reported as mean ± sample stddev. Numba compilation
happens in an untimed priming pass and is reported apart (compile_s in csv/json/jsonl/sql, -v on stderr),
with the peak RSS (peak_rss_mib) and its bound, model file + KV cache + 150 MiB (rss_bound_mib).
"""


def _ints(opt: str, values: tuple[str, ...]) -> list[int] | None:
    out: list[int] = []
    for v in values:
        try:
            out += parse_int_range(v)
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint=f"'{opt}'") from None
    return out or None


def _strs(values: tuple[str, ...]) -> list[str] | None:
    out = [s for v in values for s in v.split(",")]
    return out or None


@main.command(epilog=EPILOG)
@click.option("-m", "--model", "models", multiple=True, metavar="FILE[,FILE]",
              help="GGUF model(s) (default: the bundled SmolLM2-135M-Instruct Q4_1).")
@click.option("-p", "--n-prompt", multiple=True, metavar="N", help="Prompt sizes (default: 512; 0 = none).")
@click.option("-n", "--n-gen", multiple=True, metavar="N", help="Generation sizes (default: 128; 0 = none).")
@click.option("-pg", "pg", multiple=True, metavar="PP,TG", help="Combined prompt + generation test (repeatable).")
@click.option("-d", "--n-depth", multiple=True, metavar="N",
              help="Tokens already in the context before the timed part (default: 0); computed once, then "
                   "restored for every repetition.")
@click.option("-b", "--batch-size", multiple=True, metavar="N", help="Logical batch: tokens per decode call "
              "(default: 2048).")
@click.option("-ub", "--ubatch-size", multiple=True, metavar="N",
              help="Physical batch: rows per forward pass (default: 512).")
@click.option("-t", "--threads", multiple=True, metavar="N",
              help="Threads (default: the number of physical cores).")
@click.option("-C", "--cpu-mask", multiple=True, metavar="HEX",
              help="Pin threads to the CPUs in this hex mask (default: 0x0 = no pinning); Linux only.")
@click.option("--cpu-strict", multiple=True, metavar="0|1",
              help="1: pin each thread to one CPU of the mask, round-robin (default: 0).")
@click.option("-r", "--repetitions", type=click.IntRange(min=1), default=5, show_default=True,
              help="Timed repetitions per test.")
@click.option("--no-warmup", is_flag=True, help="Skip the warmup run before each test's repetitions.")
@click.option("-o", "--output", "output", type=click.Choice(FORMATS), default="md", show_default=True,
              help="Printer for stdout.")
@click.option("-oe", "--output-err", "output_err", type=click.Choice(FORMATS + ["none"]), default="none",
              show_default=True, help="Second printer, for stderr.")
@click.option("--progress", is_flag=True, help="Print llama-bench's progress lines on stderr.")
@click.option("-v", "--verbose", is_flag=True,
              help="Log model loads, compile time and peak RSS against its bound on stderr.")
def bench(models, n_prompt, n_gen, pg, n_depth, batch_size, ubatch_size, threads, cpu_mask, cpu_strict,
          repetitions, no_warmup, output, output_err, progress, verbose):
    """Measure prompt processing (pp) and generation (tg) speed like llama-bench."""
    from quantkit.pipelines.bench import BenchParams, instances, make_printer, parse_cpu_mask, run_bench

    p = BenchParams(reps=repetitions, no_warmup=no_warmup, progress=progress, verbose=verbose)
    for name, opt, vals in (("n_prompt", "-p", n_prompt), ("n_gen", "-n", n_gen), ("n_depth", "-d", n_depth),
                            ("n_batch", "-b", batch_size), ("n_ubatch", "-ub", ubatch_size),
                            ("n_threads", "-t", threads)):
        v = _ints(opt, vals)
        if v is not None:
            setattr(p, name, v)
    for item in pg:
        try:
            p.n_pg.append(parse_pair(item))
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'-pg'") from None
    masks = _strs(cpu_mask)
    if masks:
        for m in masks:
            try:
                parse_cpu_mask(m)
            except ValueError as e:
                raise click.BadParameter(str(e), param_hint="'-C'") from None
        p.cpu_mask = masks
    if cpu_strict:
        try:
            p.cpu_strict = [b for v in cpu_strict for b in parse_bool_list(v)]
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="'--cpu-strict'") from None
    if models:
        p.models = _strs(models)
    else:
        from quantkit.formats.locate import bundled_model

        p.models = [str(bundled_model())]

    printers = [make_printer(output, sys.stdout)]
    if output_err != "none":
        printers.append(make_printer(output_err, sys.stderr))

    def err(line: str) -> None:
        click.echo(line, err=True)

    bar = None
    on_test = None
    if not progress and not verbose and output_err == "none" and sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=len(instances(p)), desc="bench", unit="test", leave=False, file=sys.stderr)
        on_test = lambda r: bar.update(1)  # noqa: E731
    try:
        run_bench(p, printers, progress=err if progress else None, log=err if verbose else None, on_test=on_test)
    finally:
        if bar is not None:
            bar.close()
