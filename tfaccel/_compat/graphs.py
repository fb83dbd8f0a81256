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


def _einsum_flops(op):
    """2 x the product of every index's size: the multiply-adds of one Einsum op (the
    profiler registers no cost for Einsum, which Keras's EinsumDense and attention use)."""
    equation = op.get_attr("equation").decode()
    inputs, _, _ = equation.partition("->")
    sizes = {}
    for spec, tensor in zip(inputs.split(","), op.inputs):
        dims = tensor.shape.as_list()
        if "..." in spec:
            head, _, tail = spec.partition("...")
            spec = head + "".join(chr(0x100 + i) for i in range(len(dims) - len(head) -
                                                                 len(tail))) + tail
        for letter, dim in zip(spec, dims):
            if dim is None:
                return 0
            sizes[letter] = max(sizes.get(letter, 1), dim)
    total = 1
    for dim in sizes.values():
        total *= dim
    return 2 * total


def graph_float_ops(graph):
    """Floating-point operations TensorFlow's profiler counts in `graph` (ops with a
    registered cost: MatMul, BatchMatMul, Conv2D and their gradients, elementwise math),
    plus Einsum ops, which it does not cost (`_einsum_flops`).

    Relies on `tf.compat.v1.profiler` (no TF2 API counts a graph's FLOPs), which needs every
    shape in the graph known, and reads only the graph itself (not functions it calls, such
    as a recomputed block's). Checked: TF 2.21.
    """
    import tensorflow as tf  # deferred: TensorFlow

    options = tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()
    options["output"] = "none"
    logger, level = tf.get_logger(), tf.get_logger().level
    logger.setLevel("ERROR")  # the profiler warns of its own deprecated shape helper
    try:
        counted = tf.compat.v1.profiler.profile(graph=graph, options=options).total_float_ops
    finally:
        logger.setLevel(level)
    einsums = sum(_einsum_flops(op) for op in graph.get_operations() if op.type == "Einsum")
    return int(counted) + einsums


def is_plain_graph_model(model):
    """True for a Sequential or functional model of Keras's own classes, False for a subclass
    of them (a KerasHub task, a user's class) or a subclassed model: a layer-by-layer clone
    keeps only the plain classes.

    Relies on the private `Functional` classes (tf_keras `tf_keras.src.engine.functional`,
    Keras 3 `keras.src.models.functional`): neither Keras exports them. Checked: tf_keras
    2.21, Keras 3.15.
    """
    # deferred: tf_keras (tfaccel.keras loads it)
    from tfaccel.keras import is_keras3_object, keras, keras3

    if is_keras3_object(model):
        k3 = keras3()
        return type(model) in (k3.Sequential, k3.src.models.functional.Functional)
    return type(model) in (keras.Sequential, keras.src.engine.functional.Functional)


def sublayers(layer):
    """The layers `layer` holds directly (a custom layer's Dense, a wrapper's inner layer).

    Keras 3 exports no way to list a plain layer's sublayers (`Model.layers` exists only on
    models); both Kerases keep them behind the private
    `Layer._flatten_layers(include_self=False, recursive=False)`. Checked: tf_keras 2.21,
    Keras 3.15.
    """
    return list(layer._flatten_layers(include_self=False, recursive=False))
