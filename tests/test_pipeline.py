"""tfaccel.data.pipeline: what each preprocessing step does, where the cache sits, options,
strategies, and batch_dataset (tests/test_pipeline_config.py checks the config itself)."""

import io

import numpy as np
import pytest
import tensorflow as tf

from tfaccel.data import (
    DatasetInfo,
    PipelineConfig,
    batch_dataset,
    build_pipeline,
    build_splits,
    from_arrays,
    load_digits,
    steps_per_epoch,
)
from tfaccel.errors import ConfigError


def images_dataset(n=12, size=8, channels=3, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.random((n, size, size, channels)).astype("float32")
    y = np.arange(n) % 3
    return tf.data.Dataset.from_tensor_slices((x, y)), x, y


def counting(ds):
    """`ds` with a counter of how many examples its source produced (a Python side effect)."""
    counter = {"n": 0}

    def bump(x):
        counter["n"] += 1
        return x

    mapped = ds.map(lambda x, y: (tf.ensure_shape(tf.numpy_function(bump, [x], tf.float32),
                                                  x.shape), y))
    return mapped, counter


def collect(ds):
    xs, ys = zip(*[(x.numpy(), y.numpy()) for x, y in ds])
    return np.concatenate(xs), np.concatenate(ys)


def test_evaluation_pipeline_keeps_every_example_in_order_when_deterministic():
    ds, x, y = images_dataset(10)
    out = build_pipeline(ds, PipelineConfig(batch_size=4, deterministic=True), training=False)
    got_x, got_y = collect(out)
    np.testing.assert_array_equal(got_x, x)
    np.testing.assert_array_equal(got_y, y)
    assert [int(b[0].shape[0]) for b in out] == [4, 4, 2]


def test_training_shuffles_every_epoch_and_keeps_pairs():
    ds, x, y = images_dataset(12)
    out = build_pipeline(ds, PipelineConfig(batch_size=12), training=True, seed=3)
    (x1, y1), (x2, y2) = collect(out), collect(out)
    assert not np.array_equal(y1, y2) or not np.array_equal(x1, x2)
    for xs, ys in ((x1, y1), (x2, y2)):
        index = [int(np.flatnonzero((x == row).all(axis=(1, 2, 3)))[0]) for row in xs]
        np.testing.assert_array_equal(ys, y[index])
        assert sorted(index) == list(range(12))


def test_standardize_normalize_rescale_values():
    ds, x, _ = images_dataset(6)
    got, _ = collect(build_pipeline(ds, PipelineConfig(batch_size=6, standardize=True,
                                                       deterministic=True),
                                    training=False))
    np.testing.assert_allclose(got.mean(axis=(1, 2, 3)), 0, atol=1e-5)
    np.testing.assert_allclose(got.std(axis=(1, 2, 3)), 1, atol=1e-3)
    config = PipelineConfig(batch_size=6, rescale=(2.0, -1.0), normalize_mean=(0.1, 0.2, 0.3),
                            normalize_std=(2.0, 4.0, 5.0), deterministic=True)
    got, _ = collect(build_pipeline(ds, config, training=False))
    np.testing.assert_allclose(got, ((x * 2 - 1) - [0.1, 0.2, 0.3]) / [2.0, 4.0, 5.0],
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cache", ["auto", "none"])
def test_vector_ops_run_before_the_cache_or_on_batches_with_the_same_result(cache):
    ds, x, _ = images_dataset(6)
    config = PipelineConfig(batch_size=3, standardize=True, cache=cache, deterministic=True)
    got, _ = collect(build_pipeline(ds, config, training=False))
    np.testing.assert_allclose(got, tf.image.per_image_standardization(x).numpy(), atol=1e-4)


def test_cache_sits_before_random_augmentation():
    ds, x, _ = images_dataset(8)
    ds, counter = counting(ds)
    out = build_pipeline(ds, PipelineConfig(batch_size=8, random_flip=True, cache="memory"),
                         training=True, seed=0)
    epochs = [collect(out)[0] for _ in range(4)]
    assert counter["n"] == 8  # the source ran once: later epochs came from the cache
    flips = []
    for epoch in epochs:  # every image is an original or its mirror image
        for img in epoch:
            assert any(np.array_equal(img, row) or np.array_equal(img, row[:, ::-1]) for row in x)
        flips.append(sum(not any(np.array_equal(img, row) for row in x) for img in epoch))
    assert 0 < sum(flips) < 32, (f"flips per epoch {flips}: augmentation must stay random after "
                                 "the cache")


def test_auto_cache_respects_its_budget():
    ds, _, _ = images_dataset(8)
    ds, counter = counting(ds)
    out = build_pipeline(ds, PipelineConfig(batch_size=4, cache="auto", cache_budget_mb=1e-6),
                         training=False, num_examples=8)
    collect(out), collect(out)
    assert counter["n"] == 16


def test_file_cache(tmp_path):
    ds, x, _ = images_dataset(6)
    ds, counter = counting(ds)
    out = build_pipeline(ds, PipelineConfig(batch_size=6, cache=str(tmp_path / "cache"),
                                            deterministic=True),
                         training=False)
    first, second = collect(out)[0], collect(out)[0]
    np.testing.assert_array_equal(first, second)
    assert counter["n"] == 6 and any(p.name.startswith("cache") for p in tmp_path.iterdir())


def test_crops_and_resize_shapes():
    ds, x, _ = images_dataset(4, size=10)
    train = build_pipeline(ds, PipelineConfig(batch_size=4, random_crop=(6, 6)), training=True)
    assert train.element_spec[0].shape.as_list()[1:] == [6, 6, 3]
    evaluation = build_pipeline(ds, PipelineConfig(batch_size=4, random_crop=(6, 6),
                                                   deterministic=True),
                                training=False)
    np.testing.assert_array_equal(collect(evaluation)[0], x[:, 2:8, 2:8, :])
    resized = build_pipeline(ds, PipelineConfig(batch_size=4, image_size=(5, 5), central_crop=0.6),
                             training=False)
    assert next(iter(resized))[0].shape == (4, 3, 3, 3)
    with pytest.raises(ConfigError,
                       match=r"random_crop=\(12, 12\) is larger than the images \(10x10\)"):
        build_pipeline(ds, PipelineConfig(random_crop=(12, 12)), training=True)


def test_one_hot_and_mixup():
    ds, _, y = images_dataset(12)
    config = PipelineConfig(batch_size=12, one_hot=True, deterministic=True)
    _, labels = collect(build_pipeline(ds, config, training=False, num_examples=12,
                                       info=DatasetInfo("t", (8, 8, 3), 3, ("a", "b", "c"), {})))
    np.testing.assert_array_equal(labels, np.eye(3)[y])
    mixed = build_pipeline(ds, PipelineConfig(batch_size=12, mixup_alpha=0.4, num_classes=3),
                           training=True)
    images, labels = next(iter(mixed))
    np.testing.assert_allclose(labels.numpy().sum(axis=1), 1.0, rtol=1e-5)
    assert (labels.numpy() > 0).sum() > 12, "mixup should blend some labels"
    evaluation = build_pipeline(ds, PipelineConfig(batch_size=12, mixup_alpha=0.4, num_classes=3,
                                                   deterministic=True), training=False)
    np.testing.assert_array_equal(collect(evaluation)[1], np.eye(3)[y])  # same loss in evaluation
    with pytest.raises(ConfigError, match="need num_classes"):
        build_pipeline(ds, PipelineConfig(one_hot=True), training=False)


def _jpeg(seed):
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (12, 16, 3),
                                                         dtype=np.uint8)).save(buf, "JPEG")
    return buf.getvalue()


