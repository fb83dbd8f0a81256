"""The input-pipeline builder: unbatched examples in, fast batches for `fit` out.

`build_pipeline` takes an unbatched dataset of ``(image, label)`` (any
`tfaccel.data` source, or your own; images may be float tensors or encoded
JPEG/PNG bytes) and adds, in this order, what is known to matter for speed:

1. one parallel ``map`` (``num_parallel_calls=AUTOTUNE``) of the deterministic
   per-example work: decode, resize, central crop, and, when training with a cache
   and no random crop, rescale / normalize / standardize (so cached epochs skip them);
2. ``ignore_errors`` when ``on_bad_example="skip"`` (undecodable examples dropped);
3. in training, the cache (memory or file), before anything random, when it fits
   the budget (evaluation pipelines cache their finished batches instead, at the end);
4. shuffle (training) with a buffer sized to a RAM budget;
5. random crop (training, per example, parallel);
6. ``batch`` (parallel copy; ``drop_remainder`` for strategies that need it), then one
   vectorized map over whole batches: random flip, rescale / normalize / standardize if
   not done before the cache, one-hot, mixup;
7. ``prefetch(AUTOTUNE)`` and the options: ``deterministic`` off unless asked, threading
   (one intra-op thread per element: the parallelism is across elements), tf.data's
   autotune thread off unless asked (see `PipelineConfig.autotune`), autotune RAM budget,
   and the auto-shard policy when `PipelineConfig.shard_policy` forces one (else
   `tfaccel.distribute.with_shard_policy` sets it: DATA for in-memory sources, FILE
   for file readers).

`batch_dataset` is the same builder with nothing to do but shuffle, batch and prefetch.

Decoding images in parallel also needs the host allocator to keep up: call
`tfaccel.performance.memory.use_pooled_host_allocator()` at the start of the program (the
recipes do). On 2 cores it took the builder from 1.3x to 1.6x a serial
pipeline (benchmarks/bench_data.py).

Example:

    from tfaccel.data import PipelineConfig, build_pipeline, load_dataset

    splits = load_dataset("digits")
    config = PipelineConfig(batch_size=64, random_flip=False, standardize=True)
    train = build_pipeline(splits.train, config, training=True, info=splits.info)
    test = build_pipeline(splits.test, config, training=False, info=splits.info)
"""

import dataclasses
import logging

import numpy as np
import tensorflow as tf

from tfaccel.choices import CACHE_MODES
from tfaccel.data import augment
from tfaccel.data.pipeline_config import PipelineConfig, pipeline_options
from tfaccel.errors import ConfigError

log = logging.getLogger("tfaccel")


