"""``quantkit gguf-split``: llama-gguf-split's command line (--split / --merge), the same output bytes."""

from __future__ import annotations

import sys

import click

from quantkit.cli import main
from quantkit.cli.options import split_max_size_option, split_max_tensors_option


@main.command("gguf-split")
@click.argument("gguf_in", metavar="GGUF_IN", type=click.Path(dir_okay=False))
@click.argument("gguf_out", metavar="GGUF_OUT")
@click.option("--split", "op", flag_value="split", default=None,
              help="Split GGUF_IN into GGUF_OUT-00001-of-0000N.gguf, ... (the default operation).")
@click.option("--merge", "op", flag_value="merge",
              help="Merge the split model whose first part is GGUF_IN into the single file GGUF_OUT.")
@split_max_tensors_option(help="At most N tensors per part (default: 128).")
@split_max_size_option(help="At most N megabytes (M, 10^6 bytes) or gigabytes (G, 10^9) of tensor data per part.")
@click.option("--no-tensor-first-split", is_flag=True,
              help="Put no tensors in the first part (it holds the metadata only).")
@click.option("--dry-run", is_flag=True, help="Print the split plan (or read every part for --merge); write nothing.")
@click.option("--delete-splits", is_flag=True,
              help="With --merge: delete the parts once the merged file is complete (quantkit deletes them "
                   "only after it is in place, unlike llama-gguf-split, which deletes them during the merge).")
@click.option("-q", "--quiet", is_flag=True, help="No progress bar.")
def gguf_split(gguf_in, gguf_out, op, split_max_tensors, split_max_bytes, no_tensor_first_split, dry_run,
               delete_splits, quiet):
    """Split a GGUF into parts, or merge the parts back, like llama-gguf-split (same flags, same bytes).

    \b
    --split: GGUF_OUT is the parts' prefix: `quantkit gguf-split m.gguf out/m` writes
    out/m-00001-of-00003.gguf, ... (every key in the first part; split.no, split.count and
    split.tensors.count in each). Every part is written to a temporary file and all are renamed into
    place only when all are complete: a failed run leaves none of them.
    --merge: GGUF_IN is the first part; GGUF_OUT must not exist yet.

    Every quantkit command opens a split model from its first part.
    """
    from quantkit.pipelines.gguf_split import merge_model, split_model

    if split_max_tensors is not None and split_max_bytes is not None:
        raise click.UsageError("either --split-max-tensors or --split-max-size can be specified, but not both")
    max_bytes = split_max_bytes
    op = op or "split"
    if op == "merge" and (split_max_tensors is not None or max_bytes is not None or no_tensor_first_split):
        raise click.UsageError("--split-max-tensors, --split-max-size and --no-tensor-first-split are for --split")
    if op == "split" and delete_splits:
        raise click.UsageError("--delete-splits is for --merge")

    from tqdm import tqdm

    state = {"bar": None}

    def progress(**kw):
        state["bar"] = tqdm(file=sys.stderr, **kw)
        return state["bar"]

    def log(line: str) -> None:
        if state["bar"] is not None:
            state["bar"].write(line, file=sys.stderr)
        else:
            click.echo(line, err=True)

    bar = progress if not quiet and not dry_run and sys.stderr.isatty() else None
    if op == "split":
        split_model(gguf_in, gguf_out, max_tensors=split_max_tensors, max_bytes=max_bytes,
                    no_tensor_first_split=no_tensor_first_split, dry_run=dry_run, log=log,
                    out=click.echo, progress=bar)
    else:
        merge_model(gguf_in, gguf_out, dry_run=dry_run, log=log, progress=bar, delete_parts=delete_splits)
