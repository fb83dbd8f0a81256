"""The names a flag or an argument may take, and the rules of plain values, TensorFlow-free.

The recipes define their flags from these lists before TensorFlow is imported,
so that a bad flag is reported in a fraction of a second; the modules that act
on a choice (`tfaccel.data`, `tfaccel.train.models`, `tfaccel.distribute`, ...) import
their list from here and re-export it (`tfaccel.DATASETS` is this `DATASETS`).
The `check_*` functions at the end are the rules of plain values those helpers
enforce (`split_cpu` calls `check_cpu_devices`, `make_schedule` `check_schedule`, ...):
the recipes' flag validators call the same functions while the flags are parsed,
so that each rule has one home and a bad flag fails before TensorFlow loads.
Nothing here may import TensorFlow, Keras or NumPy.
"""

import datetime
import numbers
import os
import re

from tfaccel.errors import ConfigError
from tfaccel.io import cannot_write

TEXT_DATASETS = ("text",)
TOKENIZERS = ("char", "byte")
# The language model's named sizes (tfaccel.train.gpt, and the memory planner's
# `--gpt_size`): tiny ~0.8M parameters with a character vocabulary, small ~10.7M (nanoGPT's
# Shakespeare-char model), gpt2 GPT-2 small (~124M with its 50,257 tokens), 13b the 13B
# decoder of Megatron / LLaMA-13B's shape (plan it; it trains only on many large GPUs).
GPT_SIZES = {"tiny": {"layers": 4, "heads": 4, "d_model": 128, "context": 64},
             "small": {"layers": 6, "heads": 6, "d_model": 384, "context": 256},
             "gpt2": {"layers": 12, "heads": 12, "d_model": 768, "context": 1024},
             "13b": {"layers": 40, "heads": 40, "d_model": 5120, "context": 2048}}
DATASETS = ("digits", "synthetic", "image_dir", "npz", "tfrecord", "tfds")
MODELS = ("mlp", "cnn", "resnet", "mobilenet_v2")
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "rmsprop")
STRATEGIES = ("auto", "default", "one_device", "mirrored", "multi_worker", "parameter_server",
              "tpu")
CROSS_DEVICE_OPS = ("auto", "nccl", "hierarchical_copy", "reduce_to_one")
COLLECTIVES = ("auto", "ring", "nccl")
SCHEDULES = ("constant", "step", "piecewise", "exponential", "polynomial", "cosine",
             "cosine_restarts", "one_cycle", "epoch_exponential")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
JIT_CHOICES = ("false", "true", "auto")
ALLOCATORS = ("default", "cuda_malloc_async")
HOST_ALLOCATORS = ("pooled", "malloc")
CACHE_MODES = ("auto", "memory", "none")
ON_BAD_EXAMPLE = ("fail", "skip")
PRUNING_SCHEDULES = ("polynomial", "constant")
# prune_to_sparsity(method=): TF-MOT's wrappers, tfaccel.compress.magnitude's callback, or
# TF-MOT when it can take the model and magnitude otherwise.
PRUNING_METHODS = ("auto", "tfmot", "native")
PRUNING_POLICIES = ("xnnpack",)
BLOCK_POOLINGS = ("AVG", "MAX")
# tfaccel.parallel.pipeline / stages: how a model is split over devices, how stages balance.
PARALLEL_MODES = ("none", "model", "pipeline")
KERAS_FLAVOURS = ("tf_keras", "keras3")  # tfaccel.keras.FLAVOURS
STAGE_BALANCES = ("parameters", "memory")


# --- The rules of plain values: each helper named below calls its check, and so do the
# recipes' flag validators (recipes/shared_flags.py), before TensorFlow is imported.

def check_cpu_devices(num_devices):
    """`num_devices` as an int if it is at least 1 (`tfaccel.distribute.split_cpu`).

    Raises:
      ConfigError: None or fewer than 1.
    """
    if num_devices is None or int(num_devices) < 1:
        raise ConfigError(f"cpu_devices={num_devices} must be at least 1 (1 keeps the CPU whole, "
                          "2 or more split it into logical devices for mirrored training)")
    return int(num_devices)


