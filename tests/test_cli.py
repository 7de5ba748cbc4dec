"""The command-line layer: help everywhere, no compile for --help or bad arguments, version."""

from __future__ import annotations

import subprocess
import sys

import pytest
from click.testing import CliRunner

from quantkit import __version__
from quantkit.cli import main

COMMANDS = sorted(main.commands)


def test_version():
    res = CliRunner().invoke(main, ["--version"])
    assert res.exit_code == 0 and __version__ in res.output


def test_all_commands_present():
    for name in ("quantize", "run", "bench", "imatrix", "perplexity", "verify", "roundtrip"):
        assert name in COMMANDS


@pytest.mark.parametrize("name", COMMANDS)
def test_every_option_has_help(name):
    cmd = main.commands[name]
    assert cmd.help, name
    for p in cmd.params:
        if p.param_type_name == "option":
            assert p.help, f"{name} {p.opts} has no help"


_PROBE = r"""
import sys
from quantkit.cli import main
try:
    main(sys.argv[1:], standalone_mode=True)
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("numba", "quantkit.kernels", "quantkit.quants") if m in sys.modules)
print("HEAVY:" + ",".join(heavy))
"""


@pytest.mark.parametrize("name", COMMANDS)
def test_help_and_usage_errors_compile_nothing(name):
    for args in ([name, "--help"], [name, "--no-such-option"]):
        out = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, timeout=60)
        assert "HEAVY:\n" in out.stdout or out.stdout.strip().endswith("HEAVY:"), (args, out.stdout[-300:])
        assert "Traceback" not in out.stderr


def test_quantize_help_lists_llama_quantizes_file_types():
    """`quantkit quantize --help` lists the file types of `llama-quantize --help`, in its order, with the
    same ids and descriptions (tests/data/golden/llama_quantize_types.txt is that section of the real
    binary's --help, llama.cpp as vendored in llama-cpp-python 0.3.36)."""
    from pathlib import Path

    golden = Path(__file__).parent / "data" / "golden" / "llama_quantize_types.txt"
    want = [" ".join(line.split()) for line in golden.read_text().splitlines() if line.strip()]
    res = CliRunner().invoke(main, ["quantize", "--help"], terminal_width=200)
    assert res.exit_code == 0
    lines = res.output.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip().startswith("File types"))
    got = [" ".join(line.split()) for line in lines[start + 1:start + 1 + len(want)]]
    assert got == want


def test_process_exit_codes_and_output(tmp_path):
    """``python -m quantkit`` (the console script's ``entry``) ends the process without the interpreter's
    teardown: its output still arrives whole through a pipe, and the exit codes are click's -- 0,
    2 for a usage error, 1 for a library error (one line, no traceback)."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "quantkit", *args], capture_output=True, text=True,
                              timeout=120)

    r = run("quantize", "--help")
    want = CliRunner().invoke(main, ["quantize", "--help"], prog_name="python -m quantkit").output
    assert r.returncode == 0 and "".join(r.stdout.split()) == "".join(want.split())   # (another width)
    r = run("perplexity", "-c", "2")
    assert r.returncode == 2 and "Usage:" in r.stderr and "Traceback" not in r.stderr
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 20)
    r = run("perplexity", "-m", str(bad), "-c", "64", "--chunks", "1")
    assert r.returncode == 1 and "Traceback" not in r.stderr and r.stderr.strip().count("\n") == 0, r.stderr
