"""The target-bpw allocator (quantkit.allocation): a pure function, tested as tables and against an
exhaustive search on small problems."""

from __future__ import annotations

import itertools
import math

import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from hypothesis import given, settings
from hypothesis import strategies as st

from quantkit.allocation import (
    AllocationError,
    Candidate,
    Item,
    allocate,
    allowed_types,
    budget_for_bpw,
    parse_size,
)


def _exhaustive(items, budget):
    """min summed loss over every combination that fits, or None."""
    best = None
    for combo in itertools.product(*(it.candidates for it in items)):
        if sum(c.nbytes for c in combo) <= budget:
            loss = sum(c.loss for c in combo)
            best = loss if best is None else min(best, loss)
    return best


def _item(name, *pairs):
    types = [Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.F16, Q.Q4_1, Q.Q5_1]
    return Item(name, 32, tuple(Candidate(types[k], b, l) for k, (b, l) in enumerate(pairs)))


# (items as (bytes, loss) candidate lists, budget, expected choice as candidate index per item)
TABLE = [
    # enough room for everything: the least loss everywhere
    ([[(10, 5.0), (20, 1.0)], [(10, 4.0), (20, 2.0)]], 40, [1, 1]),
    # room for one upgrade: the one saving more per byte (item a saves 4, b saves 2)
    ([[(10, 5.0), (20, 1.0)], [(10, 4.0), (20, 2.0)]], 30, [1, 0]),
    # only the minimum fits
    ([[(10, 5.0), (20, 1.0)], [(10, 4.0), (20, 2.0)]], 20, [0, 0]),
    # a dominated candidate (more bytes, more loss) is never chosen
    ([[(10, 5.0), (15, 6.0), (20, 1.0)]], 15, [0]),
    # off-hull middle option: hull walk jumps 10->30, leftover fill takes the middle when 30 does not fit
    ([[(10, 9.0), (20, 8.5), (30, 0.0)]], 25, [1]),
    # the upgrade saving more per byte goes first (b: 0.9/byte, a: 0.5/byte), then a's no longer fits
    ([[(10, 3.0), (12, 2.0)], [(10, 9.0), (20, 0.0)]], 30, [0, 1]),
]


@pytest.mark.parametrize("pairs,budget,expected", TABLE)
def test_table(pairs, budget, expected):
    items = [_item(f"t{i}", *p) for i, p in enumerate(pairs)]
    got = allocate(items, budget)
    want = {it.name: it.candidates[k].qtype for it, k in zip(items, expected)}
    assert got.types() == want
    assert got.nbytes <= budget
    assert got.loss == pytest.approx(_exhaustive(items, budget))


def test_too_small_budget_is_one_clear_error():
    items = [_item("a", (10, 1.0), (20, 0.5)), _item("b", (10, 1.0))]
    with pytest.raises(AllocationError, match="too small.*20 bytes"):
        allocate(items, 19)


def test_bad_candidates_refused():
    with pytest.raises(AllocationError, match="duplicate"):
        allocate([_item("a", (1, 1.0)), _item("a", (1, 1.0))], 10)
    with pytest.raises(AllocationError, match="bad candidate"):
        allocate([_item("a", (1, float("nan")))], 10)
    with pytest.raises(AllocationError, match="no candidate"):
        allocate([Item("a", 1, ())], 10)


def test_fixed_items_count_toward_the_budget():
    fixed = Item("fixed", 32, (Candidate(Q.Q8_0, 34, 0.0),))
    free = _item("free", (18, 2.0), (22, 1.0), (34, 0.1))
    got = allocate([fixed, free], 34 + 22)
    assert got.choice["fixed"].qtype == Q.Q8_0
    assert got.choice["free"].nbytes == 22


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.tuples(st.integers(1, 40), st.floats(0, 10)), min_size=1, max_size=4),
                min_size=1, max_size=4),
       st.integers(0, 160))
def test_never_over_budget_and_near_the_optimum(pairs, budget):
    items = [_item(f"t{i}", *p) for i, p in enumerate(pairs)]
    best = _exhaustive(items, budget)
    if best is None:
        with pytest.raises(AllocationError):
            allocate(items, budget)
        return
    got = allocate(items, budget)
    assert got.nbytes <= budget
    # a hull walk plus a fill pass is not exact for a knapsack, but the gap is at most the loss one
    # tensor can still shed (the classic bound for the Lagrangian solution)
    gap = max(max(c.loss for c in it.candidates) - min(c.loss for c in it.candidates) for it in items)
    assert got.loss <= best + gap + 1e-9


def test_deterministic():
    items = [_item(f"t{i}", (10, 1.0), (20, 0.5)) for i in range(6)]
    a = allocate(items, 90).types()
    assert all(allocate(list(items), 90).types() == a for _ in range(3))
    assert sum(1 for t in a.values() if t == Q.Q5_0) == 3


def test_allowed_types_follow_the_block():
    types = [Q.Q4_0, Q.Q4_K, Q.IQ4_NL, Q.F16, Q.Q8_0]
    assert allowed_types(576, types) == [Q.Q4_0, Q.IQ4_NL, Q.F16, Q.Q8_0]  # 576 = 2.25 * 256
    assert allowed_types(1536, types) == types
    assert allowed_types(100, types) == [Q.F16]
    assert all(1536 % GGML_QUANT_SIZES[t][0] == 0 for t in allowed_types(1536, types))


@pytest.mark.parametrize("text,value", [
    ("4.2GiB", int(4.2 * 1024**3)), ("800MB", 800_000_000), ("800M", 800_000_000), ("1024", 1024),
    ("1.5 KiB", 1536), ("2gib", 2 * 1024**3), ("3e2B", 300),
])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "GiB", "4.2 GB GB", "-1GiB", "0", "4.2XB"])
def test_parse_size_refuses(text):
    with pytest.raises(AllocationError, match="bad size"):
        parse_size(text)


def test_budget_for_bpw_is_the_largest_size_at_or_under_the_target():
    n = 134_515_008
    b = budget_for_bpw(4.5, n)
    assert 8 * b / n <= 4.5 < 8 * (b + 1) / n
    assert budget_for_bpw(8.0, 1000) == 1000
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(AllocationError):
            budget_for_bpw(bad, 10)


def test_importable_without_numba():
    import subprocess
    import sys

    code = "import sys, quantkit.allocation; print('numba' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