def check_accumulation_steps(steps, batch_size=None, num_replicas=1):
    """Raises ConfigError unless `steps` >= 1 and (if given) the batch splits into it
    (`tfaccel.performance.accumulate`).

    Args:
      steps: micro-batches per optimizer step.
      batch_size: global batch size, checked to give every replica `steps`
        micro-batches of at least one example.
      num_replicas: replicas the global batch is divided over.

    Returns:
      The micro-batch size per replica (or None without `batch_size`).
    """
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ConfigError(f"grad_accum_steps={steps!r} must be an integer >= 1 "
                          "(1 means no accumulation)")
    if batch_size is None:
        return None
    per_replica = batch_size // num_replicas
    if batch_size % (steps * num_replicas):
        on = f" on {num_replicas} replicas" if num_replicas > 1 else ""
        raise ConfigError(f"batch_size={batch_size} does not split into grad_accum_steps={steps} "
                          f"micro-batches{on}: use a batch size that is a multiple of "
                          f"{steps * num_replicas}")
    return per_replica // steps


def check_gpu_memory(growth=False, limit_mb=None, allocator="default"):
    """The GPU memory settings of `tfaccel.performance.memory.configure_gpu_memory`.

    Raises:
      ConfigError: unknown allocator, `limit_mb` <= 0, or `growth` together with
        `limit_mb` (TensorFlow accepts only one of them per GPU).
    """
    if allocator not in ALLOCATORS:
        raise ConfigError(f"unknown GPU allocator {allocator!r}: use one of "
                          f"{', '.join(ALLOCATORS)}")
    if limit_mb is not None and limit_mb <= 0:
        raise ConfigError(f"GPU memory limit {limit_mb} MB must be positive "
                          "(or unset for no limit)")
    if growth and limit_mb is not None:
        raise ConfigError(f"memory growth and a memory limit ({limit_mb} MB) cannot be combined: "
                          "choose growth (allocate on demand) or a limit (fixed cap)")


def check_cache(cache):
    """`PipelineConfig.cache`: one of `CACHE_MODES`, or a file name prefix whose folder exists
    and can be written (tf.data writes `prefix`.* files; a missing folder would stop the run
    mid-training with files left behind).

    Raises:
      ConfigError: anything else.
    """
    if cache in CACHE_MODES:
        return
    if not str(cache).strip():
        raise ConfigError(f"cache={cache!r}: use one of {', '.join(CACHE_MODES)} "
                          "or a file path prefix")
    folder = os.path.dirname(os.path.abspath(cache))
    fix = ("pass a prefix in an existing folder you can write to (e.g. --cache=/tmp/train_cache), "
           "or --cache=memory")
    if os.path.isdir(cache):
        raise ConfigError(f"cache={cache!r} is a folder: the cache is a file name prefix, e.g. "
                          f"{os.path.join(cache, 'train')!r}")
    if not os.path.isdir(folder):
        raise ConfigError(f"cache={cache!r}: folder {folder} does not exist: {fix}")
    if why := cannot_write(folder):
        raise ConfigError(f"cache={cache!r}: cannot write to {folder} ({why}): {fix}")


def check_schedule(name, epochs, warmup_epochs=0.0, decay_epochs=None, boundaries=(),
                   multipliers=()):
    """The lengths of `tfaccel.train.schedules.make_schedule`, in epochs.

    Raises:
      ConfigError: unknown name, warmup as long as training or longer, decay_epochs <= 0,
        or a piecewise schedule without one more multiplier than boundaries.
    """
    if name not in SCHEDULES:
        raise ConfigError(f"unknown learning-rate schedule {name!r}: "
                          f"use one of {', '.join(SCHEDULES)}")
    if warmup_epochs < 0 or (warmup_epochs > 0 and warmup_epochs >= epochs):
        raise ConfigError(f"warmup of {warmup_epochs} epochs is not shorter than training "
                          f"({epochs} epochs): use --warmup_epochs below --epochs")
    if decay_epochs is not None and decay_epochs <= 0:
        raise ConfigError(f"decay_epochs={decay_epochs} must be > 0")
    if name == "piecewise" and len(multipliers) != len(boundaries) + 1:
        raise ConfigError(f"piecewise schedule: {len(boundaries)} boundaries need "
                          f"{len(boundaries) + 1} multipliers, got {len(multipliers)}")


