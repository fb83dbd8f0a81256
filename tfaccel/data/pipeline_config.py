"""What a pipeline is asked to do: `PipelineConfig`, checked when it is made, and its options.

`PipelineConfig` holds every setting of `build_pipeline` (batching, caching,
shuffling, augmentation, parallelism) and refuses a bad one with one line
before any data is read; `pipeline_options` gives the `tf.data.Options` it
asks for. A `shard_policy` forces tf.data's auto-shard policy by name; left
out, `tfaccel.distribute.with_shard_policy` applies the one rule
(`auto_shard_policy` names what it picks for a dataset).

Example:

    from tfaccel.data import PipelineConfig

    config = PipelineConfig(batch_size=64, random_flip=True, cache="memory")
    PipelineConfig(batch_size=0)   # ConfigError: batch_size=0 must be a positive integer, e.g. 64
"""

import dataclasses
import numbers

import tensorflow as tf

from tfaccel.choices import ON_BAD_EXAMPLE, check_cache
from tfaccel.distribute import batching
from tfaccel.errors import ConfigError


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
      shard_policy: 'auto', 'data', 'file' or 'off' (`tfaccel.distribute.SHARD_POLICIES`)
        to force tf.data's auto-shard policy, or None to leave it (TensorFlow's own default,
        until `tfaccel.distribute.with_shard_policy` applies the rule; `auto_shard_policy`
        names what that rule picks).
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
        for name, example in (("batch_size", 64), ("shuffle_buffer", 10_000)):
            value = getattr(self, name)
            if name == "shuffle_buffer" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer, e.g. {example}")
        check_cache(self.cache)
        if self.shard_policy is not None:
            batching.check_shard_policy(self.shard_policy)
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
        forced = batching.SHARD_POLICIES[config.shard_policy]
        options.experimental_distribute.auto_shard_policy = forced
    return options


def auto_shard_policy(dataset, info):
    """The name of the auto-shard policy `tfaccel.distribute.with_shard_policy` gives `dataset`.

    'data' for in-memory sources and for files read with `tf.io.read_file`
    (image folders), 'file' for pipelines that read through file readers
    (TFRecord): `tfaccel.distribute.batching.shard_policy` decides, and this
    names its choice as `PipelineConfig.shard_policy` takes it.

    Args:
      dataset: the dataset to be sharded (its graph shows how it reads).
      info: the `DatasetInfo` of its source.
    """
    policy = batching.shard_policy(dataset, info.in_memory)
    return next(name for name, value in batching.SHARD_POLICIES.items() if value == policy)
