"""The one way quantkit writes a file: a temporary name beside it, fsync, rename, cleanup on any exit.

``AtomicWriter(path, size)`` is used by every writer (GGUF models and imatrix files, legacy ``.dat``
imatrices, perplexity's base-logits file and resume state, ``--plan-out`` JSON, the Gemma 3 test model
joined from its packages). What it promises:

* Nothing appears at ``path`` until ``commit()``; an exception, Ctrl-C or SIGTERM removes the
  temporary file (``.<name>.<key>.partial``, created with O_EXCL so no two writers ever share one).
  After SIGKILL the hidden temporary file is all that remains, and the next writer of the same
  ``path`` removes it.
* Before the first byte (``preflight``, also run by pipelines before their long work starts): the
  folder exists, the planned ``size`` fits the free space of its filesystem (``os.statvfs``) and the
  process's file-size limit (``ulimit -f``). A disk that fills up anyway mid-write is reported as
  such, with the folder, the planned size and what was written, never as a bare ``write`` failure.
* Two runs on one output: each writer holds an exclusive ``flock`` on its temporary file while it
  writes. A writer that finds an older live one for the same ``path`` refuses with one line; writers
  that do not overlap each rename a complete file, and the later rename wins.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import os
import resource
import time
from pathlib import Path

from quantkit.errors import FormatError

#: a temporary file no writer has locked for this long is left over from a killed run
STALE_AFTER_S = 2.0
_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def human(n: int | float) -> str:
    """Bytes as ``12.3 MiB``."""
    n = float(n)
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} bytes" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _parent(path: Path) -> Path:
    return path.parent if str(path.parent) else Path(".")


def free_bytes(folder: Path) -> int:
    """Bytes this process may still write on ``folder``'s filesystem (root may use the reserve)."""
    st = os.statvfs(folder)
    blocks = st.f_bfree if os.geteuid() == 0 else st.f_bavail
    return blocks * st.f_frsize


def _temp_pattern(path: Path) -> str:
    return f".{glob.escape(path.name)}.*.partial"


def _writers(path: Path, mine: Path | None = None, stale_after: float = STALE_AFTER_S) -> list[tuple[str, Path]]:
    """Other temporary files of ``path``: live ones (locked) returned with their key; stale ones
    (unlocked, older than ``stale_after`` seconds) removed on the way."""
    live = []
    for tmp in _parent(path).glob(_temp_pattern(path)):
        if mine is not None and tmp.name == mine.name:
            continue
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                live.append((tmp.name.split(".")[-2], tmp))
                continue
            except OSError:      # a filesystem without locks: nobody can tell live from stale
                continue
            if time.time() - os.fstat(fd).st_mtime > stale_after:
                tmp.unlink(missing_ok=True)
        finally:
            os.close(fd)
    return live


def remove_leftovers(path: str | os.PathLike) -> int:
    """Remove the temporary files of ``path`` that no writer holds, whatever their age; returns how many
    live writers remain. For a caller that knows no writer of ``path`` can be starting now (a
    distributed sweep once its jobs are done: a killed worker's file is otherwise removed only by the
    next writer of the same path, once STALE_AFTER_S old)."""
    return len(_writers(Path(path), stale_after=-1.0))


def preflight(path: str | os.PathLike, size: int | None, what: str = "the output") -> Path:
    """Every reason to refuse writing ``size`` bytes to ``path``, checked before any work is done."""
    path = Path(path)
    parent = _parent(path)
    if not parent.is_dir():
        raise FormatError(f"{path}: output directory {parent} does not exist")
    if path.is_dir():
        raise FormatError(f"{path}: is a directory")
    if not os.access(parent, os.W_OK):
        raise FormatError(f"{path}: cannot write into {parent} (permission denied)")
    live = _writers(path)
    if live:
        raise FormatError(f"{path}: another process is writing this file now (its temporary file is "
                          f"{live[0][1].name}); wait for it to finish or choose another output")
    if size:
        free = free_bytes(parent)
        if size > free:
            raise FormatError(f"{path}: not enough free space: {what} needs {human(size)}, but {parent} has "
                              f"only {human(free)} free")
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and size > limit:
            raise FormatError(f"{path}: {what} needs {human(size)}, over this process's file size limit of "
                              f"{human(limit)} (ulimit -f)")
    return path