def steps_per_epoch(num_examples, batch_size, drop_remainder=False):
    """Batches (optimizer steps without gradient accumulation) in one epoch."""
    return max(1, num_examples // batch_size if drop_remainder else -(-num_examples // batch_size))


def _element_bytes(spec):
    sizes = [int(np.prod([d or 1 for d in s.shape])) * s.dtype.size
             for s in tf.nest.flatten(spec) if s.dtype != tf.string]
    return max(1, sum(sizes))


def _num_examples(dataset, num_examples):
    if num_examples is not None:
        return int(num_examples)
    n = int(dataset.cardinality())
    return n if n >= 0 else None


def build_pipeline(dataset, config=PipelineConfig(), *, training, info=None, num_examples=None,
                   seed=None, epoch=None):
    """Batches an unbatched ``(image, label)`` dataset with the performance settings done right.

    Args:
      dataset: unbatched `tf.data.Dataset` of ``(image, label)``.
      config: a `PipelineConfig`.
      training: shuffle and augment (True) or keep examples as they are (False).
      info: optional `DatasetInfo` (gives `num_classes`).
      num_examples: size of `dataset` when its cardinality is unknown (sizes the cache and
        shuffle buffer); without it, 'auto' does not cache a dataset of unknown size.
      seed: shuffle seed.
      epoch: optional int64 `tf.Variable` holding the epoch being trained (from 0), e.g.
        `tfaccel.train.resume.EpochCounter().epoch`. With a `seed`, epoch k is then shuffled
        with seeds made of (seed, k) alone, so it sees the same order whether or not
        the process restarted (a resumed run otherwise replays epoch 1's order).

    Returns:
      A batched, prefetched `tf.data.Dataset`.

    Raises:
      ConfigError: settings that do not fit the data (encoded images without image_size,
        a crop larger than the image, one-hot without the number of classes).
    """
    c = config
    parallel = c.num_parallel_calls
    spec = dataset.element_spec
    pairs = isinstance(spec, tuple) and len(spec) == 2  # the image steps need (image, label)
    encoded = pairs and getattr(spec[0], "dtype", None) == tf.string
    if encoded and c.image_size is None:
        raise ConfigError("the dataset holds encoded images: set image_size=(height, width) "
                          "to decode them")
    size = tuple(int(s) for s in c.image_size) if c.image_size else None
    num_classes = c.num_classes or (info.num_classes if info is not None else None)
    want_one_hot = c.one_hot or c.mixup_alpha > 0  # evaluation too: the same loss must fit
    if want_one_hot and not num_classes:
        raise ConfigError("one-hot labels and mixup need num_classes (set it or pass info=)")
    n = _num_examples(dataset, num_examples)
    crop = tuple(int(s) for s in c.random_crop) if c.random_crop else None

    def vector_ops(x):
        if c.rescale is not None:
            x = augment.rescale(x, *c.rescale)
        if c.normalize_mean is not None:
            x = augment.normalize(x, c.normalize_mean, c.normalize_std)
        if c.standardize:
            x = augment.standardize(x)
        return x

    cache_wanted = c.cache != "none"
    # Training caches examples (then shuffles); evaluation caches finished batches.
    vectors_before_cache = training and cache_wanted and not crop

    def per_example(x, y):
        if encoded:
            x = augment.decode(x, size, c.channels)
        elif size is not None:
            x = augment.resize(x, size)
        if c.central_crop is not None and c.central_crop < 1.0:
            x = augment.central_crop(x, c.central_crop)
        if crop and not training:
            x = augment.center_crop_to(x, crop)
        if vectors_before_cache:
            x = vector_ops(x)
        return x, y

    has_vector_ops = c.rescale is not None or c.normalize_mean is not None or c.standardize
    example_steps = encoded or size or (c.central_crop or 1.0) < 1.0 or (
        crop and not training) or (vectors_before_cache and has_vector_ops)
    batch_steps = (training and (c.random_flip or c.mixup_alpha > 0)) or want_one_hot or (
        has_vector_ops and not vectors_before_cache)
    if not pairs and (example_steps or batch_steps or crop):
        raise ConfigError(f"the config asks for image steps (resize, crop, flip, rescale, "
                          f"normalize, standardize, one-hot, mixup), which need (image, label) "
                          f"elements, and the dataset's are {spec}: map it to pairs first, or "
                          "leave those settings out")
    if example_steps:
        dataset = dataset.map(per_example, num_parallel_calls=parallel,
                              deterministic=c.deterministic)
    if crop:
        shape = dataset.element_spec[0].shape
        if shape.rank == 3 and shape[0] is not None and (crop[0] > shape[0] or crop[1] > shape[1]):
            raise ConfigError(f"random_crop={crop} is larger than the images "
                              f"({shape[0]}x{shape[1]})")
    if c.on_bad_example == "skip":
        dataset = dataset.ignore_errors(log_warning=True)

    # Cache what is deterministic, so later epochs skip reading and decoding.
    total = None if n is None else n * _element_bytes(dataset.element_spec)

    def cached(ds):
        if c.cache not in ("auto", "memory", "none"):
            return ds.cache(str(c.cache))
        if cache_wanted:
            if c.cache == "memory" or (total is not None and total <= c.cache_budget_mb * 2**20):
                return ds.cache()
            log.info("not caching: %s examples of this size exceed the %s MB cache budget",
                     n if n is not None else "an unknown number of", c.cache_budget_mb)
        return ds

    if training:
        dataset = cached(dataset)
        buffer = c.shuffle_buffer or max(1, min(
            n or 10_000, 10_000,
            int(c.shuffle_budget_mb * 2**20 // _element_bytes(dataset.element_spec))))
        if epoch is not None and seed is not None:
            dataset = _shuffled_per_epoch(dataset, buffer, seed, epoch)
        else:
            dataset = dataset.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)
        if crop:
            dataset = dataset.map(lambda x, y: (augment.random_crop(x, crop), y),
                                  num_parallel_calls=parallel, deterministic=c.deterministic)

    dataset = dataset.batch(c.batch_size, drop_remainder=c.drop_remainder,
                            num_parallel_calls=parallel, deterministic=c.deterministic)

    def per_batch(x, y):
        if training and c.random_flip:
            x = augment.random_flip(x)
        if not vectors_before_cache:
            x = vector_ops(x)
        if want_one_hot:
            y = augment.one_hot(y, num_classes)
        if training and c.mixup_alpha > 0:
            x, y = augment.mixup(x, y, c.mixup_alpha)
        return x, y

    if batch_steps:
        dataset = dataset.map(per_batch, num_parallel_calls=parallel, deterministic=c.deterministic)
    if not training:
        # later passes (each validation) reuse whole batches; the prefetch keeps the first
        # pass parallel (a cache as the consumer of the parallel stages ran them on one core)
        dataset = cached(dataset.prefetch(tf.data.AUTOTUNE))
    dataset = dataset.prefetch(tf.data.AUTOTUNE)
    return dataset.with_options(pipeline_options(c))


def _shuffled_per_epoch(dataset, buffer, seed, epoch):
    """`dataset` shuffled with seeds (seed, epoch), `epoch` read each time an iteration starts.

    `reshuffle_each_iteration` draws each epoch's seed from a generator that starts
    afresh in every process, so after a restart epoch k would get epoch 1's order.
    """
    cardinality = int(dataset.cardinality())

    def one_epoch(_):
        # This function's own graph seed: shuffle fails on a tensor seed when the graph seed
        # is 0 (TF 2.21 compares the seed pair to (0, 0)), and the order then depends on the
        # seed and epoch only.
        tf.random.set_seed(seed % (2**31 - 2) + 1)
        return dataset.shuffle(buffer, seed=tf.cast(epoch, tf.int64),
                               reshuffle_each_iteration=False)

    shuffled = tf.data.Dataset.from_tensors(0).flat_map(one_epoch)
    if cardinality >= 0:  # flat_map hides it; Keras needs it to count steps
        shuffled = shuffled.apply(tf.data.experimental.assert_cardinality(cardinality))
    return shuffled


def build_splits(splits, config=PipelineConfig(), *, seed=None, epoch=None):
    """Train (shuffled, augmented), validation and test pipelines of a `Splits`.

    A file cache (`config.cache` a path prefix) is kept per split, as
    ``<prefix>-train``, ``<prefix>-validation`` and ``<prefix>-test``.

    Returns:
      ``(train, validation, test)`` batched datasets.
    """
    info = splits.info
    count = info.num_examples

    def config_of(split):
        # Evaluation keeps its last partial batch: dropping it would score fewer examples.
        changes = {} if split == "train" else {"drop_remainder": False}
        if config.cache not in CACHE_MODES:  # a file prefix: one cache per split
            changes["cache"] = f"{config.cache}-{split}"
        return dataclasses.replace(config, **changes)

    return (build_pipeline(splits.train, config_of("train"), training=True, info=info,
                           num_examples=count.get("train"), seed=seed, epoch=epoch),
            build_pipeline(splits.validation, config_of("validation"), training=False,
                           info=info, num_examples=count.get("validation")),
            build_pipeline(splits.test, config_of("test"), training=False, info=info,
                           num_examples=count.get("test")))


def batch_dataset(ds, batch_size, *, training, seed=0, drop_remainder=False, shuffle_buffer=10_000):
    """Shuffles (training only), batches and prefetches an unbatched dataset.

    `build_pipeline` with nothing else to do: elements may be anything, not
    only ``(image, label)``; evaluation keeps their order and training takes
    that of ``ds.shuffle(shuffle_buffer, seed)``. Nothing is cached, and
    tf.data's own defaults for its runtime are kept (autotune thread on, ops
    free to use every core), as for any hand-written pipeline.

    Raises:
      ConfigError: `batch_size` or (in training) `shuffle_buffer` is not a positive integer.
    """
    config = PipelineConfig(batch_size=batch_size, drop_remainder=drop_remainder, cache="none",
                            shuffle_buffer=shuffle_buffer if training else None,
                            deterministic=True, autotune=True, max_intra_op_parallelism=0)
    return build_pipeline(ds, config, training=training, seed=seed)
