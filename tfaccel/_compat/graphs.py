"""Private touchpoints: model graphs (shared by several areas), in both Kerases."""
from tfaccel._compat.keras3 import is_keras3_functional


def is_graph_network(model):
    """True for a Sequential or functional model (a graph of layers), False for a subclassed one.

    Relies on tf_keras's private `Functional._is_graph_network` (Sequential is a
    Functional once built) and, for a Keras 3 model, on Keras 3's private
    `keras.src.models.functional.Functional` (Keras 3 exports no such class).
    Checked: tf_keras 2.21, Keras 3.15.
    """
    # deferred: tf_keras (tfaccel.keras loads it)
    from tfaccel.keras import is_keras3_object, keras, keras3

    if is_keras3_object(model):
        return isinstance(model, keras3().Sequential) or is_keras3_functional(model)
    return isinstance(model, keras.Sequential) or bool(getattr(model, "_is_graph_network", False))


def sublayers(layer):
    """The layers `layer` holds directly (a custom layer's Dense, a wrapper's inner layer).

    Keras 3 exports no way to list a plain layer's sublayers (`Model.layers` exists only on
    models); both Kerases keep them behind the private
    `Layer._flatten_layers(include_self=False, recursive=False)`. Checked: tf_keras 2.21,
    Keras 3.15.
    """
    return list(layer._flatten_layers(include_self=False, recursive=False))
