"""Block codecs for ggml's types: ``quantize`` / ``dequantize``, a drop-in superset of gguf-py's.

Importing this package compiles nothing until a kernel is first called (numba compiles lazily and
caches to NUMBA_CACHE_DIR).
"""

from quantkit.quants.base import TRAITS, QuantType, dequantize, quantize, resolve_type, traits

# Each module registers its types in TRAITS on import.
from quantkit.quants import floats  # noqa: F401,E402

for _mod in ("symmetric", "affine", "iq4"):
    try:
        __import__(f"quantkit.quants.{_mod}")
    except ModuleNotFoundError as _e:  # a family still being written; see TRAITS for what is there
        if _e.name != f"quantkit.quants.{_mod}":
            raise

__all__ = ["TRAITS", "QuantType", "dequantize", "quantize", "resolve_type", "traits"]
