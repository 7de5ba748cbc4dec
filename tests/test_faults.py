"""The faults a long job meets, on real processes: a full disk, an input changed under it, two runs on
one output, signals (docs/guarantees.md lists each promise with its test here).

Every test acts on a process paused at a named point (tests/faults.py), never after a guessed delay.
The quantize tests convert the session's SmolLM2 F16 to Q4_0, whose bytes llama-quantize's golden
hash pins (tests/data/quantize/golden.json).
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import sha256
from faults import Job, default_sigint, listing, one_line_error

GOLDEN = json.loads((Path(__file__).parent / "data" / "quantize" / "golden.json").read_text())["cases"]
Q4_0 = GOLDEN["q4_0"]
SAMPLE = Path(__file__).parent / "data" / "perplexity" / "evaluation-sample.txt"


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


def _fill(d: Path, leave: int) -> None:
    """Take all but ``leave`` bytes of ``d``'s file system, in 1 MiB writes that stop at a full disk:
    a paused quantize's write-behind thread may still be writing the tensor before the pause, so the
    free space read first can shrink while this writes."""
    st = os.statvfs(d)
    want = st.f_bavail * st.f_frsize - leave
    block = bytes(1 << 20)
    fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        while want > 0:
            try:
                want -= os.write(fd, block[:min(want, len(block))])
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
    finally:
        os.close(fd)


def test_disk_fills_up_mid_write(smollm2_f16, small_fs, tmp_path):
    """Enough room at the start, then another writer takes it: 'the disk is full', where, how much
    the output needs and how much was written; the temporary file is removed."""
    job = quantize(smollm2_f16, small_fs / "o.gguf", tmp_path / "ctl", pause=("quantize.tensor", 3))
    job.wait_paused()
    _fill(small_fs, leave=1 << 20)
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


# -- every command, every signal ---------------------------------------------------------------

# (arguments, how to see the job is at work: ("pause", point) -- signalled while it waits there, after
# its first chunk or tensor -- or ("stderr"/"stdout", text)); every job has far more work left than the
# signal takes to arrive.
COMMANDS = {
    "run": (["run", "-p", "1, 2, 3, 4, 5, 6, 7,", "-n", "2000", "-c", "2048", "--temp", "0"], ("stdout", "8, 9,")),
    "bench": (["bench", "-p", "512", "-n", "0", "-r", "50", "--progress"], ("stderr", "benchmark 1/1")),
    "perplexity": (["perplexity", "-f", "TEXT", "-c", "256"], ("pause", "perplexity.chunk")),
    "imatrix": (["imatrix", "-f", "TEXT", "-c", "256", "--no-ppl", "-o", "OUT/i.gguf"], ("pause", "imatrix.chunk")),
    "verify": (["verify", "MODEL"], ("pause", "verify.tensor")),
    "roundtrip": (["roundtrip", "-m", "MODEL", "--tensors", "."], ("stderr", "round-trip of")),
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_signal_stops_every_command(command, sig, smollm2_f16, dirs):
    """Ctrl-C or SIGTERM while the command works: it ends (tests/faults.py's generous HANG guards only
    against a hang) with the shell's code (128 + signal), one 'interrupted' line, no traceback and no
    temporary file left; a job signalled between two chunks or tensors stops before the next one."""
    out, ctl = dirs
    args, (kind, what) = COMMANDS[command]
    text = ctl / "long.txt"          # ~8k tokens: 32 chunks of 256
    text.write_text("\n".join([SAMPLE.read_text(encoding="utf-8")] * 12), encoding="utf-8")
    subst = {"MODEL": smollm2_f16, "TEXT": text}
    args = [str(out / a[4:]) if a.startswith("OUT/") else subst.get(a, a) for a in args]
    if command in ("run", "bench", "perplexity", "imatrix"):
        args += ["-m", smollm2_f16]
    job = Job(args, ctl, pause=(what, 1) if kind == "pause" else None, cwd=out)
    if kind == "pause":
        job.wait_paused()
    else:
        job.wait_output(what, kind)
    code = job.signal(sig)
    assert job.passes_after_pause() == [], "went on past its next chunk or tensor"   # (pause jobs only)
    assert code == 128 + sig, job.err[-2000:]
    assert "Traceback" not in job.err
    name = "Ctrl-C" if sig == signal.SIGINT else "SIGTERM"
    assert job.err.strip().splitlines()[-1] == f"interrupted ({name})", job.err[-500:]
    assert not [n for n in listing(out) if n.endswith(".partial")]


# A command whose work calls Python back from C (as LLVM calls llvmlite's object-cache hooks while
# numba compiles) and takes the signal there: "known" is named as those hooks, "other" is not.
_CALLBACK_COMMAND = """
import ctypes, os, signal, sys, time
import click
from quantkit.cli import entry, main

