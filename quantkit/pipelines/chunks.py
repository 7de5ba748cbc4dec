"""The chunk loop that imatrix and perplexity share, and its resume state.

Both tools (tools/imatrix/imatrix.cpp ``compute_imatrix``, tools/perplexity/perplexity.cpp
``perplexity``) tokenize the text once (BOS first when the vocab adds it), need at least ``2*n_ctx``
tokens, cut them into ``tokens // n_ctx`` chunks (``--chunks`` caps the count), evaluate each chunk
from an empty KV cache with its first token replaced by BOS when the vocab adds BOS, score the second
half of each chunk, and print an ETA after the first pass. ``run_chunks`` is that loop; what a tool
does with a chunk's logits is its ``on_chunk``.

Resuming: a run killed at chunk k of N continues from its last save with the same final result as an
uninterrupted run. The state is whatever the tool saves (imatrix: its output file; perplexity: a
``ChunkState`` file of per-chunk results); ``run_chunks(start=k)`` skips the chunks already done.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from quantkit.errors import QuantkitError
from quantkit.formats.atomic import write_bytes
from quantkit.pause import pause_point

Log = Callable[[str], None]


class ChunkError(QuantkitError):
    """A text or chunking request the imatrix and perplexity tools cannot serve (too little text, a
    bad batch size, a resume state from another run)."""


# -- input text --------------------------------------------------------------------------------

def read_text(path: str | os.PathLike | None, builtin: str) -> tuple[str, str]:
    """``(text, dataset name)``. ``path`` None: the built-in ``builtin`` half ("calibration" or
    "evaluation") of quantkit.formats.texts. A file must be UTF-8; as llama.cpp's ``-f``, one trailing
    newline is dropped."""
    if path is None:
        from quantkit.formats.texts import calibration_texts, text_sha256

        cal, ev = calibration_texts()
        text = cal if builtin == "calibration" else ev
        return text, f"pydoc_data.topics:{builtin}:sha256={text_sha256(text)[:16]}"
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise ChunkError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ChunkError(f"{p}: is a directory, not a text file") from None
    except OSError as e:
        raise ChunkError(f"{p}: cannot read ({e.strerror})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ChunkError(f"{p}: not UTF-8 text (invalid byte at offset {e.start})") from None
    if text.endswith("\n"):
        text = text[:-1]
    if not text:
        raise ChunkError(f"{p}: the file is empty")
    return text, str(path)


def tokenize(tok, text: str, n_ctx: int, where: str, parse_special: bool = False) -> np.ndarray:
    """The text's token ids (BOS first when the vocab adds it); at least ``2*n_ctx`` of them."""
    ids = np.asarray(tok.encode(text, add_special=True, parse_special=parse_special), dtype=np.int32)
    need_tokens(ids, n_ctx, where)
    return ids


def need_tokens(ids: np.ndarray, n_ctx: int, where: str) -> None:
    if ids.size < 2 * n_ctx:
        raise ChunkError(f"you need at least {2 * n_ctx} tokens for a context of {n_ctx} tokens; "
                         f"{where} tokenizes to only {ids.size} tokens")


# -- split and batch ---------------------------------------------------------------------------

