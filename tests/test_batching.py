"""tfaccel.distribute.batching: the global batch split over replicas, the one linear
learning-rate rule, drop_remainder, the shard policy, and where each worker writes.

MirroredStrategy runs over the two logical CPU devices that conftest.py makes.
"""

import numpy as np
import pytest
import tensorflow as tf

import tfaccel
from tfaccel import distribute
from tfaccel.distribute import batching
from tfaccel.errors import ConfigError
from tfaccel.train import schedules

POLICY = tf.data.experimental.AutoShardPolicy


def test_per_replica_batch_and_drop_remainder():
    assert batching.per_replica_batch_size(64, 2) == 32
    assert batching.per_replica_batch_size(64, 1) == 64
    with pytest.raises(ConfigError, match=r"batch_size=65 .* 2 replicas: use 64 or 66"):
        batching.per_replica_batch_size(65, 2)
    with pytest.raises(ConfigError, match=r"batch_size=3 .* 4 replicas: use 4 or 8"):
        batching.per_replica_batch_size(3, 4)
    assert batching.needs_drop_remainder(distribute.make_strategy("mirrored"))
    assert not batching.needs_drop_remainder(distribute.make_strategy("default"))


def test_linear_scaling_rule_has_one_home():
    assert batching.scale_learning_rate(0.1, 1024) == pytest.approx(0.4)  # base 256
    assert batching.scale_learning_rate(0.1, 64, base_batch_size=32) == pytest.approx(0.2)
    # The train recipe's --scale_lr counts in per-replica batches: exactly lr x replicas.
    for replicas in (1, 2, 3, 8):
        assert batching.scale_learning_rate(0.003, replicas, base_batch_size=1) == 0.003 * replicas
    for bad in ({"global_batch_size": 0}, {"global_batch_size": 64, "base_batch_size": -1}):
        with pytest.raises(ConfigError, match="batch sizes must be positive"):
            batching.scale_learning_rate(0.1, **bad)
    assert tfaccel.scale_learning_rate is batching.scale_learning_rate
    assert not hasattr(schedules, "scale_learning_rate")


def test_distributes_old_scale_learning_rate_keeps_its_meaning_and_warns():
    # 0.1.0's tfaccel.distribute.scale_learning_rate(lr, num_replicas) was lr x replicas.
    with pytest.warns(DeprecationWarning, match="base_batch_size=1"):
        assert distribute.scale_learning_rate(0.1, 4) == pytest.approx(0.4)


def _datasets(tmp_path):
    """An in-memory dataset, one read by a TFRecord reader, and one read with tf.io.read_file."""
    in_memory = tf.data.Dataset.from_tensor_slices(np.zeros((8, 2), np.float32)).batch(4)
    path = str(tmp_path / "a.tfrecord")
    with tf.io.TFRecordWriter(path) as w:
        w.write(b"x")
    records = tf.data.TFRecordDataset([path]).map(tf.strings.length)
    read = tf.data.Dataset.from_tensor_slices([path]).map(tf.io.read_file)
    return in_memory, records, read


def test_shard_policy_data_for_memory_file_for_readers(tmp_path):
    in_memory, records, read = _datasets(tmp_path)
    assert batching.shard_policy(in_memory, in_memory=True) == POLICY.DATA
    assert batching.shard_policy(records, in_memory=False) == POLICY.FILE
    # Files read with tf.io.read_file cannot be FILE-sharded by TensorFlow: DATA instead.
    assert batching.shard_policy(read, in_memory=False) == POLICY.DATA
    options = batching.with_shard_policy(records, in_memory=False).options()
    assert options.experimental_distribute.auto_shard_policy == POLICY.FILE


def test_a_forced_shard_policy_wins_and_a_bad_name_is_one_line(tmp_path):
    _, records, _ = _datasets(tmp_path)
    for name, policy in (("off", POLICY.OFF), ("data", POLICY.DATA), ("auto", POLICY.AUTO)):
        assert batching.shard_policy(records, in_memory=False, policy=name) == policy
        options = batching.with_shard_policy(records, False, policy=name).options()
        assert options.experimental_distribute.auto_shard_policy == policy
    with pytest.raises(ConfigError, match="shard_policy='rows': use one of auto, data, file, off"):
        batching.with_shard_policy(records, False, policy="rows")


def test_data_sharding_on_several_workers_is_deterministic(tmp_path):
    in_memory, records, _ = _datasets(tmp_path)
    # Workers keeping "every N-th batch" must all see the same order.
    assert batching.with_shard_policy(in_memory, True, num_workers=2).options().deterministic
    assert batching.with_shard_policy(records, False, 2, policy="data").options().deterministic
    unordered = in_memory.with_options(_not_deterministic())
    assert unordered.options().deterministic is False
    assert batching.with_shard_policy(unordered, True, num_workers=1).options().deterministic \
        is False
    assert batching.with_shard_policy(records.with_options(_not_deterministic()), False,
                                      num_workers=2).options().deterministic is False  # FILE


def _not_deterministic():
    options = tf.data.Options()
    options.deterministic = False
    return options


def test_worker_output_dir_is_model_dir_on_the_chief(tmp_path):
    assert batching.worker_output_dir(str(tmp_path), distribute.make_strategy("mirrored")) \
        == str(tmp_path)


def test_a_policy_forced_by_the_pipeline_is_kept(tmp_path):
    from tfaccel.data import PipelineConfig, build_pipeline

    in_memory, _, _ = _datasets(tmp_path)
    unbatched = in_memory.unbatch().map(lambda x: (x, tf.constant(0)))
    forced = build_pipeline(unbatched, PipelineConfig(batch_size=4, shard_policy="off"),
                            training=False)
    kept = batching.with_shard_policy(forced, in_memory=True, num_workers=2)
    policy = kept.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.OFF
    # Without a forced policy the rule decides (DATA for in-memory data).
    auto = build_pipeline(unbatched, PipelineConfig(batch_size=4), training=False)
    assert batching.with_shard_policy(auto, True, 2).options().experimental_distribute \
        .auto_shard_policy == tf.data.experimental.AutoShardPolicy.DATA
