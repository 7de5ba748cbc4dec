"""The command line: a thin click layer over quantkit.pipelines.

Every subcommand lives in its own module here and registers itself on ``main``. Library errors
(``QuantkitError``) become one line on stderr and exit code 1; misuse is a click ``UsageError``
(exit 2). Heavy imports (numba kernels) happen inside the subcommands, so ``--help`` and argument
errors never compile anything.
"""

from __future__ import annotations

import os
import signal
import sys

import click

from quantkit import __version__, config, interrupt
from quantkit.errors import QuantkitError

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def interrupted_exit(signum: int | None = None) -> None:
    """The one-line note and the shell's exit code for a run stopped by a signal (130 for Ctrl-C)."""
    signum = signum or interrupt.received() or int(signal.SIGINT)
    name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
    click.echo(f"interrupted ({name})", err=True)
    if interrupt.received():
        # The unwinding has closed and removed every temporary file. Skip the interpreter's teardown:
        # with numba's compiled modules loaded it takes ~0.9 s, and a stopped job should stop now.
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(128 + signum)
    sys.exit(128 + signum)


class _Group(click.Group):
    def invoke(self, ctx):
        previous = interrupt.catch_signals()
        try:
            return super().invoke(ctx)
        except QuantkitError as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt as e:
            interrupt.handled(e)
            interrupted_exit(getattr(e, "signum", None))
        except BrokenPipeError:
            sys.exit(1)
        except MemoryError:
            raise click.ClickException("out of memory") from None
        finally:
            interrupt.restore(previous)                   # in-process callers (tests) get theirs back
            if "quantkit.jit" in sys.modules:  # the compile summary, if the command compiled anything
                sys.modules["quantkit.jit"].compiles_done()


@click.group(cls=_Group, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name="quantkit")
def main() -> None:
    """quantkit: llama.cpp's quantize, imatrix, run, bench and perplexity tools in Python."""
    # a cold numba compile says so on stderr (first run only): quantkit.jit installs the notice when it
    # is imported, which a subcommand's --help never does
    config.default_compile_notice_on()
    if "quantkit.jit" in sys.modules:
        sys.modules["quantkit.jit"].announce_compiles()


def entry() -> None:
    """The ``quantkit`` command (console script, ``python -m quantkit``): ``main``, then the end of the
    process without the interpreter's teardown. What the interpreter does first on its way out still
    runs -- non-daemon threads joined (``threading._shutdown``), atexit handlers (temporary files'
    finalizers among them), the standard streams flushed -- but not the freeing of every module,
    numba dispatcher and LLVM object one by one: 0.2-0.3 CPU-s once the kernels are loaded, as long
    as a 2-chunk perplexity's start-up (docs/performance.md). In-process callers (tests) call ``main``."""
    import atexit
    import threading

    try:
        main()
        code = 0
    except SystemExit as e:
        code = e.code
    if code is not None and not isinstance(code, int):   # sys.exit("message")
        print(code, file=sys.stderr)
        code = 1
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is None:                                  # not CPython: its own exit
        sys.exit(code)
    shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 1
    os._exit(code or 0)


def chunk_bar(n: int):
    """A progress bar over ``n`` chunks on stderr (imatrix, perplexity), or None when stderr is not a
    terminal."""
    if not sys.stderr.isatty():
        return None
    from tqdm import tqdm

    return tqdm(total=n, unit="chunk", file=sys.stderr, dynamic_ncols=True)


def bar_logger(bar):
    """A log function for stderr that writes above ``bar`` when there is one."""
    def log(line: str) -> None:
        if bar is not None:
            bar.write(line, file=sys.stderr)
        else:
            click.echo(line, err=True)

    return log


class PplLine:
    """The running ``[1]12.3456,[2]...`` line of the chunk tools (imatrix, perplexity), called per chunk as
    ``on_chunk(i, ppl)``: llama.cpp writes it to stdout as it goes, and so does this without a progress
    bar; with one (``chunk_bar``), the bar shows the latest value and ``close()`` writes the whole line.
    ``ppl`` None (imatrix without PPL) only moves the bar."""

    def __init__(self, bar):
        self.bar = bar
        self.parts: list[str] = []

    def __call__(self, i: int, ppl: float | None) -> None:
        bar = self.bar
        if ppl is not None:
            self.parts.append(f"[{i + 1}]{ppl:.4f},")
            if bar is None:
                sys.stdout.write(self.parts[-1])
                sys.stdout.flush()
            else:
                bar.set_postfix_str(f"ppl {ppl:.4f}")
        if bar is not None:
            bar.update(1)

    def close(self) -> None:
        """Close the bar, and end the line on stdout."""
        if self.bar is not None:
            self.bar.close()
            sys.stdout.write("".join(self.parts))
        sys.stdout.write("\n")


# Subcommands register themselves on import.
from quantkit.cli import bench, cache, convert, gguf_split, imatrix, perplexity, quantize, roundtrip, run, sweep, verify, warmup  # noqa: E402,F401
