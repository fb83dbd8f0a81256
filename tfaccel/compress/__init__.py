"""Smaller models: pruning and its sparsity measurements, quantization-aware training, TFLite
conversion and evaluation, and the comparison report."""
