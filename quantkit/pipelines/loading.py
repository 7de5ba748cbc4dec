"""Opening a model for inference: the one way every command does it (run, perplexity, imatrix, sweep,
bench, warmup).

``open_model(path)`` maps the GGUF (the bundled SmolLM2 when ``path`` is None) and reads its tokenizer;
``OpenModel.runner(n_ctx, n_batch)`` then makes a Runner (buffers and KV cache) of that many positions,
as many times as a command needs (bench makes one per test). A failure at any step closes the file.
"""

from __future__ import annotations

from typing import Callable

from quantkit.errors import ModelError, QuantkitError
from quantkit.model.forward import DEFAULT_N_BATCH, Runner
from quantkit.model.llama import Llama
from quantkit.model.tokenizer import Tokenizer


class OpenModel:
    """A mapped model (``model``, a context manager) and its tokenizer (``tok``; None only when it was
    optional or not asked for)."""

    def __init__(self, model: Llama, tok: Tokenizer | None):
        self.model, self.tok = model, tok

    @property
    def path(self):
        return self.model.path

    def runner(self, n_ctx: int | None = None, n_batch: int = DEFAULT_N_BATCH, compiled_step: bool = True) -> Runner:
        """A Runner of ``n_ctx`` positions (None or 0: the trained length); a context over the trained
        length is one error line naming the file."""
        try:
            return Runner(self.model, n_ctx, n_batch, compiled_step=compiled_step)
        except ModelError as e:
            raise ModelError(f"{self.model.path}: {e}") from None

    def close(self) -> None:
        self.model.close()


def open_model(path=None, on_tokenizer_error: Callable[[QuantkitError], None] | None = None,
               tokenizer: bool = True) -> OpenModel:
    """The model at ``path`` (the bundled SmolLM2-135M-Instruct Q4_1 when None) and its tokenizer.

    A file without tokenizer metadata, or with one quantkit cannot read, is an error; with
    ``on_tokenizer_error`` it is reported there instead and ``tok`` is None (bench needs only the
    weights and, when there is one, the BOS token). ``tokenizer=False``: the weights only."""
    if path is None:
        from quantkit.formats.locate import bundled_model

        path = bundled_model()
    model = Llama(path)
    try:
        tok = None
        if tokenizer and (on_tokenizer_error is None or "tokenizer.ggml.model" in model.metadata):
            try:
                tok = Tokenizer.from_metadata(model.metadata)
            except QuantkitError as e:
                if on_tokenizer_error is None:
                    raise
                on_tokenizer_error(e)
    except BaseException:
        model.close()
        raise
    return OpenModel(model, tok)


def ctx_size(requested: int | None, n_ctx_train: int, default: int) -> int:
    """A command's ``-c``: None -> ``default`` or the trained length if smaller; 0 -> the trained length."""
    if requested is None:
        return min(default, n_ctx_train)
    return n_ctx_train if requested == 0 else requested