@pytest.mark.parametrize("mode", ["skip", "fail"])
def test_encoded_images_are_decoded_and_bad_ones_skipped_or_fatal(mode):
    encoded = [_jpeg(0), b"this is not an image", _jpeg(1)]
    ds = tf.data.Dataset.from_tensor_slices((encoded, [0, 1, 2]))
    with pytest.raises(ConfigError, match="set image_size"):
        build_pipeline(ds, PipelineConfig(), training=False)
    out = build_pipeline(ds, PipelineConfig(batch_size=3, image_size=(8, 8), on_bad_example=mode),
                         training=False)
    if mode == "fail":
        with pytest.raises(tf.errors.InvalidArgumentError, match="Unknown image file format"):
            collect(out)
    else:
        images, labels = collect(out)
        assert images.shape == (2, 8, 8, 3) and sorted(labels) == [0, 2]
        assert 0.0 <= images.min() and images.max() <= 1.0


def test_options_and_static_batches():
    ds, _, _ = images_dataset(10)
    config = PipelineConfig(batch_size=4, drop_remainder=True, shard_policy="data",
                            private_threadpool_size=2, autotune=True, ram_budget_mb=64)
    out = build_pipeline(ds, config, training=True)
    options = out.options()
    assert options.deterministic is False
    assert options.autotune.enabled is True
    assert (options.experimental_distribute.auto_shard_policy
            == tf.data.experimental.AutoShardPolicy.DATA)
    assert options.threading.private_threadpool_size == 2
    assert options.threading.max_intra_op_parallelism == 1  # parallel across elements, not within
    assert options.autotune.ram_budget == 64 * 2**20
    assert out.element_spec[0].shape[0] == 4 and len(list(out)) == 2
    assert steps_per_epoch(10, 4, drop_remainder=True) == 2 and steps_per_epoch(10, 4) == 3


