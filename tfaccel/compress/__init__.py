"""Smaller models: pruning and its sparsity measurements, quantization-aware training, TFLite
conversion and evaluation, and the comparison report."""

from tfaccel import _aliases


def __getattr__(name):
    module = _aliases.submodule(__name__, name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return module