def check_sparsity(value, name="target_sparsity"):
    """Returns `value` as a float if it is in [0, 1), else raises ConfigError
    (`tfaccel.compress.pruning_plan`)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ConfigError(f"{name}={value!r} must be in [0, 1), e.g. 0.8 for 80% zeros")
    return float(value)


def check_pruning_epochs(epochs, begin_epoch=0.0, end_epoch=None, frequency=None):
    """(begin_epoch, end_epoch) of a pruning ramp over `epochs` epochs of fine-tuning
    (`make_pruning_schedule`); `end_epoch` defaults to two thirds of the epochs.

    Raises:
      ConfigError: pruning beginning outside the fine-tuning, ending before it begins or
        after the last epoch, or a mask-update frequency below one step.
    """
    begin_epoch = float(begin_epoch)
    end_epoch = float(end_epoch) if end_epoch is not None else max(
        begin_epoch, 2.0 * epochs / 3.0)
    if not 0 <= begin_epoch < epochs:
        raise ConfigError(f"begin_epoch={begin_epoch:g} must be in [0, epochs={epochs}): "
                          "pruning must start during the fine-tuning")
    if end_epoch < begin_epoch:
        raise ConfigError(f"end_epoch={end_epoch:g} is before begin_epoch={begin_epoch:g}: "
                          "pruning must end after it begins")
    if end_epoch > epochs:
        raise ConfigError(f"end_epoch={end_epoch:g} is after the last epoch ({epochs}): "
                          "the target would never be reached; lower it or add epochs")
    if frequency is not None and int(frequency) < 1:
        raise ConfigError(f"frequency={frequency} must be a positive number of steps")
    return begin_epoch, end_epoch


def check_prune_pattern(m_by_n=None, block_size=(1, 1), block_pooling="AVG", policy=None):
    """The pattern settings of a `PruneConfig` (`plan_pruning`).

    Raises:
      ConfigError: m_by_n not two integers 0 < m < n, or combined with blocks; block_size not
        two positive integers; an unknown block pooling or policy.
    """
    if m_by_n is not None:
        pair = tuple(m_by_n)
        if len(pair) != 2 or not all(isinstance(v, int) for v in pair) or \
                not 0 < pair[0] < pair[1]:
            raise ConfigError(f"m_by_n={m_by_n!r} must be two integers 0 < m < n, e.g. (2, 4)")
        if tuple(block_size) != (1, 1):
            raise ConfigError("m_by_n and block_size cannot be combined: pick one pattern")
    if len(tuple(block_size)) != 2 or min(block_size) < 1:
        raise ConfigError(f"block_size={block_size!r} must be two positive integers")
    if block_pooling not in BLOCK_POOLINGS:
        raise ConfigError(f"block_pooling={block_pooling!r}: use 'AVG' or 'MAX'")
    if policy not in (None, *PRUNING_POLICIES):
        raise ConfigError(f"policy={policy!r}: use None or one of {', '.join(PRUNING_POLICIES)}")


def parse_backup_freq(value):
    """'epoch', a positive number of steps (int or string), or seconds: '60s' -> timedelta(60).

    A `datetime.timedelta` (or 'Ns') means: back up at the first epoch end at
    least that long after the previous backup (or the start), and after the
    last epoch.

    Raises:
      ConfigError: anything else.
    """
    if value == "epoch":
        return "epoch"
    if isinstance(value, datetime.timedelta):
        if value.total_seconds() < 0:
            raise ConfigError(f"backup_freq={value} must not be negative")
        return value
    seconds = re.fullmatch(r"(\d+(?:\.\d*)?)s", str(value).strip())
    if seconds:
        return datetime.timedelta(seconds=float(seconds.group(1)))
    try:
        steps = int(value)
    except (TypeError, ValueError):
        steps = 0
    if steps < 1:
        raise ConfigError(f"backup_freq={value!r} must be 'epoch', a positive number of steps "
                          "(e.g. 50) or of seconds between epoch-end backups (e.g. 60s)")
    return steps
