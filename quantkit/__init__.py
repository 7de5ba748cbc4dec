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

# A forced CPU level (QUANTKIT_KERNELS, quantkit/isa.py) holds numba's LLVM to it; OpenBLAS, which the
# batch path calls, picks its kernels from the CPU when numpy loads it, so it is held too: its Haswell
# kernels are its AVX2 ones. Without this, QUANTKIT_KERNELS=avx2 on an AVX-512 machine ran the prefill's
# matrix products on OpenBLAS's AVX-512 kernels. A user's own OPENBLAS_CORETYPE wins.
from quantkit import config  # noqa: E402  (no numpy, no numba)

if config.kernels_level() in ("avx2", "avxvnni"):
    os.environ.setdefault("OPENBLAS_CORETYPE", "Haswell")

__version__ = "0.1.0"