class AtomicWriter:
    """Write ``path`` through a locked temporary file; ``commit()`` makes it appear, complete.

    ``size`` is the planned size in bytes (checked against free space before the first byte and
    against what was written at commit); None when not known in advance.
    """

    def __init__(self, path: str | os.PathLike, size: int | None = None, what: str = "the output"):
        self.path = Path(path)
        self.size = size
        self.what = what
        self.written = 0
        self.tmp: Path | None = None
        self._f = None
        self.committed = False

    # -- life cycle --------------------------------------------------------------------------------
    def open(self) -> "AtomicWriter":
        preflight(self.path, self.size, self.what)
        parent = _parent(self.path)
        key = f"{time.time_ns():x}-{os.getpid()}"
        tmp = parent / f".{self.path.name}.{key}.partial"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as e:
            raise self._error(e, "cannot create a temporary file") from None
        self.tmp = tmp
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:          # a filesystem without locks: the unique name still keeps writers apart
            pass
        self._f = os.fdopen(fd, "wb", buffering=1 << 20)
        try:
            older = [t for k, t in _writers(self.path, tmp) if k < key]
            if older:
                raise FormatError(f"{self.path}: another process is writing this file now (its temporary file "
                                  f"is {older[0].name}); wait for it to finish or choose another output")
        except BaseException:
            self.abort()
            raise
        return self

    def write(self, data) -> None:
        """Append bytes (anything with the buffer protocol)."""
        mv = memoryview(data).cast("B")
        try:
            self._f.write(mv)
        except OSError as e:
            self.abort()
            raise self._error(e, "cannot write") from None
        self.written += mv.nbytes

    def tell(self) -> int:
        return self.written

    def commit(self) -> Path:
        if self.size is not None and self.written != self.size:
            self.abort()
            raise FormatError(f"{self.path}: {self.written} bytes were written, {self.size} were planned")
        try:
            self._f.flush()
            os.fsync(self._f.fileno())
            os.replace(self.tmp, self.path)       # the lock goes with the file descriptor, closed below
            self._f.close()
            try:  # make the rename itself durable
                dfd = os.open(_parent(self.path), os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
            except OSError:
                pass
        except OSError as e:
            self.abort()
            raise self._error(e, "cannot finish writing") from None
        self.committed = True
        return self.path

    def abort(self) -> None:
        """Close and remove the temporary file (safe to call more than once)."""
        f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except OSError:  # the buffered rest cannot be written (disk full): drop it
                pass
        if self.tmp is not None and not self.committed:
            try:
                self.tmp.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> "AtomicWriter":
        return self.open()

    def __exit__(self, exc_type, exc, tb) -> None:
        if not self.committed:
            self.abort()

    # -- errors --------------------------------------------------------------------------------
    def _error(self, e: OSError, doing: str) -> FormatError:
        """One line that says what happened, where, and how much was needed."""
        parent = _parent(self.path)
        need = f"{self.what} needs {human(self.size)}, " if self.size else ""
        if e.errno in _DISK_FULL:
            try:
                free = f", {human(free_bytes(parent))} free"
            except OSError:
                free = ""
            return FormatError(f"{self.path}: the disk is full ({parent}{free}): {need}{human(self.written)} "
                               f"were written; nothing was left at {self.path}")
        if e.errno == errno.EFBIG:
            limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
            lim = "" if limit == resource.RLIM_INFINITY else f" of {human(limit)}"
            return FormatError(f"{self.path}: the file size limit{lim} was reached (ulimit -f): {need}"
                               f"{human(self.written)} were written; nothing was left at {self.path}")
        return FormatError(f"{self.path}: {doing} ({e.strerror or e}); nothing was left at {self.path}")


def write_bytes(path: str | os.PathLike, blob: bytes, what: str = "the output") -> Path:
    """A small file in one piece, atomically."""
    with AtomicWriter(path, len(blob), what) as w:
        w.write(blob)
        return w.commit()
