"""How close training runs to the machine's limit: FLOPs per example, and model FLOP utilization.

MFU (model FLOP utilization, as in the PaLM paper and nanoGPT) is the training
FLOP/s a run achieves, counting only the model's own math (forward and backward
pass), over the device's peak for the precision in use (`tfaccel.doctor.peak`:
cores x clock x FLOP per cycle on a CPU, the vendor's dense figure on a GPU). A
number near the peak says the step is doing arithmetic; a low one says time goes
elsewhere (the input, small kernels, casts, the host).

Two ways to count a training step's FLOPs:

- `transformer_flops_per_token`: the closed form for a decoder-only Transformer,
  6 N + 12 L d T per token (N parameters without the position embedding, L layers,
  width d, context T): 2 FLOPs per parameter per token forward, twice that backward,
  plus attention's score and value products.
- `training_flops_per_example`: any Keras model (tf_keras or Keras 3, custom layers
  included), from the graph of one traced forward and backward pass at a fixed
  batch, counted by TensorFlow's profiler (ops with a registered cost: matrix
  products, convolutions and their gradients, elementwise math). The optimizer's
  update (a few FLOPs per parameter) is left out, as MFU conventions do.

Example:

    from tfaccel import doctor
    from tfaccel.performance import utilization

    flops = utilization.training_flops_per_example(model)
    print(utilization.mfu(examples_per_second=2400, flops_per_example=flops,
                          peak=doctor.peak("float32")))
"""

import tensorflow as tf

from tfaccel import _compat
from tfaccel.errors import ConfigError, ModelError, first_line
from tfaccel.keras import input_specs, is_keras3_object


def transformer_flops_per_token(parameters, layers, d_model, context, position_parameters=0):
    """Training FLOPs per token of a decoder-only Transformer: 6 N + 12 L d T.

    Args:
      parameters: the model's parameters (a tied embedding counted once).
      layers, d_model, context: its depth, width and context length (T).
      position_parameters: the learned position embedding's size, left out of N (it is a
        lookup, not a product), as nanoGPT counts.
    """
    n = int(parameters) - int(position_parameters)
    return 6 * n + 12 * int(layers) * int(d_model) * int(context)


def training_flops_per_example(model, batch_size=2, sequence_length=None):
    """FLOPs of one training example's forward and backward pass, counted in the traced graph.

    The step is traced (not run) at `batch_size` with the loss taken as the sum of the
    outputs: the gradients flow through every layer as in training, while a real loss adds
    only O(outputs) FLOPs. Integer inputs (token ids) get zeros.

    Args:
      model: a built tf_keras or Keras 3 model (inputs of known shape).
      batch_size: the batch traced (the count is divided by it).
      sequence_length: the length to trace a variable-length input at.

    Raises:
      ConfigError / ModelError: one line naming the problem and the fix.
    """
    if batch_size < 1:
        raise ConfigError(f"batch_size={batch_size}: trace at least one example")
    try:
        graph, _ = traced_step(model, int(batch_size), sequence_length)
    except ModelError as e:
        raise ModelError(f"{e} (to count its FLOPs)") from None
    return _compat.graph_float_ops(graph) / int(batch_size)


def traced_step(model, batch_size, sequence_length=None, loss="sum"):
    """(graph, input placeholders) of one training step of `model` (forward pass, a loss,
    the gradients of the trainable variables), traced at `batch_size`, not run.

    `loss`: 'sum' (the sum of the outputs: gradients flow through every layer, and the
    loss keeps nothing) or 'square' (the sum of the squared outputs in float32: it keeps a
    float32 copy of the outputs, as a cross-entropy keeps its gradient of the logits).
    Integer inputs (token ids) are traced as placeholders too.

    Raises:
      ConfigError / ModelError: one line naming the problem and the fix.
    """
    specs = input_specs(model, int(batch_size), sequence_length)
    variables = model.trainable_variables
    if is_keras3_object(model):
        variables = [getattr(v, "value", v) for v in variables]
    structure = getattr(model, "input", None)
    reduce = (lambda t: tf.reduce_sum(tf.square(t))) if loss == "square" else tf.reduce_sum

    @tf.function(autograph=False)
    def step(*inputs):
        with tf.GradientTape() as tape:
            total = summed_outputs(model, structure, inputs, reduce)
        return tape.gradient(total, variables)

    try:
        graph = step.get_concrete_function(*specs).graph
    except (TypeError, ValueError) as e:
        raise ModelError(f"cannot trace a training step of {model.name!r}: "
                         f"{first_line(e)}") from None
    return graph, list(graph.inputs[:len(specs)])


def summed_outputs(model, structure, inputs, reduce=tf.reduce_sum):
    """`model` called in training mode on `inputs` (packed as its input `structure` when it
    takes several), its outputs reduced to one float32 scalar: the stand-in loss of a traced
    or measured step (the gradients flow through every layer as in training)."""
    x = tf.nest.pack_sequence_as(structure, list(inputs)) if len(inputs) > 1 else inputs[0]
    outputs = model(x, training=True)
    return tf.add_n([reduce(tf.cast(t, tf.float32)) for t in tf.nest.flatten(outputs)])


def mfu(examples_per_second, flops_per_example, peak):
    """Model FLOP utilization: achieved model FLOP/s over `peak` (a `doctor.Peak` or FLOP/s);
    None when the peak is unknown."""
    peak_flops = getattr(peak, "flops_per_second", peak)
    if not peak_flops:
        return None
    return float(examples_per_second) * float(flops_per_example) / float(peak_flops)
