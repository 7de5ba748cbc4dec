"""llama-perplexity's KL-divergence base file (``--kl-divergence-base``), byte for byte.

Layout (tools/perplexity/perplexity.cpp, ``perplexity()`` with ``--kl-divergence-base`` and
``kl_divergence()``): ``"_logits_"``, int32 ``n_ctx``, int32 ``n_vocab``, int32 ``n_chunk``, int32
``tokens[n_ctx * n_chunk]`` (the text's tokens, without the BOS substitution), then for every scored
token ``nv = 2*((n_vocab+1)/2) + 4`` uint16: the first four hold float32 ``scale`` and
``min_log_prob``, the rest the log-probabilities quantized to 16 bits over [max-16, max] of the logits.
Each chunk scores ``n_ctx - 1 - n_ctx/2`` tokens, so the whole size is known from the header.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from quantkit.errors import FormatError
from quantkit.formats.atomic import AtomicWriter

LOGITS_MAGIC = b"_logits_"
HEADER_BYTES = 8 + 3 * 4


def n_vocab_padded(n_vocab: int) -> int:
    """uint16 per scored token in a base file: the quantized vocab padded to even, plus 2 floats."""
    return 2 * ((n_vocab + 1) // 2) + 4


def n_scored(n_ctx: int) -> int:
    """Tokens scored per chunk: the second half, ``n_ctx/2 .. n_ctx-2`` predicting the next token."""
    return n_ctx - 1 - n_ctx // 2


def logits_file_size(n_ctx: int, n_vocab: int, n_chunk: int) -> int:
    return HEADER_BYTES + 4 * n_ctx * n_chunk + 2 * n_chunk * n_scored(n_ctx) * n_vocab_padded(n_vocab)


class LogitsWriter(AtomicWriter):
    """Stream a base logits file (header and tokens at open, then one chunk of log-probs at a time)."""

    def __init__(self, path: str | os.PathLike, n_ctx: int, n_vocab: int, n_chunk: int, tokens: np.ndarray):
        super().__init__(path, logits_file_size(n_ctx, n_vocab, n_chunk), "the base logits file")
        self.head = LOGITS_MAGIC + np.array([n_ctx, n_vocab, n_chunk], "<i4").tobytes() \
            + np.ascontiguousarray(tokens[:n_ctx * n_chunk], dtype="<i4").tobytes()

    def open(self) -> "LogitsWriter":
        super().open()
        self.write(self.head)
        return self

    def write_chunk(self, log_probs: np.ndarray) -> None:
        self.write(np.ascontiguousarray(log_probs, dtype="<u2"))


@dataclass
class LogitsFile:
    """A base logits file opened for reading (memory-mapped)."""

    path: Path
    n_ctx: int
    n_vocab: int
    n_chunk: int
    tokens: np.ndarray          # int32 (n_chunk * n_ctx,)
    log_probs: np.ndarray       # uint16 (n_chunk, n_scored, nv)

    @property
    def n_scored(self) -> int:
        return n_scored(self.n_ctx)


def open_logits(path: str | os.PathLike) -> LogitsFile:
    """Read and check a base logits file's header against its size before mapping anything."""
    p = Path(path)
    if not p.is_file():
        raise FormatError(f"{p}: no such base logits file")
    size = p.stat().st_size
    with open(p, "rb") as f:
        head = f.read(HEADER_BYTES)
    if len(head) < 8 or head[:8] != LOGITS_MAGIC:
        raise FormatError(f"{p}: does not look like a file of log-probabilities (no '_logits_' magic)")
    if len(head) < HEADER_BYTES:
        raise FormatError(f"{p}: truncated header ({size} bytes)")
    n_ctx, n_vocab, n_chunk = (int(v) for v in np.frombuffer(head, "<i4", 3, 8))
    if n_ctx < 4 or n_vocab <= 0 or n_chunk <= 0:
        raise FormatError(f"{p}: bad header (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk})")
    need = logits_file_size(n_ctx, n_vocab, n_chunk)
    if size != need:
        raise FormatError(f"{p}: {size} bytes, but a base file of {n_chunk} chunks of {n_ctx} tokens over "
                          f"{n_vocab} vocab entries has {need}" + (" (truncated?)" if size < need else ""))
    tok_bytes = 4 * n_ctx * n_chunk
    mm = np.memmap(p, dtype=np.uint8, mode="r")
    tokens = mm[HEADER_BYTES:HEADER_BYTES + tok_bytes].view("<i4")
    lp = mm[HEADER_BYTES + tok_bytes:].view("<u2").reshape(n_chunk, n_scored(n_ctx), n_vocab_padded(n_vocab))
    return LogitsFile(p, n_ctx, n_vocab, n_chunk, tokens, lp)
