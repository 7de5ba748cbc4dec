"""Hostile and broken GGUF files: every command that opens a model answers with one line and exit 1.

The corpus under tests/data/bad/ is made by tools/make_bad_gguf.py (MANIFEST.txt says what each file
breaks). A property test mutates a small valid GGUF at random and checks the same promise.
Run the fuzz test longer with QUANTKIT_FUZZ_EXAMPLES=5000 pytest tests/test_hostile.py -k fuzz.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import hang_guard
from quantkit.cli import main
from quantkit.errors import QuantkitError
from quantkit.formats.gguf_io import GGUFModel

BAD = Path(__file__).parent / "data" / "bad"
FILES = sorted(p.name for p in BAD.glob("*.gguf") if p.name != "good.gguf" and not p.name.startswith("imatrix_"))
# Broken as a model, not as a file. llama-quantize quantizes the last two anyway (it never looks tensors
# up by name or checks their shapes against the hyperparameters), so quantize does too, and refuses the
# first as llama-quantize does (a key its load_hparams needs). The commands that build the model refuse
# all three. verify checks a file's integrity, not an architecture's tensor list.
MODEL_LEVEL = {"missing_embedding_length.gguf", "missing_tensor.gguf", "wrong_shape.gguf"}
QUANTIZE_ACCEPTS = {"missing_tensor.gguf", "wrong_shape.gguf"}

COMMANDS = {
    "quantize --dry-run": lambda f, tmp: ["quantize", "--dry-run", f, "Q8_0"],
    "quantize": lambda f, tmp: ["quantize", f, str(tmp / "out.gguf"), "Q8_0"],
    "verify": lambda f, tmp: ["verify", f],
    "run": lambda f, tmp: ["run", "-m", f, "-p", "t0", "-n", "2", "--temp", "0"],
    "bench": lambda f, tmp: ["bench", "-m", f, "-p", "4", "-n", "2", "-r", "1"],
    "imatrix": lambda f, tmp: ["imatrix", "-m", f, "-c", "16", "--chunks", "1", "-o", str(tmp / "out.gguf")],
    "perplexity": lambda f, tmp: ["perplexity", "-m", f, "-c", "16", "--chunks", "1"],
}


def test_corpus_is_complete():
    manifest = (BAD / "MANIFEST.txt").read_text().splitlines()[1:]
    assert sorted(line.split("\t")[0] for line in manifest) == FILES
    assert len(FILES) >= 25


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("name", FILES)
def test_broken_file_one_line_exit_1(name, command, tmp_path):
    if name in MODEL_LEVEL and command == "verify":
        pytest.skip("a model-level defect; verify checks the file, not the architecture's tensors")
    path = str(BAD / name)
    with hang_guard():              # the command ends: a bad file never hangs it
        res = CliRunner().invoke(main, COMMANDS[command](path, tmp_path), catch_exceptions=False)
    if name in QUANTIZE_ACCEPTS and command.startswith("quantize"):
        assert res.exit_code == 0 and "Traceback" not in res.output, res.output
        assert (tmp_path / "out.gguf").exists() == (command == "quantize")
        return
    assert res.exit_code == 1, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert "Traceback" not in res.output, res.output
    errors = [ln for ln in lines if ln.startswith("Error:")]
    if command == "verify" and lines[-1].startswith("verify:"):  # a readable file with wrong contents
        assert lines[-1].endswith("FAILED"), res.output
    else:  # one error line (bench prints its table header first, as llama-bench does)
        assert len(errors) == 1 and name in errors[0], res.output
    assert not (tmp_path / "out.gguf").exists() and not list(tmp_path.iterdir())


def test_good_corpus_base_opens():
    with GGUFModel(BAD / "good.gguf") as m:
        assert len(m.tensors) == 11 and m.arch == "llama"


_GOOD = (BAD / "good.gguf").read_bytes()
_EXAMPLES = int(os.environ.get("QUANTKIT_FUZZ_EXAMPLES", "150"))


@st.composite
def mutated(draw):
    data = bytearray(_GOOD)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "truncate", "splice", "u64"]))
        if kind == "flip" and data:
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        elif kind == "truncate" and data:
            data = data[: draw(st.integers(0, len(data)))]
        elif kind == "splice":
            i = draw(st.integers(0, len(data)))
            data[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif len(data) > 8:  # plant a huge 64-bit count or length somewhere in the header area
            i = draw(st.integers(0, min(len(data), 1400) - 8))
            data[i:i + 8] = draw(st.integers(0, 2**64 - 1)).to_bytes(8, "little")
    return bytes(data)


@settings(max_examples=_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])
@given(blob=mutated())
def test_fuzz_mutated_gguf(blob, tmp_path_factory):
    """Open + plan: either it works or one QuantkitError; never another exception, never a hang."""
    d = tmp_path_factory.mktemp("fuzz")
    p = d / "m.gguf"
    p.write_bytes(blob)
    try:
        with hang_guard(), GGUFModel(p) as m:
            from quantkit.pipelines.quantize import QuantizeOptions, plan_quantization

            plan_quantization(m, QuantizeOptions("Q8_0"), strict=False)
    except QuantkitError as e:
        assert "\n" not in str(e)


IMATRIX_FILES = sorted(p.name for p in BAD.glob("imatrix_*"))
IMATRIX_COMMANDS = {
    "quantize --imatrix": lambda f, tmp: ["quantize", "--imatrix", f, str(BAD / "good.gguf"),
                                          str(tmp / "out.gguf"), "Q4_0"],
    "imatrix --show-statistics": lambda f, tmp: ["imatrix", "--in-file", f, "--show-statistics"],
}


def test_imatrix_corpus_is_complete():
    manifest = (BAD / "IMATRIX_MANIFEST.txt").read_text().splitlines()[1:]
    assert sorted(line.split("\t")[0] for line in manifest) == IMATRIX_FILES
    assert len(IMATRIX_FILES) >= 9


@pytest.mark.parametrize("command", sorted(IMATRIX_COMMANDS))
@pytest.mark.parametrize("name", IMATRIX_FILES)
def test_broken_imatrix_one_line_exit_1(name, command, tmp_path):
    if name == "imatrix_wrong_width.gguf" and command.startswith("imatrix"):
        pytest.skip("a well-formed file; only wrong for a given model")
    res = CliRunner().invoke(main, IMATRIX_COMMANDS[command](str(BAD / name), tmp_path), catch_exceptions=False)
    assert res.exit_code == 1, res.output
    errors = [ln for ln in res.output.splitlines() if ln.startswith("Error:")]
    assert len(errors) == 1 and "Traceback" not in res.output, res.output
    assert not list(tmp_path.iterdir())
