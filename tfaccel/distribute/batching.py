"""The batch arithmetic and file rules of data-parallel training.

`--batch_size` is global: `per_replica_batch_size` splits it over the replicas
(and says which sizes would divide evenly), `scale_learning_rate` is the one
linear-scaling rule, `needs_drop_remainder` keeps every step's batch full,
`with_shard_policy` gives each worker its share of the input, and
`worker_output_dir` keeps every file a run writes on the chief.

Example:

    from tfaccel.distribute import batching

    batching.per_replica_batch_size(64, 2)         # 32
    batching.scale_learning_rate(0.1, 2)           # 0.2
"""

import atexit
import shutil
import tempfile

import tensorflow as tf

from tfaccel.distribute.strategy import is_chief
from tfaccel.errors import ConfigError

__all__ = [
    "per_replica_batch_size", "scale_learning_rate", "needs_drop_remainder",
    "reads_through_file_readers", "shard_policy", "with_shard_policy", "worker_output_dir",
]


def per_replica_batch_size(global_batch_size, num_replicas):
    """The batch each replica sees: `global_batch_size` split evenly over `num_replicas`.

    Raises:
      ConfigError: the global batch does not divide evenly.
    """
    global_batch_size, num_replicas = int(global_batch_size), int(num_replicas)
    if global_batch_size < num_replicas or global_batch_size % num_replicas:
        lower = max(num_replicas, global_batch_size - global_batch_size % num_replicas)
        raise ConfigError(f"batch_size={global_batch_size} is the global batch "
                          "and must be a multiple "
                          f"of the {num_replicas} replicas: use {lower} or {lower + num_replicas}")
    return global_batch_size // num_replicas


def scale_learning_rate(learning_rate, num_replicas):
    """Linear scaling rule: the learning rate times the replica count (Goyal et al., 2017)."""
    return float(learning_rate) * int(num_replicas)


def needs_drop_remainder(strategy):
    """True when training batches must all be full under `strategy`.

    TPUs compile static shapes. With several replicas Keras averages each
    replica's mean loss, so a last partial batch split unevenly (say 32 + 9
    examples) would weigh its examples unequally; dropping it keeps every step
    exactly `global batch = per-replica batch x replicas`.
    """
    tpu = (tf.distribute.TPUStrategy, tf.distribute.experimental.TPUStrategy)
    return isinstance(strategy, tpu) or strategy.num_replicas_in_sync > 1


_READER_OPS = (b"TFRecordDataset", b"TextLineDataset", b"FixedLengthRecordDataset")


def reads_through_file_readers(dataset):
    """True when `dataset` reads files with reader datasets (TFRecord, text lines, fixed length)."""
    # The serialized graph is what tf.data's auto-shard rewrite inspects too.
    graph = dataset._as_serialized_graph().numpy()
    return any(op in graph for op in _READER_OPS)


def shard_policy(dataset, in_memory):
    """The auto-shard policy for `dataset`: DATA for in-memory sources, FILE for file readers.

    FILE sharding gives each worker its own files; TensorFlow can only do that
    when the pipeline reads through a reader dataset, so a file source read
    with `tf.io.read_file` (image folders) falls back to DATA: every worker
    decodes every file and keeps its share of the examples.
    """
    policy = tf.data.experimental.AutoShardPolicy
    if not in_memory and reads_through_file_readers(dataset):
        return policy.FILE
    return policy.DATA


def with_shard_policy(dataset, in_memory, num_workers=1):
    """`dataset` with the auto-shard policy of `shard_policy` set, ready for `fit` under any
    strategy.

    With DATA sharding every worker runs the whole pipeline and keeps every
    N-th batch, so all workers must produce the same order: with several
    workers this also turns on `deterministic` (a non-deterministic parallel
    map or batch would make workers skip some examples and repeat others).

    Args:
      dataset: a batched dataset.
      in_memory: True for in-memory sources (`DatasetInfo.in_memory`).
      num_workers: worker processes training together (`num_workers(strategy)`).
    """
    options = tf.data.Options()
    policy = shard_policy(dataset, in_memory)
    options.experimental_distribute.auto_shard_policy = policy
    if num_workers > 1 and policy == tf.data.experimental.AutoShardPolicy.DATA:
        options.deterministic = True
    return dataset.with_options(options)


def worker_output_dir(model_dir, strategy):
    """Where this process writes: `model_dir` on the chief, a fresh temporary directory elsewhere.

    Every worker runs the same code (saving and evaluating need all of them for
    the collectives), but only the chief's files are kept: another worker's
    directory is removed when the process exits, after an error too (not after
    SIGKILL; it lives in the system's temporary folder).

    Returns:
      The directory to write logs, exports and reports to.
    """
    if is_chief(strategy):
        return model_dir
    resolver = strategy.cluster_resolver
    tmp = tempfile.mkdtemp(prefix=f"tfaccel-{resolver.task_type}{resolver.task_id}-")
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    return tmp
