"""Exceptions. Every error a user can cause is a QuantkitError with a one-line message."""


class QuantkitError(Exception):
    """Base class: the CLI turns these into one line on stderr and exit code 1."""


class FormatError(QuantkitError):
    """A file is not what it claims to be (not a GGUF, truncated, inconsistent)."""


class QuantError(QuantkitError, ValueError):
    """Data cannot be quantized as asked (bad shape, dtype, non-finite values, unknown type)."""


class PolicyError(QuantkitError, ValueError):
    """A type-selection request cannot be honoured (unknown ftype or type, bad pattern, bad model)."""


class ModelError(QuantkitError):
    """A model lacks what the forward pass needs, or a request does not fit it."""


class BenchError(QuantkitError):
    """A bench request cannot be run (bad list, unreadable model, affinity refused)."""