def _raw_object_cache_notify():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(200000):     # bytecodes: the handler runs in here
        pass
    print("callback finished", flush=True)

def other():
    os.kill(os.getpid(), signal.SIGINT)
    for _ in range(200000):
        pass
    print("callback finished", flush=True)

@main.command("fault")
@click.argument("which")
def fault(which):
    ctypes.CFUNCTYPE(None)({"known": _raw_object_cache_notify, "other": other}[which])()
    time.sleep(60)
    print("not stopped", flush=True)

entry()
"""


@pytest.mark.parametrize("which", ["known", "other"])
def test_signal_taken_inside_a_callback_from_c_still_stops(which, tmp_path):
    """ctypes drops an exception raised in a callback ("Exception ignored") and goes on, so a Ctrl-C
    handled there was lost and the job ran to its end with exit code 0. A known callback (llvmlite's
    object-cache hooks) finishes its work and the signal is raised after it; any other drop is sent
    again. Either way: 130, one 'interrupted' line, no traceback, long before the work's end."""
    script = tmp_path / "fault.py"
    script.write_text(_CALLBACK_COMMAND, encoding="utf-8")
    res = subprocess.run([sys.executable, str(script), "fault", which], capture_output=True, text=True,
                         timeout=120, preexec_fn=default_sigint)
    assert res.returncode == 130, (res.returncode, res.stdout, res.stderr)
    assert "not stopped" not in res.stdout
    assert ("callback finished" in res.stdout) == (which == "known"), res.stdout
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr, res.stderr
    assert res.stderr.strip().splitlines()[-1] == "interrupted (Ctrl-C)", res.stderr


# -- long jobs resumable -----------------------------------------------------------------------

IM_SAMPLE = Path(__file__).parent / "data" / "imatrix" / "calibration-sample.txt"


def test_imatrix_resumed_after_kill_is_the_uninterrupted_file(smollm2_f16, dirs):
    """Killed (SIGKILL) after chunk 5 of 7 with a save every 2 chunks: the output holds the save of
    chunk 4; the same command with --resume continues from chunk 5 and writes the uninterrupted run's
    bytes (identical sums, counts, chunk count and datasets)."""
    out, ctl = dirs
    args = ["imatrix", "-m", smollm2_f16, "-f", IM_SAMPLE, "-c", 64, "--chunks", 7, "-ofreq", 2, "--no-ppl", "-t", 1]
    whole = Job(args + ["-o", out / "whole.gguf"], ctl)
    assert whole.finish() == 0, whole.err
    killed = Job(args + ["-o", out / "r.gguf"], ctl, pause=("imatrix.chunk", 5))
    killed.wait_paused()
    killed.signal(signal.SIGKILL)
    from quantkit.formats.imatrix import load_imatrix

    assert load_imatrix(out / "r.gguf").chunk_count == 4
    again = Job(args + ["-o", out / "r.gguf", "--resume"], ctl)
    assert again.finish() == 0, again.err
    assert "continuing from chunk 5" in again.err
    assert (out / "r.gguf").read_bytes() == (out / "whole.gguf").read_bytes()
    assert listing(out) == ["r.gguf", "whole.gguf"]


def test_imatrix_resume_refuses_another_run(smollm2_f16, dirs):
    """--resume on a file saved with another chunk size: one line, before any work."""
    out, ctl = dirs
    from quantkit.formats.imatrix import Entry, Imatrix, save_imatrix_gguf
    import numpy as np

    save_imatrix_gguf(Imatrix({"blk.0.ffn_up.weight": Entry(np.ones((1, 576), np.float32), np.full(1, 128, np.float32))},
                              [str(IM_SAMPLE)], 1, 128), out / "r.gguf")
    job = Job(["imatrix", "-m", smollm2_f16, "-f", IM_SAMPLE, "-c", 64, "-o", out / "r.gguf", "--resume"], ctl)
    job.finish()
    one_line_error(job, "r.gguf: saved with chunks of 128 tokens, but -c is 64")


