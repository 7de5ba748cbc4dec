"""Independent jobs on a Dask distributed cluster: ``--cluster ADDRESS`` of ``sweep`` and ``imatrix``
(docs/sweep.md, docs/imatrix-perplexity.md). Needs the ``quantkit[cluster]`` extra (``distributed``).

What a job may assume, and what this module guarantees:

* Every worker runs the same quantkit and sees the same files at the same paths (the model, the text,
  the output directory: storage every worker sees). ``run_jobs`` asks each worker first and refuses
  in one line when one cannot see a path.
* A job is a module-level function of picklable arguments that returns a picklable result; files it
  writes go through ``formats.atomic`` (temporary name, rename), so a job killed mid-write leaves only
  a hidden ``.partial`` file, never a file under the real name.
* A worker that dies mid-job (killed, out of memory, machine lost) is noticed by the scheduler, which
  runs the job again on another worker -- up to its ``distributed.scheduler.allowed-failures`` (3 by
  default); past that the run stops with one line. An exception raised by the job itself (bad input)
  is not retried: it is the job's answer, reported as is.
* Results are handed to the caller as they finish (``as_completed``), with the job's key.
* Each job sets numba's thread count to its worker's thread count (``--nthreads`` of ``dask worker``).
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

from quantkit.errors import QuantkitError

EXTRA_NOTE = "--cluster needs the quantkit[cluster] extra: pip install 'quantkit[cluster]'"


class ClusterError(QuantkitError):
    """The cluster cannot be used as asked (extra missing, scheduler unreachable, a job lost)."""


def available() -> bool:
    """Whether ``distributed`` can be imported (the ``quantkit[cluster]`` extra)."""
    try:
        import distributed  # noqa: F401
    except ImportError:
        return False
    return True


#: seconds to reach the scheduler, and then to wait for its first worker, before giving up in one line
CONNECT_TIMEOUT = 10.0


def connect(address: str, timeout: float | None = None):
    """A ``distributed.Client`` for the scheduler at ``address`` (``tcp://host:8786``), or one line."""
    timeout = CONNECT_TIMEOUT if timeout is None else timeout
    if not available():
        raise ClusterError(EXTRA_NOTE)
    from distributed import Client

    try:
        client = Client(address, timeout=timeout)
    except (OSError, TimeoutError) as e:
        raise ClusterError(f"cannot reach the Dask scheduler at {address}: {e}") from None
    if not client.scheduler_info().get("workers"):
        try:
            client.wait_for_workers(1, timeout=timeout)
        except (OSError, TimeoutError):
            client.close()
            raise ClusterError(f"the Dask scheduler at {address} has no workers (start some with "
                               f"`dask worker {address}`)") from None
    return client


def _sees(paths: list[str]) -> list[str]:
    """On a worker: the given paths it cannot see."""
    return [p for p in paths if not os.path.exists(p)]


def check_storage(client, paths: Iterable[str | os.PathLike]) -> None:
    """Refuse when a worker cannot see one of ``paths`` (they must be on storage every worker sees)."""
    paths = [os.path.abspath(p) for p in paths]
    for worker, missing in client.run(_sees, paths).items():
        if missing:
            raise ClusterError(f"worker {worker} cannot see {missing[0]}: the model, the text and the output "
                               f"directory must be on storage every worker sees, at the same path")


def worker_threads() -> int:
    """Inside a job: set numba's threads to this worker's thread count; returns it."""
    from distributed import get_worker

    from quantkit.jit import set_threads

    return set_threads(get_worker().state.nthreads)


def run_jobs(client, fn: Callable[..., Any], jobs: dict[str, tuple], *, prefix: str,
             on_result: Callable[[str, Any], None]) -> None:
    """Run ``fn(*args)`` for every ``key: args`` of ``jobs`` on the cluster; ``on_result(key, result)``
    in the caller's process as each finishes. A job's own exception is raised here as it is; a job that
    lost its workers too often becomes a ClusterError."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    if not jobs:
        return
    futures = {}
    for key, args in jobs.items():
        fut = client.submit(fn, *args, key=f"{prefix}-{key}-{os.urandom(4).hex()}", pure=False)
        futures[fut.key] = (key, fut)
    try:
        for fut in as_completed([f for _, f in futures.values()]):
            key = futures[fut.key][0]
            try:
                result = fut.result()
            except KilledWorker as e:
                raise ClusterError(f"job {key}: its worker died every time it ran ({e}); see the workers' "
                                   f"logs (out of memory?)") from None
            on_result(key, result)
    finally:
        for _, f in futures.values():
            f.cancel()
