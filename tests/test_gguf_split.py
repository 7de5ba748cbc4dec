"""Split GGUF in and out: `quantkit gguf-split` and `quantize --keep-split` against llama.cpp's own files
(sha256 per part, tests/data/split/golden.json from tools/make_split_golden.py), and every reader
opening a split model from its first part with the same results as on one file.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFValueType

from archmodels import write_model
from conftest import bundled_model, run_cli, sha256
from quantkit.errors import FormatError
from quantkit.formats import gguf_split
from quantkit.formats.gguf_io import KV, GGUFModel, GGUFOutput, Tensor, split_path, split_prefix

GOLDEN = json.loads((Path(__file__).parent / "data" / "split" / "golden.json").read_text())
CASES = GOLDEN["cases"]


def _check_source(name: str, path: Path) -> None:
    want = GOLDEN["sources"][name]["sha256"]
    assert sha256(path) == want, f"not the {name} file llama.cpp ran (tests/archmodels.py or gguf changed?)"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    p = write_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf", "qwen3", "Q")
    _check_source("tiny", p)
    return p


@pytest.fixture(scope="module")
def tiny_f16(tmp_path_factory) -> Path:
    p = write_model(tmp_path_factory.mktemp("tiny") / "tiny_f16.gguf", "qwen3", "F16")
    _check_source("tiny_f16", p)
    return p


def _expect(case: str, folder: Path) -> None:
    """The files of ``folder`` are the case's files, byte for byte."""
    want = CASES[case]["files"]
    got = sorted(p.name for p in folder.iterdir())
    assert got == [f["name"] for f in want], "no temporary or extra file may be left either"
    for f in want:
        assert sha256(folder / f["name"]) == f["sha256"], f["name"]


def _split_args(case: str) -> list[str]:
    """The case's llama-gguf-split flags (without its INPUT / OUTPUT words)."""
    return [a for a in CASES[case]["args"] if a.startswith("--") or a[0].isdigit()]


def _gguf_split(src, out_prefix, case):
    res = run_cli(["gguf-split", *_split_args(case), src, out_prefix])
    assert res.exit_code == 0, res.output
    return res


# -- writing: the same bytes as llama-gguf-split / llama-quantize --keep-split ------------------------

@pytest.mark.parametrize("case", ["split_tensors_100", "split_default", "split_size_40M_no_first"])
def test_split_bundled_matches_llama(case, tmp_path):
    _check_source("bundled", Path(bundled_model()))
    res = _gguf_split(bundled_model(), tmp_path / "m", case)
    _expect(case, tmp_path)
    n = len(CASES[case]["files"])
    assert f"n_split: {n}" in res.output and f"gguf split written with a total of 272 tensors" in res.output


@pytest.mark.parametrize("case", ["tiny_split_tensors_7", "tiny_split_size_1M", "tiny_split_no_first"])
def test_split_tiny_matches_llama(case, tiny, tmp_path):
    _gguf_split(tiny, tmp_path / "t", case)
    _expect(case, tmp_path)


def test_merge_matches_llama_and_the_original(tmp_path):
    parts = tmp_path / "parts"
    parts.mkdir()
    _gguf_split(bundled_model(), parts / "m", "split_size_40M_no_first")
    out = tmp_path / "merged"
    out.mkdir()
    res = run_cli(["gguf-split", "--merge", parts / "m-00001-of-00004.gguf", out / "merged.gguf"])
    assert res.exit_code == 0, res.output
    _expect("merge_size_40M", out)
    # llama.cpp's merge keeps the first part's keys (split.count set to 0 at the end): the tensors are
    # the original's, byte for byte, and so are all other keys
    with GGUFModel(bundled_model()) as a, GGUFModel(out / "merged.gguf") as b:
        assert [(t.name, t.shape, t.type) for t in a.tensors] == [(t.name, t.shape, t.type) for t in b.tensors]
        assert all(np.array_equal(x.data, y.data) for x, y in zip(a.tensors, b.tensors))
        assert [k for k in b.kv if not k.key.startswith("split.")] == a.kv
        assert [(k.key, k.value) for k in b.kv if k.key.startswith("split.")] == \
            [("split.no", 0), ("split.tensors.count", 272), ("split.count", 0)]
    # a merged file is not merged again, and an existing output is never overwritten
    res = run_cli(["gguf-split", "--merge", out / "merged.gguf", tmp_path / "again.gguf"])
    assert res.exit_code == 1 and "not a valid split count" in res.output
    res = run_cli(["gguf-split", "--merge", parts / "m-00001-of-00004.gguf", out / "merged.gguf"])
    assert res.exit_code == 1 and "already exists" in res.output


