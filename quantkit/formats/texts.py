"""Reference texts for imatrix calibration and perplexity evaluation.

The text is the concatenation of the standard library's ``pydoc_data.topics`` (the help() topics),
so every machine with CPython has it and nothing is downloaded. It is split once, at the first
newline after the midpoint: the first half calibrates (imatrix), the second half evaluates
(perplexity), and the two never overlap.

The exact bytes depend on the CPython version (pydoc_data is regenerated with each release);
golden token ids stored in the tests record the SHA-256 of the text they were made from.
"""

from __future__ import annotations

import hashlib


def source_text() -> str:
    """``"\\n\\n".join(pydoc_data.topics.topics.values())``, in the dict's order."""
    from pydoc_data import topics

    return "\n\n".join(topics.topics.values())


def split_point(text: str) -> int:
    """Index of the first newline at or after ``len(text) // 2`` (the cut); ``len(text)`` if none."""
    cut = text.find("\n", len(text) // 2)
    return len(text) if cut < 0 else cut


def calibration_texts() -> tuple[str, str]:
    """``(calibration, evaluation)``: the text before the cut newline and the text after it.

    ``calibration + "\\n" + evaluation == source_text()``.
    """
    text = source_text()
    cut = split_point(text)
    return text[:cut], text[cut + 1 :]


def text_sha256(text: str) -> str:
    """Hex SHA-256 of the UTF-8 bytes of ``text`` (to tell whether golden data still applies)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
