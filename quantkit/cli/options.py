"""The options several commands share, defined once (datasette's habit: shared options are decorators).

Each is a factory: ``@model_option()`` gives the common form; a command whose flag means something a
little different passes what differs (``@model_option(required=True, help=...)``), so the flag's name,
its destination and its usual help stay in one place. bench is not here: llama-bench's flags take lists.
"""

from __future__ import annotations

import functools

import click

BUNDLED = "the bundled SmolLM2-135M-Instruct Q4_1"


def _option(*decls, **common):
    """A decorator factory for ``click.option(*decls, **common)``; keyword arguments override ``common``."""

    def factory(**overrides):
        return click.option(*decls, **{**common, **overrides})

    return factory


#: -m/--model: one GGUF file
model_option = _option("-m", "--model", "model_path", type=click.Path(exists=True, dir_okay=False), default=None,
                       help=f"GGUF model (default: {BUNDLED}).")

#: -f/--file: a UTF-8 text (imatrix, perplexity, sweep; run's -f is its prompt)
text_option = _option("-f", "--file", "text_file", type=click.Path(dir_okay=False), default=None, metavar="FILE")

#: -c/--ctx-size: tokens per chunk / context
ctx_option = _option("-c", "--ctx-size", "n_ctx")

#: -b/--batch-size of the chunk tools, as llama.cpp's
batch_option = _option("-b", "--batch-size", "n_batch", type=click.IntRange(min=1), default=2048, show_default=True,
                       help="Batch size: n_seq = b/c chunks per batch (as llama.cpp; must be < c or a multiple "
                            "of c). quantkit runs the chunks one after another in passes of min(b, 512) tokens.")

#: --chunks: how many chunks of the text
chunks_option = _option("--chunks", "n_chunks", type=click.IntRange(min=-1), default=-1, show_default=True)


def threads_option(fn=None, *, apply: bool = True, help: str = "Number of threads (default: all cores)."):
    """-t/--threads, shared by every compute command; the one place a command's thread count is set
    (``quantkit.jit.set_threads``, before the command's body runs). ``apply=False`` only declares the
    option (quantize, whose pipeline sets it: the count may also come from a positional argument)."""

    option = click.option("-t", "--threads", type=int, default=None, metavar="N", help=help)

    def decorate(fn):
        if not apply:
            return option(fn)

        @option
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            from quantkit.jit import set_threads

            set_threads(kwargs["threads"])
            return fn(*args, **kwargs)

        return wrapper

    return decorate(fn) if fn is not None else decorate


class _SplitSize(click.ParamType):
    """``N(M|G)``: llama-gguf-split's --split-max-size, converted to bytes."""

    name = "N(M|G)"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        from quantkit.errors import FormatError
        from quantkit.formats.gguf_split import parse_split_size

        try:
            return parse_split_size(value)
        except FormatError as e:
            self.fail(str(e), param, ctx)


#: --split-max-tensors / --split-max-size: llama-gguf-split's limits per part (gguf-split, quantize)
split_max_tensors_option = _option("--split-max-tensors", type=click.IntRange(min=1), default=None, metavar="N")
split_max_size_option = _option("--split-max-size", "split_max_bytes", type=_SplitSize(), default=None,
                                metavar="N(M|G)")
