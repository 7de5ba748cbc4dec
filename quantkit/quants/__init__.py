"""Block codecs for ggml's types: ``quantize`` / ``dequantize``, a drop-in superset of gguf-py's.

Importing this package compiles nothing until a kernel is first called (numba compiles lazily and
caches to NUMBA_CACHE_DIR).
"""

from quantkit.quants.base import TRAITS, QuantType, dequantize, quantize, resolve_type, traits

# Each module registers its types in TRAITS on import.
from quantkit.quants import floats, iq1, iq2, iq3, iq4, kquants, legacy, mxfp4, q1, ternary  # noqa: F401,E402

from quantkit.quants.validate import count_invalid  # noqa: E402

__all__ = ["TRAITS", "QuantType", "count_invalid", "dequantize", "quantize", "resolve_type", "traits"]
