"""``--cluster``: sweep points and imatrix chunk ranges as jobs on a Dask ``LocalCluster`` of two worker
processes (one thread each) on this machine, on a tiny qwen3 the tests write with gguf.GGUFWriter.

The references are the same commands run in one process: the cluster's files and measurements must
equal them (the quantized files and the imatrix byte for byte). A worker killed mid-job is made
deterministic with the project's pause points: the workers are told (through ``client.run``) to stop
at a named point, the test kills the one that stopped, and the job must come back whole from another
worker with no half-written file left anywhere.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("distributed", reason="needs the quantkit[cluster] extra (dask distributed)")

from archmodels import write_model  # noqa: E402
from conftest import run_cli  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

from quantkit.pipelines import sweep as sp  # noqa: E402

MEASURED = ("label", "kind", "ftype", "file", "size", "file_size", "size_mib", "bpw", "ppl", "ppl_unc", "kld",
            "kld_unc", "same_top", "same_top_unc", "n_tokens", "key")
IMATRIX_ARGS = ["-c", "64", "--chunks", "6", "-ofreq", "4", "-q"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return write_model(tmp_path_factory.mktemp("tiny") / "tiny-qwen3-f16.gguf", "qwen3", "F16")


def new_cluster() -> LocalCluster:
    return LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0")


@pytest.fixture(scope="module")
def cluster():
    with new_cluster() as c:
        yield c


def _sweep(model: Path, out: Path, cluster: str | None = None) -> list[dict]:
    sw = sp.Sweep(model, None, sp.parse_points("Q8_0,Q4_0", ""), out, None, n_chunks=2, n_ctx=64)
    return sp.run_sweep(sw, cluster=cluster)


@pytest.fixture(scope="module")
def local_sweep(tiny, tmp_path_factory) -> tuple[Path, list[dict]]:
    out = tmp_path_factory.mktemp("local") / "sweep"
    return out, _sweep(tiny, out)


def _same_as_local(local: tuple[Path, list[dict]], out: Path, rows: list[dict]) -> None:
    ldir, lrows = local
    assert [{k: r[k] for k in MEASURED} for r in rows] == [{k: r[k] for k in MEASURED} for r in lrows]
    for r in rows:
        assert (out / r["file"]).read_bytes() == (ldir / r["file"]).read_bytes(), r["file"]
    assert (out / "base.kld").read_bytes() == (ldir / "base.kld").read_bytes()


def _hidden(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


def test_sweep_on_cluster_equals_local(tiny, local_sweep, cluster, tmp_path):
    out = tmp_path / "sweep"
    rows = _sweep(tiny, out, cluster.scheduler_address)
    _same_as_local(local_sweep, out, rows)
    assert _hidden(out) == []
    # resumable as the local sweep: a rerun sends nothing to the cluster
    log: list[str] = []
    again = sp.run_sweep(sp.Sweep(tiny, None, sp.parse_points("Q8_0,Q4_0", ""), out, None, n_chunks=2, n_ctx=64),
                         log=log.append, cluster=cluster.scheduler_address)
    assert again == rows and sum("already measured" in s for s in log) == 2


# -- a worker killed mid-job ------------------------------------------------------------------------

def _arm(point: str, ctl: str) -> int:
    """On a worker: stop the n-th time this process passes ``point`` (quantkit.pause), marking
    ``<ctl>/paused-<pid>``. Its replacement after a kill starts without this."""
    os.environ["QUANTKIT_PAUSE_AT"] = point
    os.environ["QUANTKIT_PAUSE_FILE"] = os.path.join(ctl, f"paused-{os.getpid()}")
    if "quantkit.pause" in sys.modules:
        importlib.reload(sys.modules["quantkit.pause"])   # pause_point reads the module's globals
    return os.getpid()


def _kill_one_paused(client: Client, ctl: Path, job: threading.Thread, out: Path | None) -> tuple[int, list[str]]:
    """Wait for a worker to stop at its pause point, SIGKILL it, then release any other paused worker
    until ``job`` ends. Returns the killed pid and the hidden files of ``out`` seen while it was stopped."""
    end = time.monotonic() + 600
    while not list(ctl.glob("paused-*")):
        assert job.is_alive(), "the run ended before any worker reached its pause point"
        assert time.monotonic() < end, "no worker reached its pause point"
        time.sleep(0.01)
    marker = sorted(ctl.glob("paused-*"))[0]
    pid = int(marker.name.split("-")[1])
    seen = _hidden(out) if out is not None else []
    os.kill(pid, signal.SIGKILL)
    while True:                      # gone (the nanny reaps it and starts a fresh worker)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.01)
    marker.unlink()
    while job.is_alive():            # the other worker may have stopped at the point too: let it go on
        for m in ctl.glob("paused-*"):
            m.unlink(missing_ok=True)
        job.join(0.05)
    return pid, seen


def _in_thread(fn, *args, **kw):
    box: dict = {}

    def run():
        try:
            box["result"] = fn(*args, **kw)
        except BaseException as e:  # handed to the test
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def test_sweep_worker_killed_mid_write(tiny, local_sweep, tmp_path):
    out, ctl = tmp_path / "sweep", tmp_path / "ctl"
    ctl.mkdir()
    with new_cluster() as c, Client(c.scheduler_address) as client:
        # the base logits first (no quantize.tensor point in it), then arm: 3rd tensor of a point's file
        base = sp.Sweep(tiny, None, sp.parse_points("Q8_0", ""), out, None, n_chunks=2, n_ctx=64)
        out.mkdir()
        client.submit(sp._base_job, base, pure=False).result()
        pids = client.run(_arm, "quantize.tensor:3", str(ctl))
        t, box = _in_thread(_sweep, tiny, out, c.scheduler_address)
        killed, seen = _kill_one_paused(client, ctl, t, out)
        assert killed in pids.values()
        assert any(n.endswith(".partial") and ".gguf." in n for n in seen), seen   # provably mid-write
        assert "error" not in box, box.get("error")
        _same_as_local(local_sweep, out, box["result"])
        assert _hidden(out) == []                         # no temporary file left, under any name
        assert killed not in client.run(os.getpid).values()


# -- imatrix -----------------------------------------------------------------------------------------

def _quantkit(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "quantkit", *map(str, args)], capture_output=True, text=True,
                          timeout=900)


@pytest.fixture(scope="module")
def one_process_imatrix(tiny, tmp_path_factory) -> tuple[Path, str]:
    """The reference: the same command in one process, run with kernels loaded from numba's cache, as
    the workers' are. (Found here: on a cold cache, a run whose kernels were just compiled wrote other
    last bits than a run that loaded them, at byte 4405 of this model's file: numba caches object code,
    so a caller compiled beside a freshly compiled fastmath callee inlined and vectorized its float sum
    while one compiled against the cached callee called it. The softmax helpers are now inlined at
    numba-IR level (model/decode.py); the first run below still only fills the cache.)"""
    d = tmp_path_factory.mktemp("im")
    for name in ("warm.gguf", "one.gguf"):
        res = _quantkit("imatrix", "-m", tiny, *IMATRIX_ARGS, "-o", d / name)
        assert res.returncode == 0, res.stderr
    return d / "one.gguf", res.stdout


@pytest.mark.parametrize("per_job", [1, 2, 4])
def test_imatrix_on_cluster_is_the_one_process_file(tiny, one_process_imatrix, cluster, tmp_path, per_job):
    out = tmp_path / "cl.gguf"
    res = run_cli(["imatrix", "-m", tiny, *IMATRIX_ARGS, "-o", out, "--cluster", cluster.scheduler_address,
                   "--chunks-per-job", str(per_job)])
    assert res.exit_code == 0, res.output
    ref, ref_stdout = one_process_imatrix
    assert out.read_bytes() == ref.read_bytes()
    assert res.stdout == ref_stdout                  # the running and final PPL too


def _one_process_sums(tiny: Path, opts, save):
    """On a worker (kernels from the cache, as every job's): the plain collection's float64 sums, and
    the same chunks collected apart."""
    from quantkit.pipelines import chunks as ch
    from quantkit.pipelines import imatrix as im
    from quantkit.pipelines.cluster import worker_threads
    worker_threads()
    model, tok, runner = ch.open_for_chunks(tiny, 64, 64)
    with model:
        tokens = ch.tokenize(tok, ch.read_text(None, "calibration")[0], 64, "the built-in text")
        one = im.Accumulator(64)
        im.collect(runner, tokens, ch.add_bos_id(tok), one, [], opts, save)
        parts = im.collect_part(runner, tokens, ch.add_bos_id(tok), opts, 0, 6)
    return tokens, one, parts


def test_imatrix_merge_is_exact_in_float64(tiny, one_process_imatrix, cluster):
    """The merged float64 sums before any rounding to float32 equal the one-process run's; adding
    per-range totals instead (what a plain reduce would do) does not, on this very data."""
    from quantkit.pipelines import imatrix as im
    from quantkit.pipelines.imatrix_cluster import collect_on_cluster

    opts = im.CollectOptions(n_ctx=64, n_chunks=6, out_freq=1000)
    save = im.SaveOptions(out="/nonexistent/never-saved.gguf")
    with Client(cluster.scheduler_address) as client:
        tokens, one, parts = client.submit(_one_process_sums, tiny, opts, save, pure=False).result()
    merged = im.Accumulator(64)
    collect_on_cluster(cluster.scheduler_address, tiny, None, tokens, merged, [], opts, save, chunks_per_job=2)
    assert sorted(merged.sums) == sorted(one.sums)
    for name in one.sums:
        assert merged.sums[name].tobytes() == one.sums[name].tobytes(), name
        assert merged.counts[name].tobytes() == one.counts[name].tobytes(), name
    # the same parts summed per range of two chunks, then the ranges added: other float64 bits
    naive_differs = False
    for name in one.sums:
        ranges = [sum((s for p in parts[a:a + 2] for n, _, s in p.calls if n == name), np.zeros_like(one.sums[name][0]))
                  for a in (0, 2, 4)]
        naive_differs |= (ranges[0] + ranges[1] + ranges[2]).tobytes() != one.sums[name][0].tobytes()
    assert naive_differs


def test_imatrix_worker_killed_mid_job(tiny, one_process_imatrix, tmp_path):
    out, ctl = tmp_path / "cl.gguf", tmp_path / "ctl"
    ctl.mkdir()
    with new_cluster() as c, Client(c.scheduler_address) as client:
        pids = client.run(_arm, "imatrix.chunk:1", str(ctl))
        t, box = _in_thread(run_cli, ["imatrix", "-m", tiny, *IMATRIX_ARGS, "-o", out, "--cluster",
                                      c.scheduler_address, "--chunks-per-job", "2"])
        killed, _ = _kill_one_paused(client, ctl, t, None)
        assert killed in pids.values()
        res = box["result"]
        assert res.exit_code == 0, res.output
        assert out.read_bytes() == one_process_imatrix[0].read_bytes()
        assert _hidden(tmp_path) == []


def test_cluster_without_the_extra_is_one_line(tiny, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "distributed", None)        # `import distributed` fails
    for args in (["sweep", "-m", tiny, "--types", "Q8_0", "-o", tmp_path / "s", "--cluster", "tcp://127.0.0.1:1"],
                 ["imatrix", "-m", tiny, "-o", tmp_path / "i.gguf", "--cluster", "tcp://127.0.0.1:1"]):
        res = run_cli(args)
        assert res.exit_code == 1, res.output
        assert res.output.strip().splitlines() == ["Error: --cluster needs the quantkit[cluster] extra: "
                                                   "pip install 'quantkit[cluster]'"]
    assert not (tmp_path / "s").exists() and not (tmp_path / "i.gguf").exists()


def test_unreachable_scheduler_is_one_line(tiny, tmp_path, monkeypatch):
    import quantkit.pipelines.cluster as cl

    monkeypatch.setattr(cl, "CONNECT_TIMEOUT", 1.0)  # the port refuses at once; dask retries until then
    res = run_cli(["sweep", "-m", tiny, "--types", "Q8_0", "-o", tmp_path / "s", "--cluster", "tcp://127.0.0.1:1"])
    assert res.exit_code == 1, res.output
    last = res.output.strip().splitlines()[-1]
    assert last.startswith("Error: cannot reach the Dask scheduler at tcp://127.0.0.1:1"), res.output


def test_a_path_a_worker_cannot_see_is_refused(cluster, tmp_path):
    from quantkit.pipelines.cluster import ClusterError, check_storage, connect

    client = connect(cluster.scheduler_address)
    try:
        check_storage(client, [tmp_path])
        with pytest.raises(ClusterError, match=r"cannot see .*nope: .* storage every worker sees"):
            check_storage(client, [tmp_path, tmp_path / "nope"])
    finally:
        client.close()


def test_imatrix_cluster_without_a_collection_is_misuse(tmp_path):
    res = run_cli(["imatrix", "--in-file", tmp_path / "a.gguf", "-o", tmp_path / "b.gguf", "--cluster", "tcp://x:1"])
    assert res.exit_code == 2 and "--cluster splits a collection" in res.output
