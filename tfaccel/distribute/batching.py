"""The batch arithmetic and file rules of data-parallel training.

`--batch_size` is global: `per_replica_batch_size` splits it over the replicas
(and says which sizes would divide evenly), `scale_learning_rate` is the one
linear-scaling rule, `needs_drop_remainder` keeps every step's batch full,
`shard_policy` is the one decision of how workers share the input (applied by
`with_shard_policy`; `tfaccel.data.PipelineConfig.shard_policy` forces one by
name), and `worker_output_dir` keeps every file a run writes on the chief.

Example:

    from tfaccel.distribute import batching

    batching.per_replica_batch_size(64, 2)                      # 32
    batching.scale_learning_rate(0.1, 512)                      # 0.2: tuned for 256 per step
    batching.scale_learning_rate(0.1, 2, base_batch_size=1)     # 0.2: x replicas (--scale_lr)
"""

import atexit
import shutil
import tempfile

import tensorflow as tf

from tfaccel import _compat
from tfaccel.distribute.strategy import is_chief
from tfaccel.errors import ConfigError

__all__ = [
    "per_replica_batch_size", "scale_learning_rate", "needs_drop_remainder", "SHARD_POLICIES",
    "check_shard_policy", "reads_through_file_readers", "shard_policy", "with_shard_policy",
    "worker_output_dir",
]

SHARD_POLICIES = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}
"""tf.data's auto-shard policies by the names a user may force one with."""


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


def scale_learning_rate(learning_rate, global_batch_size, base_batch_size=256):
    """The linear scaling rule (Goyal et al. 2017): ``lr * global_batch_size / base_batch_size``.

    A rate tuned for steps of `base_batch_size` examples, scaled to steps of
    `global_batch_size` (the batch summed over all replicas). The train
    recipe's ``--scale_lr`` takes ``--learning_rate`` as tuned for one
    replica's batch, so it counts in per-replica batches: ``lr x replicas``,
    whatever the per-replica batch (``scale_learning_rate(lr, replicas,
    base_batch_size=1)``).

    Args:
      learning_rate: the rate tuned for `base_batch_size`.
      global_batch_size: the batch summed over all replicas.
      base_batch_size: the batch size `learning_rate` was tuned for.

    Returns:
      The scaled learning rate (float).

    Raises:
      ConfigError: a batch size is not positive.
    """
    if global_batch_size <= 0 or base_batch_size <= 0:
        raise ConfigError(f"batch sizes must be positive: global_batch_size={global_batch_size}, "
                          f"base_batch_size={base_batch_size}")
    return float(learning_rate) * global_batch_size / base_batch_size


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


def check_shard_policy(name):
    """Returns `name` when it names one of `SHARD_POLICIES`.

    Raises:
      ConfigError: any other name.
    """
    if not isinstance(name, str) or name not in SHARD_POLICIES:
        raise ConfigError(f"shard_policy={name!r}: use one of {', '.join(SHARD_POLICIES)}")
    return name


def reads_through_file_readers(dataset):
    """True when `dataset` reads files with reader datasets (TFRecord, text lines, fixed length)."""
    graph = _compat.serialized_dataset_graph(dataset)
    return any(op in graph for op in _READER_OPS)


def shard_policy(dataset, in_memory, policy=None):
    """The auto-shard policy for `dataset`: DATA for in-memory sources, FILE for file readers.

    FILE sharding gives each worker its own files; TensorFlow can only do that
    when the pipeline reads through a reader dataset, so a file source read
    with `tf.io.read_file` (image folders) falls back to DATA: every worker
    decodes every file and keeps its share of the examples.

    Args:
      dataset: the dataset to shard.
      in_memory: True for in-memory sources (`DatasetInfo.in_memory`).
      policy: a name of `SHARD_POLICIES` to force instead (e.g.
        `PipelineConfig.shard_policy`), or None for the rule above.

    Returns:
      A `tf.data.experimental.AutoShardPolicy`.

    Raises:
      ConfigError: `policy` names no policy.
    """
    if policy is not None:
        return SHARD_POLICIES[check_shard_policy(policy)]
    if not in_memory and reads_through_file_readers(dataset):
        return SHARD_POLICIES["file"]
    return SHARD_POLICIES["data"]


def with_shard_policy(dataset, in_memory, num_workers=1, policy=None):
    """`dataset` with its auto-shard policy (`shard_policy`) set, ready for `fit` under any
    strategy.

    With DATA sharding every worker runs the whole pipeline and keeps every
    N-th batch, so all workers must produce the same order: with several
    workers this also turns on `deterministic` (a non-deterministic parallel
    map or batch would make workers skip some examples and repeat others).

    Args:
      dataset: a batched dataset.
      in_memory: True for in-memory sources (`DatasetInfo.in_memory`).
      num_workers: worker processes training together (`num_workers(strategy)`).
      policy: a name of `SHARD_POLICIES` to force, or None: the policy already forced on
        `dataset` (`PipelineConfig(shard_policy=...)`), else `shard_policy`'s rule.
    """
    options = tf.data.Options()
    forced = dataset.options().experimental_distribute.auto_shard_policy
    if policy is None and forced != tf.data.experimental.AutoShardPolicy.AUTO:
        chosen = forced
    else:
        chosen = shard_policy(dataset, in_memory, policy)
    options.experimental_distribute.auto_shard_policy = chosen
    if num_workers > 1 and chosen == SHARD_POLICIES["data"]:
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
