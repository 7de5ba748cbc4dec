"""Where the reference llama.cpp is: three environment variables, read here for tools/ and benchmarks/.

* ``QUANTKIT_LLAMA_CPP`` -- the llama.cpp source directory (``vendor/llama.cpp`` of the llama-cpp-python
  0.3.36 sdist). Its builds: ``build/bin`` (native) and ``build-avx2/bin`` (the AVX2-only copy).
* ``QUANTKIT_LLAMA_PY`` -- the python of a venv with llama-cpp-python, for the scripts that start it.
* ``QUANTKIT_CONVERT_PY`` -- the python of a venv with torch (CPU) and transformers, for the scripts that
  run llama.cpp's ``convert_hf_to_gguf.py`` (tools/make_convert_golden.py says how to make it).

How to build it: docs/DEVELOPING.md, "Environment". The package and the test suite never read either.
A program or library is looked up as: the path given on the command line, then the build under
``$QUANTKIT_LLAMA_CPP``, then (programs only) ``PATH``. The scripts of tools/ run from anywhere
(``python tools/X.py`` puts tools/ on sys.path); benchmarks/ put tools/ on it before importing this.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

LLAMA_CPP = "QUANTKIT_LLAMA_CPP"
LLAMA_PY = "QUANTKIT_LLAMA_PY"
CONVERT_PY = "QUANTKIT_CONVERT_PY"
BUILDS = {"native": "build", "avx2": "build-avx2"}


def bin_dir(build: str = "native") -> Path | None:
    """``$QUANTKIT_LLAMA_CPP/<build>/bin``, or None when the variable is unset."""
    root = os.environ.get(LLAMA_CPP)
    return Path(root) / BUILDS[build] / "bin" if root else None


def find(name: str, given: str | os.PathLike | None = None, build: str = "native") -> str | None:
    """The program or library ``name`` (``llama-bench``, ``libggml-base.so``): ``given``, else the build's
    bin directory, else (a program) PATH; None when none has it."""
    if given:
        return str(given) if Path(given).exists() else None
    d = bin_dir(build)
    if d is not None and (d / name).exists():
        return str(d / name)
    return None if name.endswith(".so") else shutil.which(name)


def missing(name: str, given: str | os.PathLike | None = None, build: str = "native") -> str:
    """The one line that says why ``find`` found nothing."""
    if given:
        return f"{name}: {given} does not exist"
    if bin_dir(build) is None:
        return (f"{name} not found: set {LLAMA_CPP} to the reference llama.cpp's source directory "
                f"(docs/DEVELOPING.md, \"Environment\")")
    return f"{name} not found in {bin_dir(build)} or on PATH (docs/DEVELOPING.md, \"Environment\": how to build it)"


def need(name: str, given: str | os.PathLike | None = None, build: str = "native") -> str:
    """``find``, or exit with ``missing``'s line."""
    found = find(name, given, build)
    if found is None:
        raise SystemExit(missing(name, given, build))
    return found


def need_bin_dir(given: str | os.PathLike | None = None, build: str = "native") -> Path:
    """A build's bin directory: ``given``, else ``$QUANTKIT_LLAMA_CPP/<build>/bin``; exits with one line
    when neither is there."""
    d = Path(given) if given else bin_dir(build)
    if d is None:
        raise SystemExit(f"no llama.cpp build: pass its bin directory or set {LLAMA_CPP} to the reference "
                         f"llama.cpp's source directory (docs/DEVELOPING.md, \"Environment\")")
    if not d.is_dir():
        raise SystemExit(f"{d}: no such directory (docs/DEVELOPING.md, \"Environment\": how to build llama.cpp)")
    return d


def python(given: str | None = None) -> str | None:
    """The llama-cpp-python venv's python: ``given``, else ``$QUANTKIT_LLAMA_PY``; None when neither."""
    return given or os.environ.get(LLAMA_PY) or None


def convert_python(given: str | None = None) -> str:
    """The converter venv's python: ``given``, else ``$QUANTKIT_CONVERT_PY``; exits with one line when
    neither is set."""
    found = given or os.environ.get(CONVERT_PY)
    if not found:
        raise SystemExit(f"no python for convert_hf_to_gguf.py: pass --convert-python or set {CONVERT_PY} "
                         f"(docs/DEVELOPING.md, \"Environment\")")
    return found


def run(cmd: list[str], cwd: str | os.PathLike) -> None:
    """Run a reference tool in ``cwd``; its failure ends the script with the command and its stderr's tail."""
    import subprocess

    r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")


def sha256(path: str | os.PathLike) -> str:
    """A file's sha256, as golden files record their sources and outputs."""
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def portable(text: str) -> str:
    """``text`` (a command line, a library path) as a golden file's provenance records it: the values of
    the three variables, this interpreter and its prefix written as names, so no machine's paths are stored."""
    subs = [(os.environ.get(LLAMA_CPP), f"${LLAMA_CPP}"), (os.environ.get(LLAMA_PY), f"${LLAMA_PY}"),
            (os.environ.get(CONVERT_PY), f"${CONVERT_PY}"),
            (sys.executable, "python"), (sys.prefix, "<python prefix>")]
    for value, name in sorted((s for s in subs if s[0]), key=lambda s: -len(s[0])):
        text = text.replace(value, name)
    return text
