"""tfaccel.data.pipeline_config: a bad setting is one line, the options a config asks for, and
the shard policy a config forces or the one rule picks."""

import numpy as np
import pytest
import tensorflow as tf

from tfaccel.data import (
    DatasetInfo,
    PipelineConfig,
    auto_shard_policy,
    build_pipeline,
    load_image_dir,
    load_tfrecord,
    pipeline_options,
    write_image_tfrecords,
)
from tfaccel.distribute import batching
from tfaccel.errors import ConfigError

POLICY = tf.data.experimental.AutoShardPolicy


@pytest.mark.parametrize("bad, message", [
    ({"batch_size": 0}, "batch_size=0 must be a positive integer, e.g. 64"),
    ({"batch_size": 2.5}, "batch_size=2.5 must be a positive integer"),
    ({"batch_size": True}, "batch_size=True must be a positive integer"),
    ({"shuffle_buffer": 0}, "shuffle_buffer=0 must be a positive integer, e.g. 10000"),
    ({"shard_policy": "rows"}, "shard_policy='rows': use one of auto, data, file, off"),
    ({"on_bad_example": "ignore"}, "use skip or fail"),
    ({"central_crop": 1.5}, "central_crop=1.5"),
    ({"normalize_mean": (0.5,)}, "needs both"),
    ({"normalize_mean": (0.5,), "normalize_std": (0.0,)}, "std > 0"),
])
def test_bad_config_is_one_clear_line(bad, message):
    with pytest.raises(ConfigError, match=message) as err:
        PipelineConfig(**bad)
    assert "\n" not in str(err.value)


def test_numpy_integers_are_sizes_too():
    config = PipelineConfig(batch_size=np.int64(8), shuffle_buffer=np.int32(100))
    assert (config.batch_size, config.shuffle_buffer) == (8, 100)


@pytest.mark.parametrize("name", sorted(batching.SHARD_POLICIES))
def test_a_forced_shard_policy_reaches_the_pipeline(name):
    config = PipelineConfig(batch_size=4, shard_policy=name)
    expected = batching.SHARD_POLICIES[name]
    assert pipeline_options(config).experimental_distribute.auto_shard_policy == expected
    ds = tf.data.Dataset.from_tensor_slices((np.zeros((8, 2, 2, 1), np.float32), np.arange(8)))
    out = build_pipeline(ds, config, training=False)
    assert out.options().experimental_distribute.auto_shard_policy == expected
    # Left out, the pipeline keeps TensorFlow's default until with_shard_policy decides.
    unforced = build_pipeline(ds, PipelineConfig(batch_size=4), training=False)
    assert unforced.options().experimental_distribute.auto_shard_policy == POLICY.AUTO


def test_auto_shard_policy_names_what_with_shard_policy_picks(tmp_path):
    images = np.random.default_rng(0).integers(0, 255, (12, 8, 8, 3), dtype=np.uint8)
    write_image_tfrecords(str(tmp_path / "recs" / "train"), images, np.arange(12) % 2)
    records = load_tfrecord(str(tmp_path / "recs"), image_size=(8, 8))
    for i, image in enumerate(images):  # the same images as a folder of class subfolders
        (tmp_path / "imgs" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        tf.io.write_file(str(tmp_path / "imgs" / f"c{i % 2}" / f"{i}.png"),
                         tf.io.encode_png(image))
    folder = load_image_dir(str(tmp_path / "imgs"), image_size=(8, 8))
    memory = tf.data.Dataset.from_tensor_slices((np.zeros((4, 8, 8, 3), np.float32),
                                                 np.arange(4)))
    in_memory = DatasetInfo("m", (8, 8, 3), 4, tuple("abcd"), {"train": 4})
    cases = [(records.train, records.info, "file"),  # read through TFRecord readers
             (folder.train, folder.info, "data"),    # files, but read with tf.io.read_file
             (memory, in_memory, "data")]
    for dataset, info, name in cases:
        assert auto_shard_policy(dataset, info) == name
        picked = batching.with_shard_policy(dataset, info.in_memory).options()
        assert picked.experimental_distribute.auto_shard_policy == batching.SHARD_POLICIES[name]
