"""Token ids back to text, llama.cpp's way (src/llama-vocab.cpp): GPT-2 characters back to bytes
(``llama_decode_text``), the ``clean_spaces`` passes of ``llama_vocab::impl::detokenize``, and the
stream decoder that holds back incomplete UTF-8. The pieces themselves are ``Tokenizer.token_to_piece``."""

from __future__ import annotations

import codecs
from typing import TYPE_CHECKING

from quantkit.model.pretokenize import UNICODE_TO_BYTE

if TYPE_CHECKING:
    from quantkit.model.tokenizer import Tokenizer


def decode_gpt2_text(text: str) -> bytes:
    """llama_decode_text: GPT-2 characters back to bytes; unknown characters spelled out."""
    out = bytearray()
    for ch in text:
        b = UNICODE_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


def clean_spaces(text: bytearray) -> bytearray:
    """The three in-place passes of llama_vocab::impl::detokenize when clean_spaces is set."""
    sp, ap = 0x20, 0x27
    # first pass: " ?", " !", " .", " ," lose the space
    total1 = len(text)
    total = 1 if total1 else 0
    for i in range(1, total1):
        x = text[i]
        if text[i - 1] == sp and x in b"?!.,":
            total -= 1
        text[total] = x
        total += 1
    # second pass: " ' " -> "'"
    total2 = total
    total = 1 if total2 else 0
    i = 1
    while i < total2:
        x = text[i]
        if x == ap and i + 1 < total2 and text[i - 1] == sp and text[i + 1] == sp:
            total -= 1
            i += 1
            text[i] = 0
        text[total] = x
        total += 1
        i += 1
    # third pass: " 's", " 'm", " 're", " 've" lose the space
    total3 = total
    total = 1 if total3 else 0
    for i in range(1, total3):
        x = text[i]
        if text[i - 1] == sp and x == ap and i + 1 < total3:
            x1 = text[i + 1]
            if x1 in b"sm":
                total -= 1
            elif x1 not in b"td" and i + 2 < total3:
                x2 = text[i + 2]
                if (x1, x2) in ((ord("r"), ord("e")), (ord("v"), ord("e"))):
                    total -= 1
        text[total] = x
        total += 1
    del text[total:]
    return text


class StreamDecoder:
    """Turns token ids into text as they are generated, holding back incomplete UTF-8 sequences.

    ``push(id)`` returns the text that became complete (possibly ``""``); ``flush()`` returns what is
    left (invalid bytes as U+FFFD)."""

    def __init__(self, tokenizer: "Tokenizer", special: bool = True):
        self._tok = tokenizer
        self._special = special
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        return self._dec.decode(self._tok.token_to_piece(token_id, special=self._special))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)
