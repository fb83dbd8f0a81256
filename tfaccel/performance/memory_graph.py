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

The plan adds what TensorFlow's pooled allocator holds beyond the bytes asked for
(`pool_slack`): the step's buffers (`step_buffers`) replayed through the allocator's
rules (`tfaccel.performance.memory_pool`), in the order the ops were made and in
`ORDERS - 1` orders TensorFlow's executor could take (`executor_order`), the largest
peak kept: the real order changes from run to run, and so does the real peak. With oneDNN
off (TensorFlow's default on CPUs with AVX2 alone) the kernels' own buffers are replayed
too (`host_kernels.kernel_buffers`). What the graph cannot see: the one order a run took,
other kernels' scratch buffers; a measured calibration (`tfaccel.performance.calibrate`)
sees them.

Example:

    from tfaccel.performance import memory_graph, plan

    profile = memory_graph.traced_profile(model, sequence_length=128)
    print(plan.format_plan(plan.plan_memory(profile, batch_size=64)))
"""

import dataclasses
import random

import tensorflow as tf

from tfaccel.errors import ConfigError, ModelError, first_line
from tfaccel.keras import flavour_of, is_keras3_object
from tfaccel.performance import memory_pool, memory_profile, utilization
from tfaccel.performance.host_kernels import kernel_buffers
from tfaccel.train import precision as precisions, training

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
    """The tensor whose buffer `tensor` is (through views; IdentityN's k-th output is its k-th
    input, as the optimizer's gradients pass through one)."""
    while tensor.op.inputs:
        if tensor.op.type in _VIEWS:
            tensor = tensor.op.inputs[0]
        elif tensor.op.type == "IdentityN":
            tensor = tensor.op.inputs[tensor.value_index]
        else:
            break
    return tensor


def _backward_start(ops):
    """Index in `ops` (creation order) of the tape's first gradient op: the backward pass is
    every op from there on, including forward ops a recomputed block makes again inside it."""
    return next((i for i, op in enumerate(ops) if op.name.startswith(_GRADIENT_SCOPE)),
                len(ops))


def saved_tensors(graph):
    """{name: bytes} of the forward tensors of `graph` that its gradient ops read: what the
    backward pass keeps alive (a view counted as its buffer; constants and tensors made from
    the variables alone left to the model states). Dropout's masks count: they are made
    from random numbers of the activation's shape, not from the inputs."""
    ops = graph.get_operations()
    start = _backward_start(ops)
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


_IN_PLACE = frozenset((
    # element-wise ops whose kernels reuse an input's buffer for the output when that input
    # is not read again (`forward_input_or_allocate_output` in cwise_ops_common.h and
    # numeric_op.h): unary and binary arithmetic, activations and their gradients
    "Abs", "Add", "AddV2", "BiasAdd", "Cos", "Div", "DivNoNan", "Elu", "EluGrad", "Erf", "Exp",
    "LeakyRelu", "LeakyReluGrad", "Log", "Log1p", "Maximum", "Minimum", "Mul", "MulNoNan",
    "Neg", "Pow", "RealDiv", "Reciprocal", "Relu", "Relu6", "Relu6Grad", "ReluGrad", "Rsqrt",
    "RsqrtGrad", "Selu", "SeluGrad", "Sigmoid", "SigmoidGrad", "Sin", "Softplus",
    "SoftplusGrad", "Sqrt", "SqrtGrad", "Square", "SquaredDifference", "Sub", "Tanh",
    "TanhGrad"))


ORDERS = 8
"""Op orders the pooled allocator's replay tries (the creation order and ORDERS - 1 executor-like
orders); the plan keeps the largest peak, as the benchmark keeps the largest process."""


def executor_order(graph, seed):
    """The ops of `graph` in an order TensorFlow's executor could run them: an op is ready when
    the ops it reads (and its control inputs) have run, and the next op is drawn at random
    among the ready ones (`random.Random(seed)`: the same seed, the same order), as the
    executor's thread pool takes ready ops in an order that changes from run to run."""
    ops = graph.get_operations()
    index = {op.name: i for i, op in enumerate(ops)}
    waiting, readers = [0] * len(ops), [[] for _ in ops]
    for i, op in enumerate(ops):
        before = {index[t.op.name] for t in op.inputs if t.op.name in index}
        before |= {index[c.name] for c in op.control_inputs if c.name in index}
        waiting[i] = len(before)
        for j in before:
            readers[j].append(i)
    rng = random.Random(seed)
    ready, order = [i for i, n in enumerate(waiting) if not n], []
    while ready:
        k = rng.randrange(len(ready))
        ready[k], ready[-1] = ready[-1], ready[k]
        i = ready.pop()
        order.append(ops[i])
        for j in readers[i]:
            waiting[j] -= 1
            if not waiting[j]:
                ready.append(j)
    return order


def step_buffers(graph, order=None, exclusive=False, workspaces=None):
    """The buffers one run of `graph` (a traced step) allocates and frees, in order: a list
    of ``(name, bytes, is_activation)`` for an allocation and ``(name, None, None)`` for a
    free (see `live_bytes` for the rules; `is_activation` is False for model states: the
    casts of the weights, the step's outputs, i.e. the weights' gradients). The ops run in
    `order` (a topological order of the graph's ops, e.g. `executor_order`), by default the
    order they were made in. `exclusive`: an op writes in place only into a buffer no other op
    reads (the executor may run its readers at once). `workspaces`: {op name: bytes, or a
    tuple of buffers' bytes} the op's kernel allocates after its outputs and frees before it
    ends (`kernel_buffers`); those
    of ops made ready by the same op (a convolution's two gradients, by its output's
    gradient) stay alive until the last of them has run: the executor runs such costly
    siblings at once, one in its thread pool and one inline."""
    ops = list(order) if order is not None else graph.get_operations()
    workspaces, siblings, open_workspaces = workspaces or {}, {}, {}
    depth = _depths(graph) if workspaces else {}
    for op in ops:
        if workspaces.get(op.name):
            key = _last_input(op, depth)
            siblings[key] = siblings.get(key, 0) + 1
    states = _weight_derived(ops)
    returned = {_buffer(t).name for t in graph.outputs}
    last_read, readers = {}, {}
    for i, op in enumerate(ops):
        if op.type in _VIEWS or op.type == "IdentityN":
            continue  # a view's readers read its buffer (`_buffer`); an unread view is pruned
        for t in op.inputs:
            last_read[_buffer(t).name] = i
            readers.setdefault(_buffer(t).name, set()).add(op.name)
    for name in returned:  # the caller (the optimizer) reads them after the step
        last_read[name] = len(ops)
    free_at = {}
    for name, i in last_read.items():
        free_at.setdefault(i, []).append(name)
    events, owner = [], {}  # owner: buffer name -> the allocation it was written into
    for i, op in enumerate(ops):
        reusable = [t for t in op.inputs if op.type in _IN_PLACE
                    and last_read.get(_buffer(t).name) == i and _buffer(t).name in owner
                    and not (exclusive and len(readers.get(_buffer(t).name, ())) > 1)]
        for out in op.outputs:
            if _buffer(out) is not out or op.type in ("Const", "Placeholder", "ReadVariableOp") \
                    or out.name not in last_read or not _bytes(out):
                continue
            nbytes = _bytes(out)
            donor = next((j for j, t in enumerate(reusable) if _bytes(_buffer(t)) == nbytes
                          and t.dtype == out.dtype), None)
            if donor is not None:  # written in place
                owner[out.name] = owner.pop(_buffer(reusable.pop(donor)).name)
                continue
            owner[out.name] = out.name
            activation = out.name not in states and out.name not in returned
            events.append((out.name, nbytes, activation))
        if workspaces.get(op.name):
            key = _last_input(op, depth)
            sizes = workspaces[op.name]
            for k, nbytes in enumerate(sizes if isinstance(sizes, tuple) else (sizes,)):
                events.append((f"{op.name}:workspace:{k}", nbytes, True))
                open_workspaces.setdefault(key, []).append(f"{op.name}:workspace:{k}")
            siblings[key] -= 1
            if not siblings[key]:
                events += [(name, None, None) for name in reversed(open_workspaces.pop(key))]
        for name in free_at.get(i, ()):
            if name in owner:
                events.append((owner.pop(name), None, None))
    events += [(name, None, None) for name in owner.values()]
    return events


def live_bytes(graph, order=None):
    """(kept, peak): bytes of the forward tensors the backward pass reads (`saved_tensors`),
    and the largest sum of activation buffers alive at once while the step runs.

    The step is run in the order its ops were made (a topological order: the forward
    pass, the loss, then the backward pass as the tape wrote it), each op allocating its
    outputs and each buffer freed after its last reader: the peak adds to the kept
    tensors what the backward pass makes beside them (the gradient of each activation,
    a convolution's input gradient beside its output's, a pooling gradient at the
    pooled input's size). An element-wise op writes into an input whose last reader it
    is (`_IN_PLACE`, as TensorFlow's kernels do); a view shares its input's buffer.
    Constants, the weights and tensors made from the weights alone (their casts) are
    model states; so are the step's outputs (the weights' gradients); the inputs are the
    plan's input batches."""
    return sum(saved_tensors(graph).values()), _activation_peak(step_buffers(graph, order))


def _activation_peak(events):
    """The largest sum of activation buffers alive at once in `events` (`step_buffers`)."""
    sizes, live, peak = {}, 0, 0
    for name, nbytes, activation in events:
        if nbytes is None:
            live -= sizes.pop(name, 0)
        elif activation:
            sizes[name] = nbytes
            live += nbytes
            peak = max(peak, live)
    return peak


def _depths(graph):
    """{op name: the longest chain of ops that must run before it} (its inputs' and control
    inputs' depth plus one; the graph's ops are made in a topological order)."""
    depth = {}
    for op in graph.get_operations():
        before = [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]
        depth[op.name] = 1 + max((depth.get(name, 0) for name in before), default=0)
    return depth


def _last_input(op, depth):
    """Of the ops `op` reads, the deepest (`_depths`): the one whose end makes `op` ready (a
    gradient's, not the shapes it also reads, which are known since the forward pass)."""
    return max(sorted(t.op.name for t in op.inputs), key=lambda name: depth.get(name, 0))


@dataclasses.dataclass(frozen=True)
class PoolReplay:
    """What the replay of training steps through the pooled allocator adds to the plan.

    Attributes:
      slack: bytes the pool holds at its peak beyond the bytes asked for (`pool_slack`).
      workspaces: bytes the kernels' own workspaces (`kernel_buffers`) add to the peak
        of the bytes asked for; 0 where there are none (oneDNN on).
      recomputed_peak: for a step that recomputes blocks (`recomputed_bytes`), the peak of
        its activation buffers in creation order without the kernels' own (`live_bytes`);
        0 for a step without recomputation.
    """

    slack: int
    workspaces: int = 0
    recomputed_peak: int = 0


def pool_replay(model, batch_size, slots=0, accumulators=False, sequence_length=None,
                orders=ORDERS, seed=0, onednn=None):
    """`pool_slack` and the kernels' workspaces, from one trace (a `PoolReplay`): the
    workspaces are replayed with the step's buffers, each alive while its op runs.
    `onednn`: as in `kernel_buffers`."""
    if int(orders) < 1:
        raise ConfigError(f"orders={orders}: replay at least one op order")
    graph, inputs = utilization.traced_step(model, batch_size, sequence_length, loss="square")
    weights = [int(v.shape.num_elements()) * tf.as_dtype(v.dtype).size
               for v in model.weights]
    trainable = [int(v.shape.num_elements()) * 4 for v in model.trainable_weights]
    persistent = weights + [_bytes(t) for t in inputs] + (2 * trainable if accumulators else [])
    slots = trainable * int(slots)
    workspaces = kernel_buffers(graph, onednn)
    worst, exact = 0, None
    for k in range(int(orders)):
        order = executor_order(graph, seed + k) if k else None
        pool, peak = memory_pool.training_peaks(
            persistent, step_buffers(graph, order, workspaces=workspaces), slots)
        worst, exact = max(worst, pool), peak if exact is None else exact
    plain = step_buffers(graph)  # the creation order without the kernels' buffers
    without = memory_pool.training_peaks(persistent, plain, slots)[1] if workspaces else exact
    recomputed = _activation_peak(plain) if recomputed_bytes(graph)[0] else 0
    return PoolReplay(slack=max(0, worst - exact), workspaces=max(0, exact - without),
                      recomputed_peak=recomputed)


def pool_slack(model, batch_size, slots=0, accumulators=False, sequence_length=None,
               orders=ORDERS, seed=0):
    """Bytes TensorFlow's pooled (BFC) allocator holds at its peak beyond the bytes asked for,
    for training steps of `model` at `batch_size` (a micro-batch under accumulation).

    The traced step's buffers (`step_buffers`: activations, their gradients, the weight
    casts and gradients) are replayed through `memory_pool.training_peaks` after the
    weights and the input batch, with `slots` optimizer slots per trainable weight made
    at the first update (and with `accumulators` the accumulation loop's two float32 copies
    per trainable weight: the accumulator and its sum with the micro-batch's gradients),
    as `benchmarks/bench_memory.py` measures (two warm-up steps, then three). The step
    runs in `orders` op orders: the order its ops were made in and
    ``orders - 1`` executor-like ones (`executor_order`, seeds ``seed + 1``, ...). The
    slack is the largest of their pool peaks minus the exact peak of the creation order
    (what the plan's other rows count): the chunks served whole and what a worse order
    of independent ops keeps alive at once (TensorFlow's executor takes ready ops in an
    order that changes from run to run, and the benchmark keeps the largest run). With
    oneDNN off the kernels' workspaces are replayed too (`pool_replay` says what they add).
    """
    return pool_replay(model, batch_size, slots, accumulators, sequence_length, orders,
                       seed).slack


def make_optimizer(name, model, precision="float32"):
    """The optimizer `name` (`plan.SLOTS`) of `model`'s Keras as the recipes make it
    (`training.make_optimizer`: tf_keras's SGD keeps a momentum slot even at momentum 0, Keras
    3's does not), wrapped for `precision` (a loss scale under mixed_float16)."""
    made = training.make_optimizer(name, 1e-3, flavour=flavour_of(model))
    return precisions.wrap_optimizer(made, precision)


def squared_output_step(model, optimizer):
    """A `tf.function` of one training step of `model` (any Keras, any inputs) on the sum of
    its outputs squared, with `optimizer`'s update: the step the planner traces (the
    calibration trains `fit` on the same loss, `calibrate._squared_loss`)."""
    variables = model.trainable_variables
    read = [getattr(v, "value", v) for v in variables] if is_keras3_object(model) else variables
    structure = getattr(model, "input", None)

    @tf.function(autograph=False)
    def step(*inputs):
        with tf.GradientTape() as tape:
            loss = utilization.summed_outputs(model, structure, inputs,
                                              lambda t: tf.reduce_sum(tf.square(t)))
        optimizer.apply_gradients(zip(tape.gradient(loss, read), variables))
        return loss

    return step


def update_step(model, optimizer, batch_size=TRACE_BATCHES[0], sequence_length=None):
    """The graph of one training step of `model` with `optimizer`'s update (forward pass, the
    squared loss, the gradients, `apply_gradients`), traced at `batch_size`, not run. Tracing
    makes the optimizer's variables (its slots), as its first step does."""
    specs = utilization.input_specs(model, int(batch_size), sequence_length)
    step = squared_output_step(model, optimizer)
    try:
        return step.get_concrete_function(*specs).graph
    except (TypeError, ValueError) as e:
        raise ModelError(f"cannot trace a training step of {model.name!r} with its optimizer "
                         f"update: {first_line(e)}") from None


def optimizer_update(model, optimizer, precision="float32", sequence_length=None,
                     orders=ORDERS):
    """(slot bytes, update bytes) of training `model` with the optimizer `optimizer`, read from
    the optimizer itself and the graph of its update, not from a rule per optimizer.

    Slot bytes: the optimizer's variables once it has traced its update (`update_step`), the
    scalars (its step counter, a loss scale) left out. Update bytes: what the update makes
    beside the gradients: the update's ops (those made after the tape's last gradient op)
    replayed after the forward and backward pass (`step_buffers`), the largest live sum
    during them minus what was alive when they began (the gradients), the worst of
    `orders` orders of the update's ops (the order they were made in, then as
    `executor_order` draws them). An op writes in place only into a buffer it alone reads
    (``exclusive``): the executor runs the readers of one buffer at once, so Adam's ``g - m``
    and ``square(g)`` each get a new buffer. tf_keras's SGD writes ``m = -g * lr + m *
    momentum`` and ``w += m``: beside its momentum slot (kept at momentum 0) it holds one
    buffer of the largest weight's size more than its gradients; Adam two.

    Returns (slot bytes, update bytes, early bytes): the third is what the update makes
    before any gradient exists (`_early_update_bytes`), alive at the backward pass's peak.
    """
    opt = make_optimizer(optimizer, model, precision)
    graph = update_step(model, opt, sequence_length=sequence_length)
    slots = sum(int(v.shape.num_elements()) * tf.as_dtype(v.dtype).size
                for v in opt.variables if int(v.shape.num_elements()) > 1)
    ops = graph.get_operations()
    last = max((i for i, op in enumerate(ops) if op.name.startswith(_GRADIENT_SCOPE)),
               default=len(ops) - 1)
    head, tail = ops[:last + 1], {op.name for op in ops[last + 1:]}
    worst = 0
    for seed in range(int(orders)):
        drawn = executor_order(graph, seed) if seed else ops
        sizes, live, start, peak = {}, 0, None, 0
        for name, nbytes, _ in step_buffers(graph, head + [op for op in drawn if op.name in tail],
                                            exclusive=True):
            if nbytes is None:
                live -= sizes.pop(name, 0)
                continue
            if start is None and name.rsplit(":", 1)[0] in tail:
                start = peak = live
            sizes[name] = nbytes
            live += nbytes
            peak = max(peak, live)
        worst = max(worst, peak - start if start is not None else 0)
    return slots, worst, _early_update_bytes(ops, last)


def _early_update_bytes(ops, last):
    """Bytes of the buffers the update's ops (`ops` after index `last`) make without reading
    a gradient and that an op reading one consumes (tf_keras SGD's ``m * momentum``, added to
    ``-g * lr``): the executor runs them as soon as the step starts, so they wait, alive,
    through the backward pass's peak."""
    after_gradients = set()
    for op in ops:
        sources = [t.op.name for t in op.inputs] + [c.name for c in op.control_inputs]
        if op.name.startswith(_GRADIENT_SCOPE) or any(n in after_gradients for n in sources):
            after_gradients.add(op.name)
    tail, early = {op.name for op in ops[last + 1:]}, {}
    for op in ops[last + 1:]:
        if op.name in after_gradients:
            for t in op.inputs:
                source = _buffer(t).op
                if (source.name not in after_gradients and source.type not in
                        ("Const", "Placeholder", "ReadVariableOp") and source.name in tail):
                    early[source.name] = _bytes(_buffer(t))
    return sum(early.values())


_TAPE_GLUE = frozenset(("AddN", "Const", "Fill", "Identity", "IdentityN", "NoOp", "ZerosLike"))
"""Op types the tape makes outside its name scope without recomputing anything: sums of a
tensor's gradients, views, zeros for an unused output (seen in the steps of the GPT, CNNs,
ResNet and MobileNetV2)."""


def recomputed_bytes(graph):
    """(bytes, largest tensor's bytes) of the largest group of forward tensors that the
    backward pass of `graph` makes again and its gradient ops read: a `tf.recompute_grad`
    block runs its forward a second time inside the gradient, and what that run keeps is
    alive, beside the blocks' kept inputs, while the block's gradient runs. The backward's
    forward ops (outside the tape's scope, but for the glue it makes there: `_TAPE_GLUE`)
    come in one unbroken run per recomputed block, in creation order between gradient ops;
    (0, 0) for a step without recomputation."""
    ops = graph.get_operations()
    start = _backward_start(ops)
    group_of, groups, in_run = {}, [], False
    states = _weight_derived(ops)  # the weights read again, and their casts, are model states
    for op in ops[start:]:
        if op.type in _TAPE_GLUE:
            continue
        if not op.name.startswith(_GRADIENT_SCOPE):
            if not in_run:
                groups.append({})
                in_run = True
            group_of[op.name] = len(groups) - 1
            continue
        in_run = False
        for t in op.inputs:
            t = _buffer(t)
            if t.op.name in group_of and t.op.type != "Const" and t.name not in states:
                groups[group_of[t.op.name]][t.name] = _bytes(t)
    return max(((sum(g.values()), max(g.values(), default=0)) for g in groups), default=(0, 0))


def _step_bytes(model, batch_size, sequence_length=None):
    graph, _ = utilization.traced_step(model, batch_size, sequence_length, loss="square")
    kept = saved_tensors(graph)
    made = [n for name, n in kept.items()
            if graph.get_tensor_by_name(name).op.type != "Placeholder"]
    return sum(kept.values()), max(made, default=0), recomputed_bytes(graph)


def saved_bytes(model, batch_size, sequence_length=None):
    """(bytes the backward pass keeps, bytes of its largest kept tensor that is not an input of
    the step) for one training step of `model` at `batch_size` (traced, not run). The
    largest gives the backward transient, its gradient: the model's inputs get none."""
    return _step_bytes(model, batch_size, sequence_length)[:2]


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
    kept_small, biggest_small, (again_small, most_small) = _step_bytes(model, small,
                                                                       sequence_length)
    kept_large, biggest_large, (again_large, most_large) = _step_bytes(model, large,
                                                                       sequence_length)
    per_example = (kept_large - kept_small) / (large - small)
    fixed = max(0, int(round(kept_small - small * per_example)))
    biggest_large, biggest_small = max(biggest_large, most_large), max(biggest_small, most_small)
    largest = max(0, (biggest_large - biggest_small) // (large - small)) or biggest_large // large
    # a recomputed block's forward tensors live beside the kept ones while its gradient runs,
    # and the gradient of its largest tensor is made beside them
    largest += max(0, (again_large - again_small) // (large - small))
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