@pytest.mark.parametrize("mode", ["perplexity", "kl-divergence"])
def test_perplexity_resumed_after_kill_prints_the_uninterrupted_numbers(smollm2_f16, dirs, mode):
    """Killed after chunk 4 of 6 with --state: the same command continues from chunk 5 and prints
    exactly the uninterrupted run's results (every running PPL, the final estimate, or every KLD
    line and statistic); the state file is removed at the end."""
    out, ctl = dirs
    args = ["perplexity", "-m", smollm2_f16, "-c", 64, "--chunks", 6, "-t", 1]
    if mode == "perplexity":
        args += ["-f", SAMPLE]
    else:
        base = ctl / "base.kld"
        made = Job(args + ["-f", SAMPLE, "--kl-divergence-base", base], ctl)
        assert made.finish() == 0, made.err
        args += ["--kl-divergence-base", base, "--kl-divergence"]
    whole = Job(args, ctl)
    assert whole.finish() == 0, whole.err
    state = out / "ppl.state"
    killed = Job(args + ["--state", state], ctl, pause=("perplexity.chunk", 4))
    killed.wait_paused()
    killed.signal(signal.SIGKILL)
    assert len(json.loads(state.read_text())["records"]) == 4
    again = Job(args + ["--state", state], ctl)
    assert again.finish() == 0, again.err
    assert "continuing from chunk 5" in again.err
    assert again.out == whole.out
    assert ("[6]" in whole.out and "Final estimate" in whole.out) if mode == "perplexity" else "Mean    KLD" in whole.out
    assert listing(out) == []


def test_state_of_another_run_refused(smollm2_f16, dirs):
    out, ctl = dirs
    args = ["perplexity", "-m", smollm2_f16, "-f", SAMPLE, "-c", 64, "--chunks", 3, "-t", 1, "--state", out / "s"]
    killed = Job(args, ctl, pause=("perplexity.chunk", 1))
    killed.wait_paused()
    killed.signal(signal.SIGKILL)
    other = Job(args[:7] + ["--chunks", 2] + args[9:], ctl)
    other.finish()
    one_line_error(other, "s: saved by another run (its n_chunk differ); remove it to start over")


# -- the other writers: imatrix saves, the base logits file -------------------------------------

@pytest.mark.parametrize("command", ["imatrix", "perplexity"])
def test_other_writers_refuse_before_the_first_chunk(smollm2_f16, dirs, command):
    """imatrix's periodic saves and perplexity's base logits file check the planned size against the
    file-size limit before the first chunk: one line, nothing written."""
    out, ctl = dirs
    if command == "imatrix":
        args, limit, what = ["imatrix", "-f", IM_SAMPLE, "-c", 64, "-ofreq", 1, "-o", out / "i.gguf"], 100 << 10, \
            "the imatrix needs"
    else:
        args, limit, what = ["perplexity", "-f", SAMPLE, "-c", 64, "--kl-divergence-base", out / "b.kld"], 1 << 20, \
            "the base logits file needs"
    job = Job(args + ["-m", smollm2_f16], ctl, rlimit_fsize=limit)
    job.finish()
    one_line_error(job, what, "file size limit")
    assert "[1]" not in job.out
    assert listing(out) == []


@pytest.mark.parametrize("command", ["imatrix", "perplexity"])
def test_model_changed_under_a_chunk_loop(smollm2_f16, dirs, tmp_path, command):
    """The model file truncated while imatrix or perplexity runs: one line at the next chunk, nothing
    saved from it."""
    out, ctl = dirs
    src = tmp_path / "m.gguf"
    shutil.copy(smollm2_f16, src)
    if command == "imatrix":
        args = ["imatrix", "-f", IM_SAMPLE, "-c", 64, "-ofreq", 1, "--no-ppl", "-o", out / "i.gguf"]
    else:
        args = ["perplexity", "-f", SAMPLE, "-c", 64, "--kl-divergence-base", out / "b.kld"]
    job = Job(args + ["-m", src], ctl, pause=(f"{command}.chunk", 1))
    job.wait_paused()
    saved = listing(out)
    os.truncate(src, 1 << 20)
    job.resume()
    job.finish()
    one_line_error(job, "m.gguf: the input changed while it was being read (its size went from")
    assert listing(out) == [n for n in saved if not n.endswith(".partial")]     # the saves before, if any