def test_autotune_thread_is_off_by_default_and_the_ram_budget_needs_it():
    ds, _, _ = images_dataset(10)
    out = build_pipeline(ds, PipelineConfig(batch_size=4), training=True)
    assert out.options().autotune.enabled is False
    assert sum(int(x.shape[0]) for x, _ in out) == 10  # AUTOTUNE stages still run, untuned
    with pytest.raises(ConfigError, match="autotune=True"):
        PipelineConfig(ram_budget_mb=64)


def test_build_splits_keeps_partial_evaluation_batches():
    x = np.random.rand(50, 4, 4, 1).astype("float32")
    splits = from_arrays("t", x, np.arange(50) % 2)
    train, val, test = build_splits(splits, PipelineConfig(batch_size=8, drop_remainder=True))
    n = splits.info.num_examples
    assert sum(int(b[0].shape[0]) for b in train) == n["train"] // 8 * 8
    assert sum(int(b[0].shape[0]) for b in test) == n["test"]
    assert sum(int(b[0].shape[0]) for b in val) == n["validation"]


@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_global_batch_is_split_over_replicas(strategy_name):
    strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if strategy_name == "mirrored"
                else tf.distribute.get_strategy())
    ds, _, _ = images_dataset(16)
    out = build_pipeline(ds, PipelineConfig(batch_size=8, drop_remainder=True, shard_policy="data",
                                            random_flip=True, standardize=True), training=True)
    dist = strategy.experimental_distribute_dataset(out)
    batch = next(iter(dist))[0]
    per_replica = strategy.experimental_local_results(batch)
    assert [int(t.shape[0]) for t in per_replica] == [8 // strategy.num_replicas_in_sync] * \
        strategy.num_replicas_in_sync


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True])
def test_batch_dataset_rejects_a_bad_batch_size(batch_size):
    with pytest.raises(ConfigError, match=f"batch_size={batch_size!r} must be a positive integer"):
        batch_dataset(tf.data.Dataset.range(4), batch_size, training=True)
    with pytest.raises(ConfigError, match="shuffle_buffer=0 must be a positive integer"):
        batch_dataset(tf.data.Dataset.range(4), 2, training=True, shuffle_buffer=0)
    assert [b.tolist() for b in batch_dataset(tf.data.Dataset.range(4), 3, training=False,
                                              shuffle_buffer=0).as_numpy_iterator()] \
        == [[0, 1, 2], [3]]  # evaluation never shuffles, so its buffer is not checked


@pytest.mark.parametrize("drop_remainder", [False, True])
def test_batch_dataset_is_shuffle_batch_prefetch_through_the_builder(drop_remainder):
    ds, x, y = images_dataset(10)
    plain = ds.shuffle(6, seed=3, reshuffle_each_iteration=True).batch(
        4, drop_remainder=drop_remainder)
    ours = batch_dataset(ds, 4, training=True, seed=3, shuffle_buffer=6,
                         drop_remainder=drop_remainder)
    for _ in range(2):  # and each epoch reshuffled alike
        (ours_x, ours_y), (plain_x, plain_y) = collect(ours), collect(plain)
        np.testing.assert_array_equal(ours_x, plain_x)
        np.testing.assert_array_equal(ours_y, plain_y)
    assert [int(b[0].shape[0]) for b in ours] == ([4, 4] if drop_remainder else [4, 4, 2])
    np.testing.assert_array_equal(collect(batch_dataset(ds, 4, training=False))[0], x)
    options = ours.options()  # tf.data's own runtime defaults, as for a hand-written pipeline
    assert options.autotune.enabled is True and options.deterministic is True
    assert options.threading.max_intra_op_parallelism is None


def test_image_steps_need_image_label_pairs():
    numbers = tf.data.Dataset.range(6)
    assert [b.tolist() for b in build_pipeline(numbers, PipelineConfig(batch_size=4),
                                               training=False).as_numpy_iterator()] \
        == [[0, 1, 2, 3], [4, 5]]
    for config in (PipelineConfig(standardize=True), PipelineConfig(random_flip=True),
                   PipelineConfig(image_size=(4, 4))):
        with pytest.raises(ConfigError, match=r"need \(image, label\) elements"):
            build_pipeline(numbers, config, training=True)


def test_a_file_cache_is_kept_per_split(tmp_path):
    splits = load_digits()
    prefix = tmp_path / "cache"
    config = PipelineConfig(batch_size=64, cache=str(prefix))
    train, validation, test = build_splits(splits, config, seed=0)
    for ds, split in ((train, "train"), (validation, "validation"), (test, "test")):
        examples = sum(int(x.shape[0]) for x, _ in ds)
        assert examples == splits.info.num_examples[split] or split == "train"
        assert list(tmp_path.glob(f"cache-{split}*")), split
    # A second pass reads each split's own cache back.
    again = sum(int(x.shape[0]) for x, _ in validation)
    assert again == splits.info.num_examples["validation"]
