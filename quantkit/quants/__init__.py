"""Block codecs for ggml's types: ``quantize`` / ``dequantize``, a drop-in superset of gguf-py's.

``TRAITS`` (quants/codecs.py) is the codec column of the type table: one line per type. Importing this
package compiles nothing until a kernel is first called (numba compiles lazily and caches to
NUMBA_CACHE_DIR).
"""

from quantkit.quants.base import QuantType
from quantkit.quants.codecs import TRAITS, dequantize, quantize, resolve_type, traits
from quantkit.quants.validate import count_invalid

__all__ = ["TRAITS", "QuantType", "count_invalid", "dequantize", "quantize", "resolve_type", "traits"]
