"""Bytes on disk: GGUF I/O over the gguf package, block layouts, imatrix files, text corpora."""
