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
   auto-shard policy (DATA for in-memory sources, FILE for files).

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

from tfaccel.choices import CACHE_MODES, ON_BAD_EXAMPLE
from tfaccel.data import augment
from tfaccel.errors import ConfigError

log = logging.getLogger("tfaccel")

SHARD_POLICIES = {
    "auto": tf.data.experimental.AutoShardPolicy.AUTO,
    "data": tf.data.experimental.AutoShardPolicy.DATA,
    "file": tf.data.experimental.AutoShardPolicy.FILE,
    "off": tf.data.experimental.AutoShardPolicy.OFF,
}


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """How `build_pipeline` turns unbatched examples into batches.

    Args:
      batch_size: global batch size (over all replicas).
      image_size: (height, width) to resize to; needed when images are encoded bytes.
      channels: channels to decode encoded images to.
      central_crop: fraction of height and width kept (deterministic, before the cache).
      random_crop: (height, width) random window in training; the central window of that
        size in evaluation.
      random_flip: random left-right flips in training.
      rescale: (scale, offset): ``x * scale + offset``.
      normalize_mean, normalize_std: per-channel ``(x - mean) / std``.
      standardize: per-image standardization (zero mean, unit variance).
      one_hot: one-hot labels (needs `num_classes` here or in the `info` given).
      num_classes: classes for one-hot and mixup.
      mixup_alpha: > 0 enables mixup in training (implies one-hot labels, in evaluation too).
      cache: 'auto' (memory when it fits `cache_budget_mb`), 'memory', 'none', or a file
        path prefix for an on-disk cache.
      cache_budget_mb: largest dataset 'auto' caches in memory.
      shuffle_buffer: examples in the shuffle buffer; None sizes it to `shuffle_budget_mb`
        (and at most the dataset).
      shuffle_budget_mb: RAM the automatic shuffle buffer may use.
      drop_remainder: drop the last partial batch (strategies that need static shapes).
      deterministic: keep element order through parallel stages (slower); off by default.
      num_parallel_calls: parallelism of maps and batching; AUTOTUNE by default.
      private_threadpool_size: tf.data's own thread pool size (0 = TF's default).
      max_intra_op_parallelism: threads one op of the pipeline may use; 1 by default, because
        the parallelism comes from running many elements at once (with TF's default, each
        resize is split over all cores too, and the two levels fight for the same cores).
        0 = TF's default.
      autotune: run tf.data's autotune thread, which retunes each stage's parallelism and
        buffers while the pipeline runs. Off by default: every ``AUTOTUNE`` stage then runs
        min(16, cores) calls (autotune's own starting point), and in TF 2.21 the autotune
        thread often stalls the end of each pass: destroying an iterator waits out the
        thread's current sleep, up to ~1.3 s per epoch (measured on 2 cores, where it
        halved the images/s of a 2,000-image epoch; see benchmarks/bench_data.py).
        Turn it on for long epochs on many cores, where its tuning can pay off.
      ram_budget_mb: autotune's RAM budget (None = TF's default, half the RAM); needs
        ``autotune=True``.
      shard_policy: 'auto', 'data', 'file', 'off', or None to leave TensorFlow's default;
        see `auto_shard_policy`.
      on_bad_example: 'fail' (an undecodable example stops the run) or 'skip' (dropped).
    """

    batch_size: int = 64
    image_size: tuple | None = None
    channels: int = 3
    central_crop: float | None = None
    random_crop: tuple | None = None
    random_flip: bool = False
    rescale: tuple | None = None
    normalize_mean: tuple | None = None
    normalize_std: tuple | None = None
    standardize: bool = False
    one_hot: bool = False
    num_classes: int | None = None
    mixup_alpha: float = 0.0
    cache: str = "auto"
    cache_budget_mb: float = 2048
    shuffle_buffer: int | None = None
    shuffle_budget_mb: float = 256
    drop_remainder: bool = False
    deterministic: bool = False
    num_parallel_calls: int = tf.data.AUTOTUNE
    private_threadpool_size: int = 0
    max_intra_op_parallelism: int = 1
    autotune: bool = False
    ram_budget_mb: float | None = None
    shard_policy: str | None = None
    on_bad_example: str = "fail"

    def __post_init__(self):
        if self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} must be at least 1")
        if self.cache not in CACHE_MODES and not str(self.cache).strip():
            raise ConfigError(f"cache={self.cache!r}: use one of {', '.join(CACHE_MODES)} "
                              "or a file path prefix")
        if self.cache not in CACHE_MODES:
            _check_cache_folder(self.cache)
        if self.shard_policy is not None and self.shard_policy not in SHARD_POLICIES:
            raise ConfigError(f"shard_policy={self.shard_policy!r}: use one of "
                              f"{', '.join(SHARD_POLICIES)}")
        if self.on_bad_example not in ON_BAD_EXAMPLE:
            raise ConfigError(f"on_bad_example={self.on_bad_example!r}: use skip or fail")
        if self.central_crop is not None and not 0.0 < self.central_crop <= 1.0:
            raise ConfigError(f"central_crop={self.central_crop} must be a fraction in (0, 1]")
        if (self.normalize_mean is None) != (self.normalize_std is None):
            raise ConfigError("normalize needs both normalize_mean and normalize_std")
        if self.normalize_std is not None and (
                len(self.normalize_std) != len(self.normalize_mean)
                or min(self.normalize_std) <= 0):
            raise ConfigError(f"normalize_mean={self.normalize_mean} and normalize_std="
                              f"{self.normalize_std} must have one value per channel, std > 0")
        if self.mixup_alpha < 0:
            raise ConfigError(f"mixup_alpha={self.mixup_alpha} must be >= 0 (0 turns it off)")
        if self.ram_budget_mb is not None and not self.autotune:
            raise ConfigError(f"ram_budget_mb={self.ram_budget_mb} is autotune's RAM budget: set "
                              "autotune=True too, or drop ram_budget_mb")
        if self.shuffle_buffer is not None and self.shuffle_buffer < 1:
            raise ConfigError(f"shuffle_buffer={self.shuffle_buffer} must be at least 1")


