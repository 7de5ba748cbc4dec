"""llama-bench's list arguments: comma lists, ranges and pairs (``-p 16-64+16,128``, ``-pg 512,128``,
``--cpu-strict 0,1``). Each parser raises ValueError with the text to show; cli/bench.py turns it into a
usage error."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?:([+*])(\d+))?)?(?:,|$)")


def parse_int_range(s: str) -> list[int]:
    """llama-bench's ``parse_int_range``: ``first[-last[(+|*)step]]``, comma-separated.

    ``"1-8*2"`` -> [1, 2, 4, 8]; ``"16-64+16,128"`` -> [16, 32, 48, 64, 128]. Raises ValueError."""
    out: list[int] = []
    rest = s
    while rest:
        m = _RANGE.match(rest)
        if m is None:
            break
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) is not None else first
        op = m.group(3) or "+"
        step = int(m.group(4)) if m.group(4) is not None else 1
        i = first
        while i <= last:
            out.append(i)
            nxt = i + step if op == "+" else i * step
            if nxt <= i:
                raise ValueError(f"invalid range {m.group(0).rstrip(',')!r} (it never grows)")
            i = nxt
        rest = rest[m.end():]
    if rest or not s:
        raise ValueError(f"invalid range format {s!r} (expected N, N-M, N-M+STEP or N-M*MULT, comma-separated)")
    return out


def parse_bool_list(s: str) -> list[bool]:
    """``--cpu-strict 0,1``: each item 0 or 1."""
    out = []
    for item in s.split(","):
        if item.strip() not in ("0", "1"):
            raise ValueError(f"invalid boolean {item!r} in {s!r} (expected 0 or 1)")
        out.append(item.strip() == "1")
    return out


def parse_pair(s: str) -> tuple[int, int]:
    """``-pg PP,TG``."""
    parts = s.split(",")
    if len(parts) != 2:
        raise ValueError(f"invalid pair {s!r} (expected PP,TG)")
    try:
        a, b = int(parts[0]), int(parts[1])
    except ValueError:
        raise ValueError(f"invalid pair {s!r} (expected two integers PP,TG)") from None
    if a < 0 or b < 0:
        raise ValueError(f"invalid pair {s!r} (negative token count)")
    return a, b
