"""quantkit.config: every QUANTKIT_* switch is read there only, listed in SWITCHES and documented."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from quantkit import config

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"QUANTKIT_[A-Z0-9_]+")


def sources(folder: str):
    return sorted((ROOT / folder).rglob("*.py"))


def test_every_switch_named_in_the_package_is_listed():
    listed = {s.name for s in config.SWITCHES}
    used = {m for f in sources("quantkit") for m in NAME.findall(f.read_text())}
    assert used <= listed, sorted(used - listed)
    assert len(listed) == len(config.SWITCHES)


def test_only_config_reads_the_environment_for_a_switch():
    read = re.compile(r"(environ|getenv)[^\n]*QUANTKIT_")
    readers = [f.relative_to(ROOT).as_posix() for f in sources("quantkit") if read.search(f.read_text())]
    assert readers == ["quantkit/config.py"]


def test_docs_table_lists_every_switch():
    text = (ROOT / "docs" / "DEVELOPING.md").read_text()
    section = text.split("## Environment switches", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `(QUANTKIT_[A-Z0-9_]+)` \| ([^|]+) \|", section, re.M)
    in_tests = {m for f in sources("tests") for m in NAME.findall(f.read_text())} - {s.name for s in config.SWITCHES}
    assert sorted(n for n, _ in rows) == sorted({s.name for s in config.SWITCHES} | in_tests)
    defaults = dict(rows)
    for s in config.SWITCHES:
        assert defaults[s.name].strip() == f"`{s.default}`" or defaults[s.name].strip() == s.default, s.name


@pytest.mark.parametrize("name, value, fn, want", [
    ("QUANTKIT_PREFETCH", None, config.prefetch_distance, 2048),
    ("QUANTKIT_PREFETCH", "", config.prefetch_distance, 0),
    ("QUANTKIT_PREFETCH", "512", config.prefetch_distance, 512),
    ("QUANTKIT_K512", None, config.k512, True),
    ("QUANTKIT_K512", "0", config.k512, False),
    ("QUANTKIT_K512", "", config.k512, False),
    ("QUANTKIT_512", None, config.pairs_512, False),
    ("QUANTKIT_512", "1", config.pairs_512, True),
    ("QUANTKIT_GEMM", "0", config.integer_gemm, False),
    ("QUANTKIT_GEMM", "1", config.integer_gemm, True),
    ("QUANTKIT_COPY_WEIGHTS", "", config.copy_weights, False),
    ("QUANTKIT_COMPILE_NOTICE", None, config.compile_notice, False),
    ("QUANTKIT_COMPILE_NOTICE", "0", config.compile_notice, False),
    ("QUANTKIT_COMPILE_NOTICE", "", config.compile_notice, True),
    ("QUANTKIT_KERNELS", " AVX2 ", config.kernels_level, "avx2"),
    ("QUANTKIT_PAUSE_AT", "write:3", config.pause_at, ("write", 3)),
    ("QUANTKIT_PAUSE_AT", None, config.pause_at, ("", 1)),
])
def test_switch_values(monkeypatch, name, value, fn, want):
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)
    assert fn() == want