def test_keep_split_matches_llama_quantize(smollm2_f16, tmp_path):
    _check_source("f16", smollm2_f16)
    src = tmp_path / "src"
    src.mkdir()
    _gguf_split(smollm2_f16, src / "f16", "f16_split_tensors_100")
    _expect("f16_split_tensors_100", src)
    out = tmp_path / "out"
    out.mkdir()
    res = run_cli(["quantize", "-q", "--keep-split", src / "f16-00001-of-00003.gguf", out / "q.gguf", "Q4_K_M", "2"])
    assert res.exit_code == 0, res.output
    _expect("keep_split_q4_k_m", out)


@pytest.mark.parametrize("case", ["tiny_keep_split_q4_k_m", "tiny_keep_split_q2_k"])
def test_keep_split_tiny_matches_llama_quantize(case, tiny_f16, tmp_path):
    """The tiny file's tensors are not in the model loader's order: --keep-split writes and decides types
    in (part, offset) order, so these also check the type rules' counters ran in that order."""
    src = tmp_path / "src"
    src.mkdir()
    _gguf_split(tiny_f16, src / "t", "tiny_f16_split_tensors_7")
    out = tmp_path / "out"
    out.mkdir()
    ftype = CASES[case]["args"][-2]
    res = run_cli(["quantize", "-q", "--keep-split", src / "t-00001-of-00004.gguf", out / "q.gguf", ftype, "2"])
    assert res.exit_code == 0, res.output
    _expect(case, out)


def test_keep_split_single_file(smollm2_f16, tmp_path):
    """A one-file input with --keep-split: OUTPUT-00001-of-00001.gguf, no split keys, file order."""
    res = run_cli(["quantize", "-q", "--keep-split", smollm2_f16, tmp_path / "q.gguf", "Q8_0", "2"])
    assert res.exit_code == 0, res.output
    _expect("keep_split_single_q8_0", tmp_path)


@pytest.mark.parametrize("case", ["q8_0_split_tensors_100", "q8_0_split_size_50M"])
def test_quantize_split_limits_match_quantize_then_gguf_split(case, smollm2_f16, tmp_path):
    """quantkit's --split-max-tensors / --split-max-size on quantize: llama-quantize's file split by
    llama-gguf-split with the same limit."""
    res = run_cli(["quantize", "-q", *_split_args(case)[1:], smollm2_f16, tmp_path / "q.gguf", "Q8_0", "2"])
    assert res.exit_code == 0, res.output
    _expect(case, tmp_path)


def test_quantize_split_usage_errors(smollm2_f16, tmp_path):
    res = run_cli(["quantize", "--keep-split", "--split-max-size", "50M", smollm2_f16, tmp_path / "q.gguf", "Q8_0"])
    assert res.exit_code == 2 and "cannot be combined" in res.output
    res = run_cli(["quantize", "--split-max-size", "50K", smollm2_f16, tmp_path / "q.gguf", "Q8_0"])
    assert res.exit_code == 2 and "supported units" in res.output
    assert list(tmp_path.iterdir()) == []


# -- reading: every command opens the first part -----------------------------------------------------

