"""Private touchpoints: model and pipeline parallelism (`tfaccel.parallel.stages`)."""

import collections
import contextlib
import inspect


def graph_calls(model):
    """The layer calls of a functional or Sequential model, in an order that can run them.

    Returns `(calls, input_ids, output_ids)`: each call is `(layer, input_ids,
    output_ids, node)`, deepest first (the inputs' side) and, within a depth, in the
    order of `model.layers`; ids name the graph's tensors. Relies on tf_keras's private
    `Functional._nodes_by_depth` and its `Node` objects (`is_input`, `flat_input_ids`,
    `flat_output_ids`), as Keras's own `Functional._run_internal_graph` does.
    Checked: tf_keras 2.21.
    """
    order = {id(layer): i for i, layer in enumerate(model.layers)}
    calls = []
    for depth in sorted(model._nodes_by_depth, reverse=True):
        nodes = [n for n in model._nodes_by_depth[depth] if not n.is_input]
        for node in sorted(nodes, key=lambda n: order.get(id(n.layer), len(order))):
            calls.append((node.layer, tuple(node.flat_input_ids), tuple(node.flat_output_ids),
                          node))
    return calls, [str(id(t)) for t in model.inputs], [str(id(t)) for t in model.outputs]


def run_call(node, values, training=None):
    """Runs one layer call of a graph on `values` ({tensor id: tensor}); {output id: tensor}.

    `training` reaches the layers whose `call` takes it (BatchNormalization, Dropout), unless
    the graph fixed it for that call, as a model's own call would pass it. Relies on
    tf_keras's private `Node.map_arguments` (it pops each input from a list per id) and
    `Node.flat_output_ids`. Checked: tf_keras 2.21.
    """

    import tensorflow as tf  # deferred: TensorFlow

    feed = {i: [values[i]] * n for i, n in collections.Counter(node.flat_input_ids).items()}
    args, kwargs = node.map_arguments(feed)
    if training is not None and "training" not in kwargs and \
            "training" in inspect.signature(node.layer.call).parameters:
        kwargs = dict(kwargs, training=training)
    outputs = node.layer(*args, **kwargs)
    return dict(zip(node.flat_output_ids, tf.nest.flatten(outputs)))


@contextlib.contextmanager
def builds_on(layer, device):
    """Makes `layer` create its variables on `device` when it is built (inside this block).

    Keras builds a layer inside `tf.init_scope` when it is first called, where an outer
    `tf.device` no longer applies; so the layer's `build` is wrapped for the block.
    Relies on tf_keras calling `self.build` from its private `_maybe_build`.
    Checked: tf_keras 2.21.
    """
    import tensorflow as tf  # deferred: TensorFlow

    build = layer.build

    def build_on_device(*args, **kwargs):
        with tf.device(device):
            return build(*args, **kwargs)

    object.__setattr__(layer, "build", build_on_device)
    try:
        yield layer
    finally:
        object.__delattr__(layer, "build")
