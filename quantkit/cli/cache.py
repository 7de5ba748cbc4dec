"""``quantkit cache``: where the compiled kernels are kept, how much they take, and ``--clear``."""

from __future__ import annotations

import click

from quantkit.cli import main


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


@main.command()
@click.option("--clear", is_flag=True, help="Remove the folder and every kernel in it (the next run compiles again).")
@click.option("--all", "every", is_flag=True,
              help="With --clear: every quantkit version's and CPU level's folder, not only this one's.")
def cache(clear, every):
    """Show the folder of compiled kernels: path, files, size, and the CPU level they are for.

    The first run of a command compiles its kernels with numba and keeps them here for every later
    run, whether quantkit runs from `make`, by hand, or from an installed package. The folder is the
    user's cache, one per quantkit version and CPU level, unless NUMBA_CACHE_DIR names another.
    """
    from quantkit import cache as C
    from quantkit import isa

    if every and not clear:
        raise click.UsageError("--all goes with --clear")
    path = C.user_root() if every else C.directory()
    if clear:
        held = C.clear(path)
        click.echo(f"removed {held.path}: {held.files} files, {_mib(held.bytes)}")
        return
    u = C.usage(path)
    click.echo(f"kernel cache: {u.path}")
    click.echo(f"  {u.files} files, {_mib(u.bytes)}" + ("" if u.files else " (empty: the next run compiles)"))
    click.echo(f"  CPU level: {isa.describe()}")
    if path != C.default_dir():
        click.echo("  (NUMBA_CACHE_DIR is set: quantkit's own folder would be " f"{C.default_dir()})")
