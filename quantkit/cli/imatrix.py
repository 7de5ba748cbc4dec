"""``quantkit imatrix``: llama-imatrix's collection, combine/convert and statistics modes."""

from __future__ import annotations

import click

from quantkit.cli import PplLine, bar_logger, chunk_bar, main
from quantkit.cli.options import batch_option, chunks_option, ctx_option, model_option, text_option, threads_option

EPILOG = """\b
Modes, as llama-imatrix:
  collect     quantkit imatrix [-m model.gguf] [-f text.txt] [-o imatrix.gguf]
  continue    quantkit imatrix -m model.gguf -f more.txt --in-file old.gguf [--chunk N]
  combine     quantkit imatrix --in-file a.gguf --in-file b.dat -o both.gguf
  convert     quantkit imatrix --in-file a.gguf --output-format dat -o a.dat
  statistics  quantkit imatrix --in-file a.gguf --show-statistics

\b
Without -f (and without --in-file) the built-in calibration text is used: the first half of the
standard library's pydoc_data.topics, split as calibration/README.md describes (perplexity evaluates
on the other half). With --in-file and no -f the inputs are only combined; add --builtin-text to
continue collecting on the built-in text instead.
"""


def _in_files(values) -> list[str]:
    out = []
    for v in values:
        out += [s.strip() for s in v.split(",") if s.strip()]
    return out


@main.command(epilog=EPILOG)
@model_option()
@text_option(help="UTF-8 calibration text (default: the built-in calibration text, see below).")
@click.option("--builtin-text", is_flag=True,
              help="Collect on the built-in calibration text even though --in-file is given.")
@click.option("-o", "--output-file", "out", default="imatrix.gguf", show_default=True, metavar="FILE",
              help="Output file (written atomically).")
@click.option("--output-format", "fmt", type=click.Choice(["gguf", "dat"]), default=None,
              help="gguf (default) or llama.cpp's legacy dat.")
@ctx_option(type=click.IntRange(min=16), default=512, show_default=True,
            help="Chunk length in tokens (context per sequence).")
@batch_option()
@chunks_option(help="Process at most N chunks (-1 = all).")
@click.option("--chunk", "--from-chunk", "from_chunk", type=click.IntRange(min=0), default=0, show_default=True,
              help="Skip the first N chunks of the text.")
@click.option("-ofreq", "--output-frequency", "out_freq", type=click.IntRange(min=1), default=10, show_default=True,
              help="Save the output every N chunks.")
@click.option("--save-frequency", "save_freq", type=click.IntRange(min=0), default=0, show_default=True,
              help="Every N chunks also write a snapshot <out>.at_<chunk> (0 = never).")
@click.option("--process-output", is_flag=True, help="Also collect output.weight (when the model has its own).")
@click.option("--ppl/--no-ppl", "compute_ppl", default=True, show_default=True,
              help="Compute the perplexity of the second half of each chunk while collecting.")
@click.option("--in-file", "in_files", multiple=True, metavar="FILE[,FILE...]",
              help="Imatrix file(s), GGUF or dat, to load first (repeatable or comma-separated): "
                   "combine, convert, or continue collecting on top.")
@click.option("--show-statistics", is_flag=True,
              help="Print per-tensor and per-layer statistics of exactly one --in-file and exit.")
@click.option("--resume", is_flag=True,
              help="Continue an interrupted run from its last save in -o (saved every -ofreq chunks, with "
                   "imatrix.chunk_count): run the same command again with --resume. The result is the "
                   "uninterrupted run's, byte for byte (the PPL printed covers the new chunks only).")
@click.option("--parse-special", is_flag=True, help="Tokenize special tokens written in the text.")
@click.option("--cluster", default=None, metavar="ADDRESS",
              help="Collect on the Dask distributed cluster whose scheduler is at ADDRESS (tcp://host:8786; needs "
                   "quantkit[cluster]), chunk ranges as jobs; the merged file is the one-process run's, byte for "
                   "byte. The model and text must be at the same paths on every worker.")
