"""quantkit: llama.cpp's quantize / imatrix / bench / perplexity / run tools in readable Python.

Layers, each importing only those before it:
errors <- formats <- quants <- kernels <- model <- pipelines <- cli
"""

import os

# OpenBLAS's worker threads spin for 2^28 cycles (~0.1 s) after every product before they sleep.
# The batch path alternates BLAS products with numba parallel regions, and on a 2-core machine a
# spinning BLAS thread takes the core numba's second worker needs: SmolLM2 Q4_K_M pp512 at 2 threads
# ~570 -> ~740 t/s with the spin at its minimum (2^4 cycles; measured 4/12/16/20, docs/performance.md).
# OpenBLAS reads this once, when numpy first loads it, so it is set here, before anything imports
# numpy; a user's own setting wins.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

__version__ = "0.1.0"
