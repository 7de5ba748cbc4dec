"""``quantkit perplexity``: llama-perplexity's PPL and KL-divergence modes."""

from __future__ import annotations

import sys

import click

from quantkit.cli import PplLine, bar_logger, chunk_bar, main
from quantkit.cli.options import batch_option, chunks_option, ctx_option, model_option, text_option, threads_option

EPILOG = """\b
Without -f the built-in evaluation text is used: the second half of the standard library's
pydoc_data.topics, split as calibration/README.md describes (the imatrix command calibrates on the
first half, so the two never overlap).

\b
KL divergence, as llama.cpp:
  1. quantkit perplexity -m base.gguf [-f text] -c 512 --kl-divergence-base base.kld
  2. quantkit perplexity -m quant.gguf --kl-divergence-base base.kld --kl-divergence
The base file has llama-perplexity's layout, so either tool can write it and either can read it.
"""


@main.command(epilog=EPILOG)
@model_option()
@text_option(help="UTF-8 text to evaluate (default: the built-in evaluation text, see below).")
@ctx_option(type=click.IntRange(min=4), default=None,
            help="Chunk length in tokens (default 512; with --kl-divergence, the base file's).")
@batch_option()
@chunks_option(help="Evaluate at most N chunks (-1 = all).")
@click.option("--kl-divergence-base", "--save-all-logits", "base_file", type=click.Path(dir_okay=False),
              default=None, metavar="FILE",
              help="Write the base model's log-probabilities to FILE (or read them with --kl-divergence).")
@click.option("--kl-divergence", "kl", is_flag=True,
              help="Compare with --kl-divergence-base FILE: KL divergence, Δp and same-top-p statistics. "
                   "The tokens come from FILE; -f is not needed.")
@click.option("--state", "state_file", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Keep every chunk's result in FILE (written atomically after each chunk). If the run is "
                   "interrupted, the same command continues after the last chunk in FILE and prints the "
                   "uninterrupted run's numbers; FILE is removed when the run completes. Not with "
                   "--kl-divergence-base when writing a base file.")
@threads_option
def perplexity(model_path, text_file, n_ctx, n_batch, n_chunks, base_file, kl, state_file, threads):
    """Perplexity of a model over a text, scored like llama-perplexity (second half of each chunk).

    Progress ([i]ppl, ...) and the results go to stdout; timings and the progress bar to stderr.
    """
    from quantkit.formats.sigbus import install
    from quantkit.pipelines import chunks as ch
    from quantkit.pipelines import perplexity as pp

    if kl and not base_file:
        raise click.UsageError("--kl-divergence needs --kl-divergence-base FILE (the base model's log-probs)")
    if state_file and base_file and not kl:
        raise click.UsageError("--state cannot resume writing a base logits file (--kl-divergence-base without "
                               "--kl-divergence)")
    try:
        ch.check_batch(n_ctx or 512, n_batch)
    except ch.ChunkError as e:
        raise click.UsageError(str(e)) from None
    install()
    err = lambda s: click.echo(s, err=True)  # noqa: E731

    if kl:
        if text_file:
            err(f"note: --kl-divergence reads the tokens from {base_file}; -f {text_file} is not used")
        from quantkit.formats.logits import open_logits

        base = open_logits(base_file)
        model, tok, runner = ch.open_for_chunks(model_path, base.n_ctx, n_batch)
        with model:
            pp.check_base(base, model.config.n_vocab, model.config.n_ctx_train, n_ctx)
            n = base.n_chunk if n_chunks < 0 else min(n_chunks, base.n_chunk)
            err(f"kl_divergence: computing over {n} chunks, n_ctx={base.n_ctx}, batch_size={n_batch}, "
                f"n_seq={max(1, n_batch // base.n_ctx)}")
            bar = chunk_bar(n)
            lines = []

            def on_chunk(i, line):
                if i == 0:
                    _out(bar, lines, "")
                    _out(bar, lines, pp.KLD_HEADER)
                _out(bar, lines, line)
                if bar is not None:
                    bar.update(1)

            state = _state(state_file, model, base.tokens, mode="kl-divergence", n_ctx=base.n_ctx, n_chunk=n,
                           base=str(base.path.resolve()), base_size=base.path.stat().st_size)
            res = pp.kl_divergence(runner, base, n_chunks, ch.add_bos_id(tok), log=bar_logger(bar), on_chunk=on_chunk,
                                   state=state, check=model.gguf.check_unchanged)
            if state is not None:
                state.remove()
            _close(bar, lines)
            click.echo("")
            for line in res.report():
                click.echo(line)
            err(f"\nkl_divergence: {res.sums.count} tokens in {res.seconds:.2f} s "
                f"({res.sums.count / max(res.seconds, 1e-9):.1f} scored tokens/s, "
                f"{res.n_chunk * res.n_ctx / max(res.seconds, 1e-9):.1f} evaluated tokens/s)")
        return

    n_ctx = n_ctx or 512
    text, where = ch.read_text(text_file, "evaluation")
    if base_file:
        from quantkit.formats.atomic import preflight

        preflight(base_file, None, "the base logits file")
    model, tok, runner = ch.open_for_chunks(model_path, n_ctx, n_batch)
    with model:
        tokens = ch.tokenize(tok, text, n_ctx, text_file or "the built-in evaluation text")
        n = tokens.size // n_ctx if n_chunks < 0 else min(n_chunks, tokens.size // n_ctx)
        err(f"perplexity: tokenized {where}: {tokens.size} tokens")
        if base_file:
            err(f"perplexity: saving all logits to {base_file}")
        err(f"perplexity: calculating perplexity over {n} chunks, n_ctx={n_ctx}, batch_size={n_batch}, "
            f"n_seq={max(1, n_batch // n_ctx)}")
        bar = chunk_bar(n)
        on_chunk = PplLine(bar)

        state = _state(state_file, model, tokens, mode="perplexity", n_ctx=n_ctx, n_chunk=n)
        res = pp.perplexity(runner, tokens, n_ctx, n_chunks, ch.add_bos_id(tok), base_out=base_file,
                            log=bar_logger(bar), on_chunk=on_chunk, state=state, check=model.gguf.check_unchanged)
        if state is not None:
            state.remove()
        on_chunk.close()
        click.echo(res.final_line())
        err(f"\nperplexity: {res.count} tokens scored in {res.seconds:.2f} s "
            f"({res.n_chunk * n_ctx / max(res.seconds, 1e-9):.1f} evaluated tokens/s)")
        if base_file:
            err(f"wrote {base_file}")


def _state(path, model, tokens, **settings):
    """The resume state of this run (loaded when FILE holds one), or None without --state."""
    if not path:
        return None
    from quantkit.pipelines.chunks import ChunkState, run_identity

    state = ChunkState(path, run_identity(model.path, tokens, **settings)).load()
    if state.records:
        click.echo(f"resume: {path} holds {len(state.records)} chunk(s); continuing from chunk "
                   f"{len(state.records) + 1}", err=True)
    return state


def _out(bar, held: list, line: str) -> None:
    """A result line on stdout; held back while a progress bar shares the terminal."""
    if bar is not None and sys.stdout.isatty():
        held.append(line)
    else:
        click.echo(line)


def _close(bar, held: list) -> None:
    if bar is not None:
        bar.close()
    for line in held:
        click.echo(line)