@click.option("--chunks-per-job", type=click.IntRange(min=1), default=None, metavar="N",
              help="With --cluster: chunks per job (default: two jobs per worker).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
@threads_option
def imatrix(model_path, text_file, builtin_text, out, fmt, n_ctx, n_batch, n_chunks, from_chunk, out_freq,
            save_freq, process_output, compute_ppl, in_files, show_statistics, resume, parse_special, cluster, chunks_per_job,
            quiet, threads):
    """Collect an importance matrix (llama-imatrix): per weight, the sum over tokens of each input
    column's squared activation, and the token count. quantkit quantize --imatrix reads the result.
    """
    from quantkit.pipelines import chunks as ch
    from quantkit.pipelines import imatrix as im

    files = _in_files(in_files)
    err = lambda s: click.echo(s, err=True)  # noqa: E731
    try:
        ch.check_batch(n_ctx, n_batch)
    except ch.ChunkError as e:
        raise click.UsageError(str(e)) from None

    if cluster is not None and ((files and text_file is None and not builtin_text) or show_statistics):
        raise click.UsageError("--cluster splits a collection; combining, converting or statistics have none")
    if show_statistics:
        if len(files) != 1:
            raise click.UsageError("--show-statistics needs exactly one --in-file")
        from quantkit.formats.imatrix import load_imatrix
        from quantkit.pipelines.imatrix_stats import statistics

        for line in statistics(load_imatrix(im.file_or_error(files[0])), n_ctx):
            click.echo(line)
        return

    save_opts = im.SaveOptions(out=out, fmt=fmt)
    if resume and files and text_file is None and not builtin_text:
        raise click.UsageError("--resume continues a collection; combining files has nothing to resume")
    if files and text_file is None and not builtin_text:
        # combine / convert: no model, no text
        for f in files:
            im.file_or_error(f)
        acc = im.load_inputs(files, n_ctx, log=err)
        err(f"No text given; {'converting' if len(files) == 1 else 'combining'} {len(files)} file(s) "
            f"into '{out}'")
        im.check_output_name(save_opts, err)
        p = im.save(acc, list(acc.datasets), save_opts, log=err)
        err(f"wrote {p} ({len(acc.sums)} entries, {acc.last_chunk()} chunks of {n_ctx})")
        return

    if cluster is not None:
        from quantkit.pipelines.cluster import EXTRA_NOTE, available

        if not available():
            raise click.ClickException(EXTRA_NOTE)
    from quantkit.formats.atomic import preflight
    from quantkit.formats.sigbus import install

    preflight(out, None, "the imatrix")         # another run writing it, a missing folder: refuse now
    install()
    text, dataset = ch.read_text(text_file, "calibration")
    acc = im.load_inputs([im.file_or_error(f) for f in files], n_ctx, log=err)
    datasets = list(acc.datasets) + [dataset]
    done = 0
    if resume:
        acc, done = im.resume(save_opts, acc, datasets, err)
    model, tok, runner = ch.open_for_chunks(model_path, n_ctx, n_batch)
    with model:
        if files or done:
            im.check_model_entries(acc, model, process_output)
        preflight(out, im.planned_size(acc, model, process_output, datasets, save_opts), "the imatrix")
        tokens = ch.tokenize(tok, text, n_ctx, text_file or "the built-in calibration text", parse_special)
        err(f"compute_imatrix: tokenized {dataset}: {tokens.size} tokens")
        avail = (tokens.size - from_chunk * n_ctx) // n_ctx
        n = avail if n_chunks < 0 else min(n_chunks, avail)
        err(f"compute_imatrix: computing over {max(n, 0)} chunks, n_ctx={n_ctx}, batch_size={n_batch}, "
            f"n_seq={max(1, n_batch // n_ctx)}")
        im.check_output_name(save_opts, err)
        bar = None if quiet else chunk_bar(max(n, 0))
        log = bar_logger(bar)
        on_chunk = PplLine(bar)

        opts = im.CollectOptions(n_ctx=n_ctx, n_batch=n_batch, n_chunks=n_chunks, from_chunk=from_chunk,
                                 out_freq=out_freq, save_freq=save_freq, process_output=process_output,
                                 compute_ppl=compute_ppl, parse_special=parse_special)
        if bar is not None and done:
            bar.update(min(done, bar.total))
        if cluster is None:
            res = im.collect(runner, tokens, ch.add_bos_id(tok), acc, datasets, opts, save_opts, log=log,
                             on_chunk=on_chunk, start=done, check=model.gguf.check_unchanged)
        else:
            from quantkit.pipelines.imatrix_cluster import collect_on_cluster

            res = collect_on_cluster(cluster, model_path or model.path, text_file, tokens, acc, datasets, opts,
                                     save_opts, start=done, chunks_per_job=chunks_per_job, on_chunk=on_chunk,
                                     log=log, check=model.gguf.check_unchanged)
        on_chunk.close()
        if res.ppl is not None and res.ppl.count:
            click.echo(res.ppl.final_line())
        p = im.save(acc, datasets, save_opts, log=err)
        err(f"\ncompute_imatrix: {res.n_chunk} chunks ({res.n_tokens} tokens) in {res.seconds:.2f} s "
            f"({res.n_tokens / max(res.seconds, 1e-9):.1f} tokens/s)")
        for line in im.coverage(acc, model, process_output):
            err(line)
        err(f"wrote {p}")