def _check_cache_folder(prefix):
    """tf.data writes a file cache as `prefix`.* files: their folder must exist and be writable
    before the first epoch, or the run stops mid-training with files left behind."""
    import os

    from tfaccel.io import cannot_write

    folder = os.path.dirname(os.path.abspath(prefix))
    fix = ("pass a prefix in an existing folder you can write to (e.g. --cache=/tmp/train_cache), "
           "or --cache=memory")
    if os.path.isdir(prefix):
        raise ConfigError(f"cache={prefix!r} is a folder: the cache is a file name prefix, e.g. "
                          f"{os.path.join(prefix, 'train')!r}")
    if not os.path.isdir(folder):
        raise ConfigError(f"cache={prefix!r}: folder {folder} does not exist: {fix}")
    if why := cannot_write(folder):
        raise ConfigError(f"cache={prefix!r}: cannot write to {folder} ({why}): {fix}")


def steps_per_epoch(num_examples, batch_size, drop_remainder=False):
    """Batches (optimizer steps without gradient accumulation) in one epoch."""
    return max(1, num_examples // batch_size if drop_remainder else -(-num_examples // batch_size))


def auto_shard_policy(info):
    """'data' for in-memory sources, 'file' for sources read from files (`DatasetInfo.in_memory`).
    """
    return "data" if info.in_memory else "file"


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
    images_spec = dataset.element_spec[0]
    encoded = images_spec.dtype == tf.string
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
    if encoded or size or (c.central_crop or 1.0) < 1.0 or (crop and not training) or (
            vectors_before_cache and has_vector_ops):
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

    if (training and (c.random_flip or c.mixup_alpha > 0)) or want_one_hot or (
            has_vector_ops and not vectors_before_cache):
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


def pipeline_options(config):
    """The `tf.data.Options` a `PipelineConfig` asks for."""
    options = tf.data.Options()
    options.deterministic = bool(config.deterministic)
    # Fuse consecutive parallel maps (a source's decode and the builder's per-example map).
    options.experimental_optimization.map_fusion = True
    if config.private_threadpool_size:
        options.threading.private_threadpool_size = int(config.private_threadpool_size)
    if config.max_intra_op_parallelism:
        options.threading.max_intra_op_parallelism = int(config.max_intra_op_parallelism)
    options.autotune.enabled = bool(config.autotune)
    if config.ram_budget_mb:
        options.autotune.ram_budget = int(config.ram_budget_mb * 2**20)
    if config.shard_policy is not None:
        options.experimental_distribute.auto_shard_policy = SHARD_POLICIES[config.shard_policy]
    return options


def build_splits(splits, config=PipelineConfig(), *, seed=None, epoch=None):
    """Train (shuffled, augmented), validation and test pipelines of a `Splits`.

    Returns:
      ``(train, validation, test)`` batched datasets.
    """
    info = splits.info
    count = info.num_examples
    # Evaluation keeps its last partial batch: dropping it would score fewer examples.
    evaluation = dataclasses.replace(config, drop_remainder=False)
    return (build_pipeline(splits.train, config, training=True, info=info,
                           num_examples=count.get("train"), seed=seed, epoch=epoch),
            build_pipeline(splits.validation, evaluation, training=False, info=info,
                           num_examples=count.get("validation")),
            build_pipeline(splits.test, evaluation, training=False, info=info,
                           num_examples=count.get("test")))