def check_batch(n_ctx: int, n_batch: int) -> int:
    """llama.cpp's chunks-per-batch ``n_seq = max(1, n_batch / n_ctx)``; the batch must be below the
    context or a multiple of it (the reference asserts this)."""
    if n_ctx <= 0:
        raise ChunkError(f"the context size must be positive, got {n_ctx}")
    if n_batch <= 0:
        raise ChunkError(f"the batch size must be positive, got {n_batch}")
    if not (n_batch < n_ctx or n_batch % n_ctx == 0):
        raise ChunkError(f"batch size {n_batch} must be smaller than the context ({n_ctx}) or a multiple of it")
    return max(1, n_batch // n_ctx)


def ubatch(n_batch: int) -> int:
    """Rows per forward pass: llama.cpp's micro-batch, ``min(n_ubatch = 512, n_batch)``."""
    return min(512, n_batch)


def count_chunks(n_tokens: int, n_ctx: int, n_chunks: int) -> int:
    """``tokens // n_ctx`` chunks, at most ``n_chunks`` (-1: all); refuses zero."""
    n = n_tokens // n_ctx if n_chunks < 0 else min(n_chunks, n_tokens // n_ctx)
    if n <= 0:
        raise ChunkError("no chunk to evaluate (--chunks 0)")
    return n


def chunk_input(tokens: np.ndarray, i: int, n_ctx: int, bos: int | None) -> np.ndarray:
    """Tokens of chunk i with the first one replaced by BOS when the vocab adds BOS."""
    x = np.array(tokens[i * n_ctx:(i + 1) * n_ctx], dtype=np.int64)
    if bos is not None:
        x[0] = bos
    return x


def chunk_targets(tokens: np.ndarray, i: int, n_ctx: int) -> np.ndarray:
    """The next tokens the scored positions ``n_ctx/2 .. n_ctx-2`` of chunk i predict."""
    return tokens[i * n_ctx + n_ctx // 2 + 1:(i + 1) * n_ctx].astype(np.int64)


def add_bos_id(tok) -> int | None:
    """``llama_vocab_get_add_bos`` ? BOS : None."""
    return tok.bos_id if tok.add_bos else None


# -- the loop ----------------------------------------------------------------------------------

def eta_line(t_pass: float, n_chunk: int) -> str:
    """llama.cpp's line after the first pass: seconds per pass and the ETA of the whole run."""
    total = int(t_pass * n_chunk)
    s = f"{t_pass:.2f} seconds per pass - ETA "
    if total >= 3600:
        s += f"{total // 3600} hours "
        total %= 3600
    return s + f"{total / 60.0:.2f} minutes"


@dataclass
class LoopTimes:
    seconds: float = 0.0
    first_pass_s: float = 0.0


def run_chunks(runner, tokens: np.ndarray, n_ctx: int, n_chunk: int, bos: int | None, logits,
               on_chunk: Callable[[int, np.ndarray], None], *, start: int = 0, log: Log | None = None,
               check: Callable[[], None] = lambda: None, name: str = "chunk") -> LoopTimes:
    """Evaluate chunks ``start .. n_chunk-1`` from an empty cache, asking the runner for the logit
    rows ``logits`` (an index array, "all" or "none"), and hand each chunk's logits to ``on_chunk``.
    ``check`` runs after each forward pass (the model file must still be the one opened); the test-only
    pause point ``<name>.chunk`` follows each chunk."""
    times = LoopTimes()
    t0 = time.perf_counter()
    for i in range(start, n_chunk):
        tc = time.perf_counter()
        runner.reset()
        out = runner.forward(chunk_input(tokens, i, n_ctx, bos), 0, logits=logits)
        check()
        if i == start:
            times.first_pass_s = time.perf_counter() - tc
            if log:
                log(eta_line(times.first_pass_s, n_chunk - start))
        on_chunk(i, out)
        pause_point(f"{name}.chunk")
    times.seconds = time.perf_counter() - t0
    return times


# -- resume state ------------------------------------------------------------------------------

def run_identity(model_path, tokens: np.ndarray, **settings) -> dict:
    """What a saved state must match to be continued: the model file (path, size, modification
    time), the tokens (sha256) and the settings that shape the chunks."""
    st = os.stat(model_path)
    return {"model": str(Path(model_path).resolve()), "model_size": st.st_size, "model_mtime_ns": st.st_mtime_ns,
            "tokens_sha256": hashlib.sha256(np.ascontiguousarray(tokens, dtype="<i4").tobytes()).hexdigest(),
            **settings}


class ChunkState:
    """Per-chunk results of a run, saved atomically after every chunk (JSON; floats written with
    Python's shortest round-trip repr, so replaying them gives the uninterrupted run's sums exactly)."""

    VERSION = 1

    def __init__(self, path: str | os.PathLike, identity: dict):
        self.path = Path(path)
        self.identity = identity
        self.records: list = []

    def load(self) -> "ChunkState":
        """Read a previous state of the same run (nothing if the file does not exist)."""
        if not self.path.exists():
            return self
        try:
            data = json.loads(self.path.read_text())
            ident, records = data["identity"], data["records"]
            if data.get("version") != self.VERSION or not isinstance(records, list):
                raise ValueError("version")
        except (OSError, ValueError, KeyError, TypeError):
            raise ChunkError(f"{self.path}: not a quantkit resume state file") from None
        diff = [k for k in sorted(set(ident) | set(self.identity)) if ident.get(k) != self.identity.get(k)]
        if diff:
            raise ChunkError(f"{self.path}: saved by another run (its {', '.join(diff)} differ); "
                             f"remove it to start over")
        self.records = records
        return self

    def append(self, record) -> None:
        self.records.append(record)
        blob = json.dumps({"version": self.VERSION, "identity": self.identity, "records": self.records})
        write_bytes(self.path, blob.encode(), "the resume state")

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


# -- the model ---------------------------------------------------------------------------------


def open_for_chunks(path, n_ctx: int, n_batch: int):
    """(model, tokenizer, runner) for a chunk loop: the model (``loading.open_model``), a vocabulary
    that does not append EOS and matches the model's, and a Runner of ``n_ctx`` positions."""
    from quantkit.errors import FormatError, ModelError
    from quantkit.pipelines.loading import open_model

    om = open_model(path)
    model, tok = om.model, om.tok
    try:
        if tok.add_eos:
            raise ModelError(f"{model.path}: the vocabulary adds EOS to every text; perplexity needs it not to")
        if tok.n_vocab != model.config.n_vocab:
            raise FormatError(f"{model.path}: the tokenizer has {tok.n_vocab} tokens but the model "
                              f"{model.config.n_vocab}")
        # passes of many rows never run the one-token decode step: skip building it (its compiled
        # kernel and its huge-page copy of the weights cost ~1 s and the weights' size in memory)
        runner = om.runner(n_ctx, ubatch(n_batch), compiled_step=ubatch(n_batch) == 1)
    except BaseException:
        om.close()
        raise
    return model, tok, runner
