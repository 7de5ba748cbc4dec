"""Bytes on disk: GGUF I/O over the gguf package, block layouts, imatrix and base-logits files, text
corpora, the one atomic writer every output goes through, and the guard for inputs truncated under a map."""