@pytest.fixture(scope="module")
def tiny_parts(tiny, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("parts")
    _gguf_split(tiny, folder / "t", "tiny_split_tensors_7")
    return folder / "t-00001-of-00004.gguf"


def test_split_model_reads_like_the_file(tiny, tiny_parts):
    with GGUFModel(tiny) as one, GGUFModel(tiny_parts) as split:
        assert len(split.parts) == 4 and split.file_size == sum(p.stat().st_size for p in tiny_parts.parent.iterdir())
        assert [k for k in split.kv if not k.key.startswith("split.")] == one.kv
        assert [(t.name, t.shape, t.type) for t in split.tensors] == [(t.name, t.shape, t.type) for t in one.tensors]
        for t in split.tensors:
            assert np.array_equal(t.data, one.tensor(t.name).data)
            # mapped from its own part's file, not copied
            part = split.parts[split.part_of[t.name]]
            base = np.frombuffer(part.reader.data._mmap, dtype=np.uint8).__array_interface__["data"][0]
            addr = t.data.__array_interface__["data"][0]
            assert base <= addr < base + part.file_size and not t.data.flags.owndata
        split.check_unchanged()


def test_forward_on_split_model_equals_the_file(tiny, tiny_parts):
    from quantkit.model.forward import Runner
    from quantkit.model.llama import Llama

    ids = np.arange(1, 40, dtype=np.int64) * 7 % 500
    with Llama(tiny) as a, Llama(tiny_parts) as b:
        assert np.array_equal(Runner(a, 64).forward(ids, logits="all"), Runner(b, 64).forward(ids, logits="all"))


def test_commands_read_the_first_part(tiny, tiny_parts, tmp_path):
    """verify, run, perplexity, imatrix and quantize (without --keep-split) on the first part: the
    merged file's results."""
    a, b = run_cli(["verify", "-v", tiny]), run_cli(["verify", "-v", tiny_parts])
    assert a.exit_code == b.exit_code and a.output == b.output and "25/25 tensors ok" in b.output
    outs = []
    for src in (tiny, tiny_parts):
        res = run_cli(["run", "-m", src, "-p", "the", "-n", "6", "--temp", "0", "-s", "1"])
        assert res.exit_code == 0, res.output
        outs.append(res.output.splitlines()[0])
    assert outs[0] == outs[1]
    text = tmp_path / "t.txt"
    rng = np.random.default_rng(0)
    text.write_text(" ".join(rng.choice("the then to that this at in is it on one an a and or of".split(), 1500)))
    ppl, imat = [], []
    for src, name in ((tiny, "a"), (tiny_parts, "b")):
        res = run_cli(["perplexity", "-m", src, "-f", text, "-c", "64", "--chunks", "3"])
        assert res.exit_code == 0, res.output
        ppl.append([ln for ln in res.output.splitlines() if ln.startswith("Final estimate")])
        res = run_cli(["imatrix", "-m", src, "-f", text, "-c", "64", "--chunks", "2", "-o", tmp_path / f"{name}.imatrix"])
        assert res.exit_code == 0, res.output
        imat.append(sha256(tmp_path / f"{name}.imatrix"))
    assert ppl[0] and ppl[0] == ppl[1] and imat[0] == imat[1]
    for src, name in ((tiny, "a.gguf"), (tiny_parts, "b.gguf")):
        res = run_cli(["quantize", "-q", "--allow-requantize", src, tmp_path / name, "Q8_0", "2"])
        assert res.exit_code == 0, res.output
    assert sha256(tmp_path / "a.gguf") == sha256(tmp_path / "b.gguf")


# -- refusals: one line each ---------------------------------------------------------------------------

def _write_parts(folder: Path, kv_of, tensor_groups, prefix="p", count=None):
    """Write a hand-made split model: part i gets kv_of(i) and tensor_groups[i] (name, values)."""
    count = count or len(tensor_groups)
    paths = []
    for i, group in enumerate(tensor_groups):
        ts = [Tensor(n, (4,), GGMLQuantizationType.F32) for n, _ in group]
        path = folder / Path(split_path(prefix, i, count)).name
        with GGUFOutput(path, kv_of(i), ts) as out:
            for n, v in group:
                out.write(n, np.full(4, v, dtype=np.float32))
            out.commit()
        paths.append(path)
    return paths


def _kv(no, count, n_tensors):
    head = [KV("general.architecture", "llama", GGUFValueType.STRING)] if no == 0 else []
    return head + [KV("split.no", no, GGUFValueType.UINT16), KV("split.count", count, GGUFValueType.UINT16),
                   KV("split.tensors.count", n_tensors, GGUFValueType.INT32)]


GROUPS = [[("a", 1.0)], [("b", 2.0)], [("c", 3.0)]]


def test_hand_made_split_reads(tmp_path):
    paths = _write_parts(tmp_path, lambda i: _kv(i, 3, 3), GROUPS)
    with GGUFModel(paths[0]) as m:
        assert [t.name for t in m.tensors] == ["a", "b", "c"]
        assert [float(m.tensor(n).data.view(np.float32).reshape(-1)[0]) for n in "abc"] == [1.0, 2.0, 3.0]
        assert [m.location(n)[0] for n in "abc"] == [0, 1, 2]


@pytest.mark.parametrize("fault, message", [
    ("missing", "part 3 of 3"),
    ("wrong_no", "split.no is 2, expected 1"),
    ("wrong_count", "split.count is 4, but the first part"),
    ("duplicate", "tensor 'a' is duplicated (also in part 1)"),
    ("total", "split.tensors.count says 5 tensors, but the 3 parts hold 3"),
    ("second", "part 2 of a split model of 3 parts; open its first part"),
    ("bad_name", "must be named PREFIX-00001-of-00003.gguf"),
])
def test_broken_split_is_one_line(fault, message, tmp_path):
    groups = [list(g) for g in GROUPS]
    kv_of = lambda i: _kv(i, 3, 5 if fault == "total" else 3)  # noqa: E731
    if fault == "wrong_no":
        kv_of = lambda i: _kv(2 if i == 1 else i, 3, 3)  # noqa: E731
    if fault == "wrong_count":
        kv_of = lambda i: _kv(i, 4 if i == 2 else 3, 3)  # noqa: E731
    if fault == "duplicate":
        groups[2] = [("a", 3.0)]
    paths = _write_parts(tmp_path, kv_of, groups)
    first = paths[0]
    if fault == "missing":
        paths[2].unlink()
    if fault == "second":
        first = paths[1]
    if fault == "bad_name":
        first = first.rename(tmp_path / "model.gguf")
    with pytest.raises(FormatError) as e:
        GGUFModel(first)
    assert message in str(e.value) and "\n" not in str(e.value)
    res = run_cli(["verify", first])                         # the command line: one line, exit 1
    assert res.exit_code == 1 and message in res.output and "Traceback" not in res.output


# -- all or nothing --------------------------------------------------------------------------------------

def test_failed_split_leaves_no_part(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = GGUFOutput.write

    def failing(self, name, data):
        calls["n"] += 1
        if calls["n"] == 150:                       # in the second part
            raise OSError(28, "No space left on device")
        return real(self, name, data)

    monkeypatch.setattr(GGUFOutput, "write", failing)
    with pytest.raises(OSError):
        run_cli(["gguf-split", "--split-max-tensors", "100", bundled_model(), tmp_path / "m"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL], ids=["SIGINT", "SIGKILL"])
def test_signalled_split_leaves_no_part(sig, tmp_path):
    """A real `quantkit gguf-split` signalled while provably in its second part (paused at its 150th
    tensor, tests/faults.py): no part at any output name; Ctrl-C leaves nothing at all, SIGKILL only the
    hidden temporary files."""
    from faults import Job

    out = tmp_path / "out"
    out.mkdir()
    job = Job(["gguf-split", "-q", "--split-max-tensors", "100", bundled_model(), out / "m"], tmp_path / "ctl",
              pause=("gguf_split.tensor", 150))
    job.wait_paused()
    job.signal(sig)
    left = sorted(p.name for p in out.iterdir())
    if sig == signal.SIGINT:
        assert left == [] and job.proc.returncode == 128 + sig and "Traceback" not in job.err
    else:
        assert left and all(n.startswith(".m-0000") and n.endswith(".partial") for n in left), left


def test_failed_rename_removes_the_parts_already_renamed(tmp_path, monkeypatch):
    real = GGUFOutput.commit

    def commit(self):
        if "00003" in self.path.name:
            self.abort()
            raise FormatError(f"{self.path}: cannot finish writing")
        return real(self)

    monkeypatch.setattr(GGUFOutput, "commit", commit)
    res = run_cli(["gguf-split", "--split-max-tensors", "100", bundled_model(), tmp_path / "m"])
    assert res.exit_code == 1 and "cannot finish writing" in res.output
    assert list(tmp_path.iterdir()) == []


def test_size_limit_below_one_tensor_is_refused(tmp_path):
    res = run_cli(["gguf-split", "--split-max-size", "1M", bundled_model(), tmp_path / "m"])
    assert res.exit_code == 1 and "a part would hold no tensors" in res.output and "token_embd.weight" in res.output
    assert list(tmp_path.iterdir()) == []


def test_dry_run_writes_nothing(tmp_path):
    res = run_cli(["gguf-split", "--dry-run", "--split-max-tensors", "100", bundled_model(), tmp_path / "m"])
    assert res.exit_code == 0 and "split 00003: n_tensors = 72, total_size = 17M" in res.output
    assert list(tmp_path.iterdir()) == []


# -- the command line ------------------------------------------------------------------------------------

@pytest.mark.parametrize("args, message", [
    (["--split-max-tensors", "5", "--split-max-size", "1G"], "not both"),
    (["--split-max-size", "10K"], "supported units are M"),
    (["--split-max-size", "0M"], "positive"),
    (["--split-max-tensors", "0"], "x>=1"),
    (["--merge", "--split-max-tensors", "5"], "are for --split"),
    (["--delete-splits"], "is for --merge"),
])
def test_usage_errors(args, message, tmp_path):
    res = run_cli(["gguf-split", *args, bundled_model(), tmp_path / "m"])
    assert res.exit_code == 2 and message in res.output
    assert list(tmp_path.iterdir()) == []


def test_help_names_every_option():
    res = run_cli(["gguf-split", "--help"])
    assert res.exit_code == 0
    for opt in ("--split", "--merge", "--split-max-tensors", "--split-max-size", "--no-tensor-first-split",
                "--dry-run", "--delete-splits", "--quiet"):
        assert opt in res.output
    res = run_cli(["quantize", "--help"])
    assert "--keep-split" in res.output


def test_merge_delete_splits(tmp_path):
    _gguf_split(bundled_model(), tmp_path / "m", "split_tensors_100")
    res = run_cli(["gguf-split", "--merge", "--delete-splits", tmp_path / "m-00001-of-00003.gguf",
                   tmp_path / "all.gguf"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["all.gguf"]


def test_split_names_as_llama():
    assert split_path("out/m", 0, 3) == "out/m-00001-of-00003.gguf"
    assert split_prefix("out/m-00002-of-00003.gguf", 1, 3) == "out/m"
    assert split_prefix("out/m-00002-of-00003.gguf", 0, 3) is None
    assert split_prefix("-00001-of-00001.gguf", 0, 1) is None          # nothing before the tail
    assert gguf_split.parse_split_size("2G") == 2 * 10 ** 9 and gguf_split.parse_split_size("500M") == 5 * 10 ** 8
    assert os.fspath(split_path(Path("a"), 9, 10)) == "a-00010-of-00010.gguf"
