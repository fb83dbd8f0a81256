"""What a training step keeps for its backward pass, read from the graph of the real step.

`traced_profile(model)` traces one training step of any Keras model (tf_keras, Keras
3, KerasHub, custom layers): forward pass, a loss, the gradients. The tensors that
live across the forward/backward boundary are the forward-pass tensors that
gradient ops read: these are what the backward pass keeps. Their bytes are summed
from the static shapes (not the weights and their casts: they are the plan's model
states; dropout's masks count). Traced at two small batch sizes, the
difference is the per-example part and the rest the fixed part, so the plan scales
to any batch. Nothing is run: a trace of a small model takes a second or two.

The optimizer is not traced: its slots are counted from its rule
(`tfaccel.performance.plan.SLOTS`). The loss is the sum of the squared outputs in
float32, which keeps a float32 tensor the size of the outputs, as a cross-entropy
keeps its gradient of the logits.

What the graph cannot see: backend workspaces (oneDNN's convolution buffers), the
allocator's fragmentation and the transients of the backward pass beyond the largest
kept tensor; a measured calibration (`tfaccel.performance.plan.measure_memory`) sees
them.

Example:

    from tfaccel.performance import memory_graph, plan

    profile = memory_graph.traced_profile(model, sequence_length=128)
    print(plan.format_plan(plan.plan_memory(profile, batch_size=64)))
"""

import tensorflow as tf

from tfaccel.errors import ConfigError
from tfaccel.performance import memory_profile, utilization

TRACE_BATCHES = (2, 4)
"""The two batch sizes the step is traced at (their difference gives the per-example part)."""
_GRADIENT_SCOPE = "gradient_tape/"


def _bytes(tensor):
    """Bytes of `tensor` from its static shape (0 for an unknown shape or a resource)."""
    if tensor.dtype in (tf.resource, tf.variant) or tensor.shape.rank is None:
        return 0
    dims = tensor.shape.as_list()
    if any(d is None for d in dims):
        return 0
    size = 1
    for d in dims:
        size *= d
    return size * tensor.dtype.size


def _weight_derived(ops):
    """Names of the tensors among `ops` computed from the variables alone (their reads, the
    casts of mixed precision): model states, not activations."""
    derived = set()
    for op in ops:  # in creation order: producers before consumers
        inputs = [t for t in op.inputs if t.op.type != "Const"]
        if op.type == "ReadVariableOp" or (inputs and all(t.name in derived for t in inputs)):
            derived.update(t.name for t in op.outputs)
    return derived


_VIEWS = ("Reshape", "Identity", "ExpandDims", "Squeeze", "StopGradient", "Snapshot")
"""Ops whose output shares its input's buffer (TensorFlow forwards it): one tensor kept."""


def _buffer(tensor):
    """The tensor whose buffer `tensor` is (through views)."""
    while tensor.op.type in _VIEWS and tensor.op.inputs:
        tensor = tensor.op.inputs[0]
    return tensor


def saved_tensors(graph):
    """{name: bytes} of the forward tensors of `graph` that its gradient ops read: what the
    backward pass keeps alive (a view counted as its buffer; constants and tensors made from
    the variables alone left to the model states). Dropout's masks count: they are made
    from random numbers of the activation's shape, not from the inputs."""
    ops = graph.get_operations()
    # the backward pass is every op made from the tape's first gradient op on (in creation
    # order), including forward ops a recomputed block makes again inside it
    start = next((i for i, op in enumerate(ops) if op.name.startswith(_GRADIENT_SCOPE)),
                 len(ops))
    forward = {op.name for op in ops[:start]}
    states = _weight_derived(ops[:start])
    kept = {}
    for op in ops[start:]:
        for t in op.inputs:
            if t.op.name not in forward or t.op.type == "Const" or t.name in states:
                continue
            t = _buffer(t)
            kept[t.name] = _bytes(t)
    return kept


def saved_bytes(model, batch_size, sequence_length=None):
    """(bytes the backward pass keeps, bytes of its largest kept tensor) for one training
    step of `model` at `batch_size` (traced, not run)."""
    graph, _ = utilization.traced_step(model, batch_size, sequence_length, loss="square")
    kept = saved_tensors(graph)
    return sum(kept.values()), max(kept.values(), default=0)


def traced_profile(model, sequence_length=None, batches=TRACE_BATCHES):
    """A `MemoryProfile` of `model` whose activations come from the graph of its training step.

    Traced at the two `batches`, the kept bytes are fit as ``fixed + per_example * batch``;
    the profile carries the per-example part as one layer and the fixed part beside it, and
    says so (``method``).

    Args:
      model: a built model of either Keras (inputs of known shape but the batch).
      sequence_length: the length to trace a variable-length input at (token ids).
      batches: two batch sizes, smallest first.

    Raises:
      ConfigError / ModelError: one line naming the problem (a variable-length input without
        `sequence_length`, a model that cannot be traced).
    """
    small, large = (int(b) for b in batches)
    if not 0 < small < large:
        raise ConfigError(f"batches={batches}: two increasing positive batch sizes")
    kept_small, biggest_small = saved_bytes(model, small, sequence_length)
    kept_large, biggest_large = saved_bytes(model, large, sequence_length)
    per_example = (kept_large - kept_small) / (large - small)
    fixed = max(0, int(round(kept_small - small * per_example)))
    largest = max(0, (biggest_large - biggest_small) // (large - small)) or biggest_large // large
    input_bytes = sum(s.shape.num_elements() // small * s.dtype.size
                      for s in utilization.input_specs(model, small, sequence_length))
    half = any(str(getattr(layer, "compute_dtype", "float32")) in ("float16", "bfloat16")
               for layer in getattr(model, "layers", []))
    trainable = sum(int(v.shape.num_elements()) for v in model.trainable_weights)
    non_trainable = sum(int(v.shape.num_elements()) for v in model.non_trainable_weights)
    step = memory_profile.LayerMemory("traced step", trainable + non_trainable,
                                      int(round(per_example)), int(largest), input_bytes)
    return memory_profile.MemoryProfile(
        model.name, (step,), trainable, non_trainable, input_bytes, half, "step",
        fixed_activation_bytes=fixed,
        method=f"graph (the traced train step at batches {small} and {large})")

