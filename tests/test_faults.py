"""The faults a long job meets, on real processes: a full disk, an input changed under it, two runs on
one output, signals (docs/guarantees.md lists each promise with its test here).

Every test acts on a process paused at a named point (tests/faults.py), never after a guessed delay.
The quantize tests convert the session's SmolLM2 F16 to Q4_0, whose bytes llama-quantize's golden
hash pins (tests/data/quantize/golden.json).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from conftest import sha256
from faults import Job, listing, one_line_error

GOLDEN = json.loads((Path(__file__).parent / "data" / "quantize" / "golden.json").read_text())["cases"]
Q4_0 = GOLDEN["q4_0"]


@pytest.fixture
def dirs(tmp_path):
    out, ctl = tmp_path / "out", tmp_path / "ctl"
    out.mkdir()
    ctl.mkdir()
    return out, ctl


def quantize(f16, out, ctl, **kw) -> Job:
    return Job(["quantize", "-q", f16, out, "Q4_0", "2"], ctl, **kw)


# -- full disk ---------------------------------------------------------------------------------

def test_file_size_limit_refused_before_the_first_byte(smollm2_f16, dirs):
    """A file-size limit (ulimit -f) below the planned size: refused at once, saying how much the
    output needs; no temporary file was ever created (the refusal comes before the source scan)."""
    out, ctl = dirs
    job = quantize(smollm2_f16, out / "o.gguf", ctl, rlimit_fsize=60 << 20)
    job.finish()
    one_line_error(job, "o.gguf", "the quantized model needs 87.5 MiB", "file size limit of 60.0 MiB")
    assert listing(out) == []


def test_file_size_limit_hit_mid_write(smollm2_f16, dirs):
    """The limit lowered while the job writes (as a disk filling up): one line naming the limit, the
    planned size and what was written; nothing left in the folder."""
    out, ctl = dirs
    job = quantize(smollm2_f16, out / "o.gguf", ctl, pause=("quantize.tensor", 3))
    job.wait_paused()
    [tmp] = list(out.glob(".o.gguf.*.partial"))
    limit = tmp.stat().st_size + (1 << 20)
    resource.prlimit(job.proc.pid, resource.RLIMIT_FSIZE, (limit, limit))
    job.resume()
    job.finish()
    one_line_error(job, "the file size limit of", "the quantized model needs 87.5 MiB",
                   "were written; nothing was left at")
    assert listing(out) == []


def _can_mount() -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return True


@pytest.fixture
def small_fs(tmp_path):
    """A 120 MiB tmpfs (skipped where this process may not mount one)."""
    if not _can_mount():
        pytest.skip("needs root to mount a tmpfs")
    d = tmp_path / "fs"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120m", "tmpfs", str(d)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.decode().strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_full_disk_refused_before_the_first_byte(smollm2_f16, small_fs, tmp_path):
    """60 MiB free for an 87.5 MiB output: refused at once, naming the folder and both sizes."""
    (small_fs / "filler").write_bytes(bytes(60 << 20))
    job = quantize(smollm2_f16, small_fs / "o.gguf", tmp_path / "ctl")
    job.finish()
    one_line_error(job, "not enough free space", "the quantized model needs 87.5 MiB", f"{small_fs} has only")
    assert listing(small_fs) == ["filler"]


def test_disk_fills_up_mid_write(smollm2_f16, small_fs, tmp_path):
    """Enough room at the start, then another writer takes it: 'the disk is full', where, how much
    the output needs and how much was written; the temporary file is removed."""
    job = quantize(smollm2_f16, small_fs / "o.gguf", tmp_path / "ctl", pause=("quantize.tensor", 3))
    job.wait_paused()
    st = os.statvfs(small_fs)
    (small_fs / "filler").write_bytes(bytes(st.f_bavail * st.f_frsize - (1 << 20)))
    job.resume()
    job.finish()
    one_line_error(job, "the disk is full", str(small_fs), "the quantized model needs 87.5 MiB", "were written")
    assert listing(small_fs) == ["filler"]


# -- two runs on one output --------------------------------------------------------------------

def test_second_run_on_the_same_output_refuses(smollm2_f16, dirs):
    """A second quantize of the same output while the first writes: one line, at once, and the first
    finishes with llama-quantize's bytes."""
    out, ctl = dirs
    first = quantize(smollm2_f16, out / "o.gguf", ctl, pause=("quantize.tensor", 2))
    first.wait_paused()
    second = quantize(smollm2_f16, out / "o.gguf", ctl)
    second.finish()
    one_line_error(second, "o.gguf: another process is writing this file now")
    first.resume()
    assert first.finish() == 0, first.err
    assert listing(out) == ["o.gguf"]
    assert sha256(out / "o.gguf") == Q4_0["sha256"]


def test_two_runs_at_once_leave_one_complete_file(smollm2_f16, dirs):
    """Started together: whichever way they overlap, each either refuses with one line or renames a
    complete file; the output is llama-quantize's bytes and no temporary file remains."""
    out, ctl = dirs
    jobs = [quantize(smollm2_f16, out / "o.gguf", ctl) for _ in range(2)]
    codes = [j.finish() for j in jobs]
    assert 0 in codes, [j.err for j in jobs]
    for j in jobs:
        if j.proc.returncode:
            one_line_error(j, "another process is writing this file now")
    assert listing(out) == ["o.gguf"]
    assert sha256(out / "o.gguf") == Q4_0["sha256"]


def test_killed_run_leftover_is_removed_by_the_next(smollm2_f16, dirs):
    """SIGKILL leaves the hidden temporary file (nothing can run); the next run of the same output
    removes it once it is unlocked and stale."""
    out, ctl = dirs
    job = quantize(smollm2_f16, out / "o.gguf", ctl, pause=("quantize.tensor", 2))
    job.wait_paused()
    job.signal(signal.SIGKILL)
    [left] = listing(out)
    assert left.startswith(".o.gguf.") and left.endswith(".partial")
    os.utime(out / left, (1, 1))               # as if killed a while ago
    again = quantize(smollm2_f16, out / "o.gguf", ctl)
    assert again.finish() == 0, again.err
    assert listing(out) == ["o.gguf"]


# -- an input changed while mapped -------------------------------------------------------------

@pytest.mark.parametrize("change", ["truncate", "replace"])
def test_input_changed_mid_run(smollm2_f16, dirs, tmp_path, change):
    """The source truncated under the memory map (reading past its new end would raise SIGBUS and kill
    the process without a word) or replaced by another file: one line, exit 1, nothing at the output."""
    out, ctl = dirs
    src = tmp_path / "src.gguf"
    shutil.copy(smollm2_f16, src)
    job = quantize(src, out / "o.gguf", ctl, pause=("quantize.tensor", 2))
    job.wait_paused()
    if change == "truncate":
        os.truncate(src, 1 << 20)               # every tensor still to come lies past the new end
    else:
        other = tmp_path / "other.gguf"
        shutil.copy(smollm2_f16, other)
        os.replace(other, src)
    job.resume()
    job.finish()
    how = "its size went from" if change == "truncate" else "it was replaced by another file"
    one_line_error(job, "src.gguf: the input changed while it was being read", how)
    assert listing(out) == []
