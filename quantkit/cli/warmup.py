"""``quantkit warmup``: compile the kernels ahead of time, so that no later command waits for numba."""

from __future__ import annotations

import time

import click

from quantkit.cli import main
from quantkit.cli.options import threads_option


@main.command()
@click.option("-m", "--model", "models", multiple=True, type=click.Path(exists=True, dir_okay=False),
              help="Also compile what run / bench / perplexity need for this GGUF's weight types "
                   "(repeatable; default: the bundled SmolLM2 model when it is installed).")
@click.option("--no-codecs", is_flag=True, help="Skip the quantize / dequantize kernels of every type.")
@threads_option
def warmup(models, no_codecs, threads):
    """Compile (or load from numba's cache) the kernels the commands use.

    The first run of a command compiles its kernels, tens of seconds each; they are cached on disk
    (NUMBA_CACHE_DIR) for every later run. This does that work now: the codecs of every type (what
    `quantize` compiles) and, for each model, what `run`, `bench` and `perplexity` compile for its set
    of weight types. A second warmup only loads the cache.
    """
    from quantkit.errors import QuantkitError
    from quantkit.formats.locate import bundled_model
    from quantkit.pipelines.warmup import warm_codecs, warm_model

    if not models:
        try:
            models = (str(bundled_model()),)
        except QuantkitError:
            models = ()
    t0 = time.perf_counter()
    if not no_codecs:
        names = warm_codecs()
        click.echo(f"codecs ready: {', '.join(names)} ({time.perf_counter() - t0:.1f} s)", err=True)
    for m in models:
        t1 = time.perf_counter()
        warm_model(m)
        click.echo(f"model kernels ready: {m} ({time.perf_counter() - t1:.1f} s)", err=True)
