"""`quantkit imatrix` against llama-imatrix (tests/data/imatrix, made by tools/make_imatrix_golden.py).

The model is the bundled SmolLM2 converted to F16 by our quantize (byte-identical to llama-quantize's;
the golden records its sha256). Settings are small (-c 128, 4 chunks) to keep the suite fast.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest

from conftest import run_cli
from quantkit.formats.imatrix import Entry, Imatrix, load_imatrix, save_imatrix_dat, save_imatrix_gguf
from quantkit.pipelines.chunks import open_for_chunks, tokenize

DATA = Path(__file__).parent / "data" / "imatrix"
GOLDEN = json.loads((DATA / "golden.json").read_text(encoding="utf-8"))
REF = DATA / "llama-imatrix.c128x4.gguf"
SAMPLE = DATA / "calibration-sample.txt"


def sha256(p) -> str:
    return hashlib.sha256(Path(p).read_bytes()).hexdigest()


cli = run_cli


@pytest.fixture(scope="session")
def f16(smollm2_f16) -> Path:
    return smollm2_f16


@pytest.fixture(scope="session")
def collected(f16, tmp_path_factory):
    """Our collection at the golden's settings, run from a directory holding the sample text."""
    d = tmp_path_factory.mktemp("imatrix-run")
    shutil.copy(SAMPLE, d / SAMPLE.name)
    r = cli(["imatrix", "-m", f16, "-f", SAMPLE.name, "-c", 128, "--chunks", 4, "-o", "ours.gguf", "-t", 1], cwd=d)
    assert r.exit_code == 0, r.output
    return d / "ours.gguf", r


def test_model_is_the_golden_model(f16):
    assert sha256(f16) == GOLDEN["model_sha256"]


def test_collection_matches_llama_imatrix(collected):
    path, _ = collected
    ours, ref = load_imatrix(path), load_imatrix(REF)
    assert sorted(ours.entries) == sorted(ref.entries)
    assert len(ours.entries) == 30 * 7                    # every blk matrix; token_embd never
    assert (ours.chunk_count, ours.chunk_size, ours.datasets) == (ref.chunk_count, ref.chunk_size, ref.datasets)
    rel = []
    for name, r in ref.entries.items():
        o = ours.entries[name]
        assert np.array_equal(o.counts, r.counts), name   # identical token counts
        assert o.sums.shape == r.sums.shape
        rel.append(np.abs(o.sums - r.sums) / np.maximum(np.abs(r.sums), 1e-30))
    rel = np.concatenate([x.ravel() for x in rel])
    assert rel.mean() < 1e-3, rel.mean()
    assert rel.max() < 5e-2, rel.max()


def test_collection_ppl_matches(collected):
    _, r = collected
    ppl = float(r.output.split("Final estimate: PPL = ")[1].split()[0])
    ref = GOLDEN["collect"]["ppl"][0]
    assert abs(ppl / ref - 1) < 5e-3
    assert "[1]" in r.output and "[4]" in r.output


def test_coverage_report(collected):
    _, r = collected
    assert "coverage: 210 of 210 collectable tensors have data" in r.output
    assert "coverage: tokens per tensor: 512" in r.output


@pytest.mark.parametrize("case", ["to_dat", "dat_to_gguf", "merge_c128", "merge_dat_c128"])
def test_conversions_byte_identical(case, tmp_path):
    """Converting and merging produce the very bytes llama-imatrix writes for the same inputs."""
    shutil.copy(REF, tmp_path / REF.name)
    conv = GOLDEN["convert"]
    # the dat made by llama-imatrix is reproduced by us first (to_dat), then used as an input
    r = cli(["imatrix", *conv["to_dat"]["command"][1:-3]], cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert sha256(tmp_path / "conv.dat") == conv["to_dat"]["sha256"]
    if case != "to_dat":
        r = cli(["imatrix", *conv[case]["command"][1:-3]], cwd=tmp_path)
        assert r.exit_code == 0, r.output
        out = conv[case]["command"][conv[case]["command"].index("-o") + 1]
        assert sha256(tmp_path / out) == conv[case]["sha256"]


def test_statistics_table_matches_llama(tmp_path):
    r = cli(["imatrix", "--in-file", REF.name, "--show-statistics"], cwd=DATA)
    assert r.exit_code == 0, r.output
    ours = [s for s in r.output.splitlines() if s.strip()]
    ref = GOLDEN["statistics"]["lines"]
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref):
        fa, fb = a.split("\t"), b.split("\t")
        assert len(fa) == len(fb), (a, b)
        for x, y in zip(fa, fb):
            if x == y:
                continue
            vx, vy = float(x.strip().rstrip("%")), float(y.strip().rstrip("%"))
            assert abs(vx - vy) <= 1e-3 * abs(vy) + 0.011, (a, b)


