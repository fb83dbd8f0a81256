"""Every place tfaccel relies on a private part of TensorFlow, tf_keras, TF-MOT or TFLite.

Public APIs do not offer these; each is wrapped here in one small function so
that an upgrade is checked and fixed in this one file. Each names what it
relies on and the versions it was checked against (TF 2.21, tf_keras 2.21,
TF-MOT 0.8.1, unless it says otherwise). Imports are lazy: importing this
module loads nothing heavy.
"""

# ===== shared (used by several areas)


def is_graph_network(model):
    """True for a Sequential or functional model (a graph of layers), False for a subclassed one.

    Relies on tf_keras's private `Functional._is_graph_network` (Sequential is a
    Functional once built). Checked: tf_keras 2.21.
    """
    from tfaccel.keras import keras

    return isinstance(model, keras.Sequential) or bool(getattr(model, "_is_graph_network", False))


# ===== distribute and data (tf.distribute, tf.data)

# ===== performance and train (tf_keras training loop, mixed precision, allocator)

# ===== compress (TF-MOT pruning and quantization, TFLite interpreter)

# ===== summaries and monitor (tf_keras TensorBoard callback)
