"""Whole jobs built from the layers below: quantize, imatrix, run, bench, perplexity, round-trip."""
