"""Private touchpoints: shared (used by several areas)."""

def is_graph_network(model):
    """True for a Sequential or functional model (a graph of layers), False for a subclassed one.

    Relies on tf_keras's private `Functional._is_graph_network` (Sequential is a
    Functional once built). Checked: tf_keras 2.21.
    """
    from tfaccel.keras import keras

    return isinstance(model, keras.Sequential) or bool(getattr(model, "_is_graph_network", False))
