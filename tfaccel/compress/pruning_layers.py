"""A model's layers as TF-MOT's pruning sees them: nested walk, wrappers, kernels, pruning step.

The primitives that planning (`pruning_plan`), pruning (`prune`) and measuring
(`sparsity`) share, so that none of them imports another's internals.

Example:

    from tfaccel.compress import pruning_layers

    [layer.name for layer in pruning_layers.pruning_wrappers(pruned)]
    pruning_layers.pruning_step(pruned)        # -1 before training starts
"""

from tfaccel import _compat
from tfaccel.errors import ModelError
from tfaccel.keras import (
    keras,
    tfmot as tfmot,  # TF-MOT, its TF_USE_LEGACY_KERAS side effect undone
)


def walk_layers(model):
    """Yields the layers of `model`, descending into nested models (which are not yielded)."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from walk_layers(layer)
        else:
            yield layer


def is_pruning_wrapper(layer):
    """True for a layer wrapped by TF-MOT's `prune_low_magnitude`."""
    return isinstance(layer, _compat.pruning_wrapper_class())


def pruning_wrappers(model):
    """The pruning wrappers of `model`, nested models included, in layer order."""
    return [layer for layer in walk_layers(model) if is_pruning_wrapper(layer)]


def registry_supports(layer):
    """True when TF-MOT knows the layer type (it may prune nothing in it, e.g. BatchNorm)."""
    return _compat.prune_registry_supports(layer)


def prunable_weights(layer):
    """The weights TF-MOT would prune in `layer` (kernels), or [] if it cannot prune it."""
    if hasattr(layer, "get_prunable_weights"):
        return list(layer.get_prunable_weights())
    if not registry_supports(layer):
        return []
    names = _compat.prune_registry_weight_names(layer)
    return [getattr(layer, n) for n in names if getattr(layer, n, None) is not None]


def pruning_step(model):
    """The pruning step the wrappers of `model` are at (-1 before training starts)."""
    steps = [int(layer.pruning_step.numpy()) for layer in pruning_wrappers(model)]
    if not steps:
        raise ModelError(f"model {model.name!r} has no pruning wrappers")
    return max(steps)
