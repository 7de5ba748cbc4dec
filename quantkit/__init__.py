"""quantkit: llama.cpp's quantize / imatrix / bench / perplexity / run tools in readable Python.

Layers, each importing only those before it:
errors <- formats <- quants <- kernels <- model <- pipelines <- cli
"""

__version__ = "0.1.0"