def test_statistics_on_dat(tmp_path):
    shutil.copy(REF, tmp_path / REF.name)
    assert cli(["imatrix", "--in-file", REF.name, "--output-format", "dat", "-o", "x.dat"], cwd=tmp_path).exit_code == 0
    r = cli(["imatrix", "--in-file", "x.dat", "--show-statistics"], cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert "Computing statistics for x.dat (210 tensors)" in r.output
    assert "Computing weighted average statistics per layer (30 layers)" in r.output


def test_continue_on_top(f16, tmp_path):
    """--in-file plus -f: collection continues on the loaded sums and counts."""
    shutil.copy(REF, tmp_path / REF.name)
    r = cli(["imatrix", "-m", f16, "-f", SAMPLE, "-c", 128, "--chunks", 2, "--no-ppl", "--in-file", REF.name,
             "-o", "more.gguf", "-t", 1], cwd=tmp_path)
    assert r.exit_code == 0, r.output
    im, ref = load_imatrix(tmp_path / "more.gguf"), load_imatrix(REF)
    assert im.chunk_count == 6 and im.datasets == ["calibration-sample.txt", str(SAMPLE)]
    e, er = im.entries["blk.3.ffn_down.weight"], ref.entries["blk.3.ffn_down.weight"]
    assert e.counts[0] == 512 + 256
    assert (e.sums >= er.sums).all() and (e.sums > er.sums).any()


def test_periodic_saves_and_snapshots(f16, tmp_path):
    r = cli(["imatrix", "-m", f16, "-f", SAMPLE, "-c", 64, "--chunks", 3, "-ofreq", 1, "--save-frequency", 2,
             "--no-ppl", "-o", "p.gguf", "-t", 1], cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert load_imatrix(tmp_path / "p.gguf").chunk_count == 3
    snap = load_imatrix(tmp_path / "p.gguf.at_2")
    assert snap.chunk_count == 2 and snap.entries["blk.0.attn_q.weight"].counts[0] == 128
    assert sorted(os.listdir(tmp_path)) == ["p.gguf", "p.gguf.at_2"]       # no temporary files left


def test_interrupted_run_keeps_last_complete_save(f16, tmp_path):
    """Ctrl-C after the second chunk: the file saved after chunk 2 is complete and nothing else remains."""
    from quantkit.pipelines import imatrix as im

    model, tok, runner = open_for_chunks(f16, 64, 64)
    with model:
        tokens = tokenize(tok, SAMPLE.read_text(), 64, "sample")
        acc = im.Accumulator(64)
        out = tmp_path / "i.gguf"

        def on_chunk(i, ppl):
            if i == 1:
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            im.collect(runner, tokens, None, acc, ["x"], im.CollectOptions(n_ctx=64, n_batch=64, out_freq=1),
                       im.SaveOptions(str(out)), on_chunk=on_chunk)
    assert load_imatrix(out).chunk_count == 2
    assert os.listdir(tmp_path) == ["i.gguf"]


def test_interrupted_save_leaves_previous_file(tmp_path, monkeypatch):
    from quantkit.formats import gguf_io
    from quantkit.pipelines import imatrix as im

    acc = im.Accumulator(16)
    acc.sums["blk.0.ffn_up.weight"] = np.ones((1, 32))
    acc.counts["blk.0.ffn_up.weight"] = np.array([16.0])
    out = tmp_path / "s.gguf"
    im.save(acc, ["d"], im.SaveOptions(str(out)))
    before = out.read_bytes()
    acc.counts["blk.0.ffn_up.weight"] += 16

    def boom(self, *a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf_io.GGUFOutput, "write", boom)
    with pytest.raises(KeyboardInterrupt):
        im.save(acc, ["d"], im.SaveOptions(str(out)))
    assert out.read_bytes() == before
    assert os.listdir(tmp_path) == ["s.gguf"]


# -- bad input: one line, exit 1 (2 for usage), nothing written ---------------------------------

def _one_line_error(r, code, text):
    assert r.exit_code == code, r.output
    assert text in r.output
    assert "Traceback" not in r.output


def test_text_too_short(f16, tmp_path):
    (tmp_path / "short.txt").write_text("Just a few words.\n")
    r = cli(["imatrix", "-m", f16, "-f", "short.txt", "-c", 128, "-o", "x.gguf"], cwd=tmp_path)
    _one_line_error(r, 1, "you need at least 256 tokens for a context of 128 tokens")
    assert not (tmp_path / "x.gguf").exists()


def test_empty_file(f16, tmp_path):
    (tmp_path / "empty.txt").write_text("")
    r = cli(["imatrix", "-m", f16, "-f", "empty.txt", "-o", "x.gguf"], cwd=tmp_path)
    _one_line_error(r, 1, "empty.txt: the file is empty")
    assert os.listdir(tmp_path) == ["empty.txt"]


def test_in_file_from_another_model(f16, tmp_path):
    im = Imatrix({"blk.99.ffn_up.weight": Entry(np.ones((1, 576), np.float32), np.ones(1, np.float32))},
                 ["d"], 1, 128)
    save_imatrix_gguf(im, tmp_path / "other.gguf")
    r = cli(["imatrix", "-m", f16, "-f", SAMPLE, "-c", 128, "--in-file", "other.gguf", "-o", "x.gguf"], cwd=tmp_path)
    _one_line_error(r, 1, "'blk.99.ffn_up.weight' names a weight that")
    assert not (tmp_path / "x.gguf").exists()


def test_in_file_wrong_columns(f16, tmp_path):
    im = Imatrix({"blk.0.ffn_up.weight": Entry(np.ones((1, 100), np.float32), np.ones(1, np.float32))}, ["d"], 1, 128)
    save_imatrix_gguf(im, tmp_path / "odd.gguf")
    r = cli(["imatrix", "-m", f16, "-f", SAMPLE, "-c", 128, "--in-file", "odd.gguf", "-o", "x.gguf"], cwd=tmp_path)
    _one_line_error(r, 1, "has 100 columns")


def test_merge_shape_mismatch(tmp_path):
    a = Imatrix({"blk.0.ffn_up.weight": Entry(np.ones((1, 64), np.float32), np.ones(1, np.float32))}, ["a"], 1, 16)
    b = Imatrix({"blk.0.ffn_up.weight": Entry(np.ones((1, 32), np.float32), np.ones(1, np.float32))}, ["b"], 1, 16)
    save_imatrix_gguf(a, tmp_path / "a.gguf")
    save_imatrix_dat(b, tmp_path / "b.dat")
    r = cli(["imatrix", "--in-file", "a.gguf,b.dat", "-o", "m.gguf"], cwd=tmp_path)
    _one_line_error(r, 1, "entry 'blk.0.ffn_up.weight' has 1 x 32 values, but a.gguf gave it 1 x 64")
    assert not (tmp_path / "m.gguf").exists()


def test_not_an_imatrix(tmp_path):
    (tmp_path / "junk.dat").write_bytes(struct.pack("<i", 1_000_000) + b"xx")
    r = cli(["imatrix", "--in-file", "junk.dat", "-o", "m.gguf"], cwd=tmp_path)
    _one_line_error(r, 1, "junk.dat")
    r = cli(["imatrix", "--in-file", "missing.gguf", "-o", "m.gguf"], cwd=tmp_path)
    _one_line_error(r, 1, "missing.gguf: no such imatrix file")


def test_usage_errors(tmp_path):
    _one_line_error(cli(["imatrix", "--show-statistics"], cwd=tmp_path), 2, "exactly one --in-file")
    _one_line_error(cli(["imatrix", "-c", 128, "-b", 300], cwd=tmp_path), 2, "batch size 300")
    _one_line_error(cli(["imatrix", "--output-format", "xml"], cwd=tmp_path), 2, "xml")
    _one_line_error(cli(["imatrix", "-ofreq", 0], cwd=tmp_path), 2, "0")


def test_help_names_default_text():
    r = cli(["imatrix", "--help"])
    assert r.exit_code == 0 and "built-in calibration text" in r.output


def test_imatrix_same_for_1_and_2_threads(f16, tmp_path):
    outs = []
    for t in (1, 2):
        r = cli(["imatrix", "-m", f16, "-f", SAMPLE, "-c", 64, "--chunks", 2, "--no-ppl", "-o", f"t{t}.gguf",
                 "-t", t], cwd=tmp_path)
        assert r.exit_code == 0, r.output
        outs.append(load_imatrix(tmp_path / f"t{t}.gguf"))
    assert outs[0].entries.keys() == outs[1].entries.keys()
    for k, e in outs[0].entries.items():
        assert np.array_equal(e.sums, outs[1].entries[k].sums), k
        assert np.array_equal(e.counts, outs[1].entries[k].counts), k


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL])
def test_killed_imatrix_leaves_nothing_or_a_complete_file(sig, f16, tmp_path):
    """A real `quantkit imatrix` process saving after every chunk, signalled in the middle of its second
    save (paused after 10 of that save's tensors, tests/faults.py): the output is the complete first
    save; SIGINT/SIGTERM leave no temporary file (SIGKILL leaves the hidden one, never a damaged output)."""
    from faults import Job

    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = out_dir / "k.gguf"
    n_tensors = 2 * 7 * 30          # in_sum2 and counts for the 7 matrices of SmolLM2's 30 layers
    job = Job(["imatrix", "-m", f16, "-f", SAMPLE, "-c", 64, "-ofreq", 1, "--no-ppl", "-q", "-t", 1, "-o", out],
              tmp_path / "ctl", pause=("gguf.tensor", n_tensors + 10))
    job.wait_paused()
    assert list(out_dir.glob(".k.gguf.*.partial")), "not paused inside the second save"
    job.signal(sig)
    im = load_imatrix(out)
    assert im.chunk_count == 1 and len(im.entries) == 7 * 30
    left = [p.name for p in out_dir.iterdir() if p.name != "k.gguf"]
    if sig != signal.SIGKILL:
        assert left == [], left
        assert job.proc.returncode == 128 + sig
    else:
        assert len(left) == 1 and left[0].endswith(".partial"), left


def test_column_sums_of_squares_are_float64_and_thread_independent():
    """The collector's kernel: out += per-column sum of x^2 in float64, equal to a float64 numpy sum
    (within float64 rounding) and bit-identical at 1 and 2 threads; widths not a multiple of its
    64-column stripes included."""
    from quantkit.jit import get_threads, set_threads
    from quantkit.pipelines.imatrix import _add_col_sumsq

    rng = np.random.default_rng(3)
    for d in (576, 1536, 100):
        x = (rng.standard_normal((77, d)) * 30).astype(np.float32)
        want = 5.0 + (x.astype(np.float64) ** 2).sum(axis=0)
        got = []
        before = get_threads()
        try:
            for n in (1, 2):
                set_threads(n)
                out = np.full(d, 5.0)
                _add_col_sumsq(x, out)
                got.append(out)
        finally:
            set_threads(before)
        np.testing.assert_allclose(got[0], want, rtol=1e-13)
        assert np.array_equal(got[0], got[1])
