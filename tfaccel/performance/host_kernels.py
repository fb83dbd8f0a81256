"""What TensorFlow's CPU kernels allocate for themselves while they run, beyond their outputs.

A traced training step shows every tensor its ops make, not the buffers the kernels ask the
allocator for while they run: with oneDNN off (TensorFlow's default on a CPU without
AVX512_VNNI, AVX512_BF16, AVX-VNNI or AMX: `tfaccel.doctor.onednn_enabled`), TensorFlow's own
kernels keep column buffers for convolution gradients, float32 copies for bfloat16 matrix
products and batch-norm gradients, and the maxima's positions for a max-pooling gradient:
tens of MB the memory plan must count (`memory_graph.pool_replay` replays them with the
step's tensors). Each size is checked against the buffers TensorFlow allocates, in order,
by tests/test_host_kernels.py.
"""

import os

import tensorflow as tf

from tfaccel import _compat

_WORKING_SET = 30 << 20  # the L3 cache the custom convolution gradients size their work to
_MIN_THREAD_WORK = 256 << 10  # the L2 cache below which the input gradient shards images
_MATMULS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3")


def _column_buffer(op, threads):
    """(bytes,) of a custom convolution gradient's column buffer (conv_grad_filter_ops.cc,
    conv_grad_input_ops.h), or None for another op."""
    if op.type not in ("Conv2DBackpropFilter", "Conv2DBackpropInput") \
            or op.get_attr("data_format") not in (b"NHWC", "NHWC"):
        return None
    is_input = op.type == "Conv2DBackpropInput"
    filter_shape = (op.inputs[1] if is_input else op.outputs[0]).shape
    out_shape, size = op.inputs[2].shape, op.inputs[2].dtype.size
    if not (filter_shape.is_fully_defined() and out_shape.is_fully_defined()):
        return None
    rows, cols, in_depth, out_depth = filter_shape.as_list()
    batch, out_rows, out_cols, _ = out_shape.as_list()
    filter_size, pixels = rows * cols * in_depth, out_rows * out_cols
    work = pixels * out_depth + filter_size * out_depth + pixels * filter_size
    if not work:
        return None
    if is_input and (batch == 1 or work // threads >= _MIN_THREAD_WORK // size):
        shard = 1
    else:
        shard = -(-(_WORKING_SET // size) // work)
    return (shard * pixels * filter_size * size,)


def _float32_copies(op):
    """Bytes of the float32 copies a bfloat16 matrix product on Eigen makes of its first
    input, its second and its result, three buffers asked for in that order, or None."""
    if op.type not in _MATMULS or op.inputs[0].dtype != tf.bfloat16:
        return None
    shapes = [op.inputs[0].shape, op.inputs[1].shape, op.outputs[0].shape]
    if not all(shape.is_fully_defined() for shape in shapes):
        return None
    return tuple(4 * shape.num_elements() for shape in shapes)


def _batch_norm_scratch(op):
    """The float buffers Eigen's batch-norm gradient (training, NHWC) asks for: one per
    channel, and, when the input is 16-bit, one per input value (its float32 products), or
    None (fused_batch_norm_op.cc)."""
    if op.type not in ("FusedBatchNormGrad", "FusedBatchNormGradV2", "FusedBatchNormGradV3") \
            or not op.get_attr("is_training") or op.get_attr("data_format") not in (b"NHWC",
                                                                                  "NHWC"):
        return None
    x = op.inputs[1]
    if not x.shape.is_fully_defined():
        return None
    u = tf.as_dtype(op.get_attr("U")) if op.type != "FusedBatchNormGrad" else x.dtype
    per_value = (u.size * x.shape.num_elements(),) if x.dtype != u else ()
    return (u.size * x.shape[-1],) + per_value


def _argmax(op):
    """(bytes,) of the int64 positions of the maxima Eigen's max-pooling gradient finds
    again, one per pooled value, or None."""
    if op.type != "MaxPoolGrad" or not op.inputs[1].shape.is_fully_defined():
        return None
    return (8 * op.inputs[1].shape.num_elements(),)


def kernel_buffers(graph, onednn=None, threads=None):
    """{op name: (bytes, ...)}: the buffers, in the order they are asked for, that the CPU
    kernels of `graph`'s ops allocate for themselves while they run, beyond their outputs:
    what TensorFlow's allocator holds that no tensor of the graph shows.

    With oneDNN off (TensorFlow's default on a CPU without AVX512_VNNI, AVX512_BF16,
    AVX_VNNI or AMX: `tfaccel.doctor.onednn_enabled`), TensorFlow's own kernels run:

    - a convolution's gradients, with respect to its filter and to its input, unroll
      ``shard`` images at a time into a column buffer of ``shard x output pixels x filter
      size``, ``shard`` chosen so that one shard's matrices fill a 30 MiB working set
      whatever the batch: 14 MB for each gradient of the zoo CNN's second convolution,
      which made the CNN's measured peak at batch 256 2.1 times the plan's on an AVX2-only
      CPU. The input gradient takes one image at a time instead when a thread's share of
      one image's work reaches 256 KiB (or the batch is 1);
    - a bfloat16 matrix product computes in float32 copies of its inputs and its result,
      three buffers (which the pooled allocator may fit in three different free chunks);
    - a max-pooling gradient finds the maxima again, an int64 position per pooled value;
    - a batch normalization's gradient keeps a float per channel and, in 16-bit, a float32
      buffer of its input's size (28 MB for one of MobileNetV2's at 96x96, batch 64).

    With oneDNN on, its kernels keep none of these: {}. Other scratch (oneDNN's, the
    Einsum's transposes) is not counted. Each size was checked against the buffers
    TensorFlow allocates (tests/test_host_kernels.py).

    Example (the plan of an AVX2-only CPU, from any machine):

        from tfaccel.performance import host_kernels, utilization
        graph, _ = utilization.traced_step(model, 256, loss="square")
        print(sum(map(sum, host_kernels.kernel_buffers(graph, onednn=False).values())))

    Args:
      graph: a traced step (`tfaccel.performance.utilization.traced_step`).
      onednn: whether oneDNN's kernels run; None asks this process's TensorFlow.
      threads: the CPU device's worker threads; None reads TensorFlow's intra-op setting
        (all the cores this process may use when it is 0).
    """
    if onednn is None:
        onednn = _compat.onednn_in_use()
    if onednn:
        return {}
    if not threads:
        cores = (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
        threads = tf.config.threading.get_intra_op_parallelism_threads() or cores
    found, live = {}, _live_ops(graph)
    for op in graph.get_operations():
        if op.name in live and op.inputs:
            sizes = (_float32_copies(op) or _batch_norm_scratch(op)
                     or _column_buffer(op, threads) or _argmax(op))
            if sizes and all(sizes):
                found[op.name] = sizes
    return found


def _live_ops(graph):
    """Names of the ops `graph`'s outputs depend on: TensorFlow prunes the rest (e.g. the
    gradient of a first convolution with respect to the model's input)."""
    live, todo = set(), [t.op for t in graph.outputs]
    while todo:
        op = todo.pop()
        if op.name not in live:
            live.add(op.name)
            todo += [t.op for t in op.inputs] + list(op.control_inputs)
    return live
