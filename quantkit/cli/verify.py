"""``quantkit verify FILE``: re-read a GGUF and check every tensor and the metadata."""

from __future__ import annotations

import sys

import click

from quantkit.cli import main


def report_verify(report, echo, verbose: bool) -> None:
    for t in report.tensors:
        if verbose or not t.ok:
            status = "ok" if t.ok else "BAD: " + "; ".join(t.problems)
            echo(f"{t.name:<36s} {t.type:>6s} [{', '.join(str(d) for d in t.shape)}] {status}")
    for p in report.metadata_problems:
        echo(f"metadata: {p}")
    echo(f"verify: {len(report.tensors) - report.n_bad}/{len(report.tensors)} tensors ok, "
         f"{len(report.metadata_problems)} metadata problem(s): {'OK' if report.ok else 'FAILED'}")


@main.command()
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("-v", "--verbose", is_flag=True, help="One line per tensor, not only the bad ones.")
def verify(path, verbose):
    """Check a GGUF: every tensor's size, no NaN/Inf block scales, metadata agreeing with the tensors.

    Exit code 0 when everything is right, 1 otherwise.
    """
    from tqdm import tqdm

    from quantkit.formats.sigbus import install
    from quantkit.pipelines.verify import verify_file

    install()

    report = verify_file(path, progress=lambda **kw: tqdm(file=sys.stderr, disable=not sys.stderr.isatty(), **kw))
    report_verify(report, lambda s: click.echo(s), verbose)
    if not report.ok:
        raise click.exceptions.Exit(1)
