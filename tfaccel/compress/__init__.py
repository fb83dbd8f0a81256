"""Smaller models: pruning and its sparsity measurements, quantization-aware training, TFLite
conversion and evaluation, and the comparison report."""

from tfaccel import _aliases

__getattr__ = _aliases.submodule_getattr(__name__)
