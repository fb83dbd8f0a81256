"""What the recipes share: their flags, and the setup that turns the flags into tfaccel calls.

Each recipe's `main` reads top to bottom as its job; the steps every recipe takes alike are
functions here, so that the recipes cannot drift apart: `strategy_from_flags` (devices,
allocators, then the strategy), `run_dirs` (only the chief writes to --model_dir),
`write_run_config` (flags.cfg and the flags in TensorBoard), `input_from_flags` (train,
validation and test through `tfaccel.data`'s pipeline, with the shard policy),
`scaled_learning_rate` and `compile_from_flags`. Flags are read here and in the recipes
only; everything else calls plain tfaccel helpers.

The flags are defined in recipes/shared_flags.py and parsed by recipes/flagkit.py (both
re-exported here, so a recipe needs only `import common`). Nothing at import time or while
flags are parsed loads TensorFlow, so a bad flag is one `error:` line (exit 2) in a
fraction of a second; `run` imports TensorFlow only once the flags are good and the output
folders writable.
"""

import collections
import dataclasses
import os

import flagkit
from fit_setup import (
    FitCallbacks,
    auto_precision,
    compile_from_flags,
    fit_batch_size,
    fit_callbacks,
    memory_plan,
    model_flops,
    print_utilization,
    utilization_metrics,
)
from flagkit import (
    FLAGS,
    BatchSizeParser,
    check_flag,
    check_flags,
    command_line,
    flag_values,
    int_list,
    reject_extra_args,
    require_ints,
)
from shared_flags import (
    AUTO_BATCH_START,
    TRAIN_BACKUP_FREQ,
    check_strategy,
    define_backup_flags,
    define_data_flags,
    define_distribute_flags,
    define_host_allocator_flag,
    define_model_flags,
    define_optimizer_flags,
    define_performance_flags,
    define_pipeline_flags,
    define_schedule_flags,
    define_train_flags,
    float_list,
)

from tfaccel import choices
from tfaccel.errors import ConfigError

__all__ = [
    # Re-exported: the flag machinery and the shared flags the recipes use.
    "AUTO_BATCH_START", "FLAGS", "TRAIN_BACKUP_FREQ", "BatchSizeParser", "ConfigError",
    "check_flag", "check_flags", "choices", "command_line", "define_backup_flags",
    "define_data_flags", "define_distribute_flags", "define_host_allocator_flag",
    "define_model_flags", "define_optimizer_flags", "define_performance_flags",
    "define_pipeline_flags", "define_schedule_flags", "define_train_flags", "flag_values",
    "float_list", "int_list", "reject_extra_args", "require_ints",
    # The setup.
    "load_data", "load_model", "check_keras3_flags", "model_label", "default_model_dir",
    "check_output_dirs", "run_dirs", "write_run_config", "use_host_allocator",
    "check_host_allocator", "strategy_from_flags", "scaled_learning_rate", "pipeline_config",
    "Inputs", "input_from_flags", "lr_schedule", "run",
    # Re-exported: compiling and fitting from the flags (recipes/fit_setup.py).
    "compile_from_flags", "fit_batch_size", "FitCallbacks", "fit_callbacks", "memory_plan",
    "model_flops", "utilization_metrics", "auto_precision", "print_utilization",
]


# --- From the flags to tfaccel calls: data, model, output folders.

def load_data():
    """The dataset the flags ask for (raises DataError before any training)."""
    from tfaccel.data import load_dataset

    return load_dataset(
        FLAGS.dataset,
        FLAGS.data_dir,
        image_size=int_list(FLAGS.image_size),
        input_shape=int_list(FLAGS.synthetic_shape),
        num_classes=FLAGS.synthetic_classes,
        num_examples=FLAGS.synthetic_examples,
        seed=FLAGS.seed,
        on_bad_example=FLAGS.on_bad_example,
        features=FLAGS.tfrecord_features,
        tfds_name=FLAGS.tfds_name,
    )


def load_model(info):
    """The model the flags ask for, checked against the dataset `info`."""
    from tfaccel.train.models import is_model_path, resolve_model

    keras = FLAGS.keras if FLAGS["keras"].present or not (
        FLAGS.model_fn or is_model_path(FLAGS.model)) else None  # a file keeps its own Keras
    return resolve_model(FLAGS.model, info.input_shape, info.num_classes, FLAGS.model_fn, keras)


def check_keras3_flags():
    """Raises ConfigError for a flag this recipe cannot honour on a Keras 3 model (call before
    the strategy waits for its peers when --keras=keras3, and once a loaded model turns out to
    be Keras 3): what still needs tf_keras is named with the fix. --parallel is not refused
    here: `tfaccel.pipeline_parallel` splits a Keras 3 functional model of standard layers and
    refuses, in one line naming what works, one it cannot split."""
    # Keras 3's fit fails under it (keras-team/keras#20585, tensorflow#72388)
    if FLAGS.get_flag_value("strategy", None) == "multi_worker":
        raise ConfigError("--strategy=multi_worker needs a tf_keras model, and this one is a "
                          "Keras 3 model: drop the flag, or pass --keras=tf_keras (see "
                          "docs/keras3.md)")


def model_label():
    """A short name of the model for default paths and reports."""
    if FLAGS.get_flag_value("model_fn", None):  # a recipe without it: None
        return FLAGS.model_fn.rpartition(":")[2]
    base = os.path.basename(os.path.normpath(FLAGS.model))
    return base.rsplit(".", 1)[0] if "." in base else base


def default_model_dir(prefix=""):
    """--model_dir, or runs/<prefix><dataset>-<model>: the folder every worker reads."""
    return FLAGS.model_dir or os.path.join("runs", f"{prefix}{FLAGS.dataset}-{model_label()}")


def check_output_dirs(prefix=""):
    """Raises ConfigError unless --model_dir (default_model_dir(prefix)) and --backup_dir, if
    the recipe has them, can be created and written; writes nothing. Call it before any work."""
    from tfaccel.io import check_writable_dir

    if "model_dir" in FLAGS:
        check_writable_dir(default_model_dir(prefix), "--model_dir")
    if "backup_dir" in FLAGS and FLAGS.backup_dir:
        check_writable_dir(FLAGS.backup_dir, "--backup_dir")


def run_dirs(strategy, prefix=""):
    """(model_dir, logdir) this process writes to: --model_dir (`default_model_dir(prefix)`) on
    the chief, on other workers a temporary folder removed when they exit
    (`tfaccel.distribute.worker_output_dir`), so that only the chief's files are kept."""
    from tfaccel import distribute

    model_dir = distribute.worker_output_dir(default_model_dir(prefix), strategy)
    return model_dir, os.path.join(model_dir, "logs")


def write_run_config(model_dir, logdir):
    """flags.cfg (rerun with --flagfile) in `model_dir`; the flags as a table and the command
    line as TensorBoard text `config/flags` in `logdir`."""
    from tfaccel import io, summaries

    io.write_text(os.path.join(model_dir, "flags.cfg"), FLAGS.flags_into_string())
    summaries.write_text(logdir, "config/flags", summaries.markdown_table(flag_values())
                         + f"\n\n`{command_line()}`")


# --- Devices and the strategy, then input, learning rate and compile for it.

def use_host_allocator():
    """Applies --host_allocator; call before TensorFlow allocates its first tensor."""
    from tfaccel.performance import memory

    if FLAGS.host_allocator == "pooled":
        memory.use_pooled_host_allocator()


def check_host_allocator():
    """Warns when --host_allocator=pooled came too late; initializes TensorFlow's devices."""
    from tfaccel.performance import memory
    if FLAGS.host_allocator == "pooled" and not memory.pooled_host_allocator_active():
        print("warning: --host_allocator=pooled had no effect: TensorFlow allocated host memory "
              "before the recipe could set it")


def strategy_from_flags():
    """The `tf.distribute` strategy the distribution flags ask for, on devices set up first.

    In the order TensorFlow needs: the host allocator (--host_allocator, before the first
    tensor), the CPU split into --cpu_devices logical devices and the GPU memory flags
    (before TensorFlow initializes its devices), then `make_strategy` (a multi-worker one
    waits here for its peers). The allocator and GPU flags apply where the recipe defines
    them. --strategy=parameter_server is refused (when the flags are parsed, and here).
    """
    from tfaccel import distribute
    from tfaccel.performance import memory

    check_strategy(FLAGS.strategy)
    pooled = "host_allocator" in FLAGS
    if pooled:
        use_host_allocator()
    if FLAGS.cpu_devices is not None:
        distribute.split_cpu(FLAGS.cpu_devices)
    if "memory_growth" in FLAGS:  # on a machine without GPUs they only warn
        memory.configure_gpu_memory(growth=FLAGS.memory_growth, limit_mb=FLAGS.gpu_memory_limit,
                                    allocator=FLAGS.gpu_allocator)
    strategy = distribute.make_strategy(FLAGS.strategy, cross_device_ops=FLAGS.cross_device_ops,
                                        collective=FLAGS.collective)
    if pooled:
        check_host_allocator()  # it initializes the runtime: after the strategy set it up
    return strategy


def scaled_learning_rate(learning_rate, strategy):
    """`learning_rate` times the replicas under --scale_lr (the linear scaling rule), else
    `learning_rate`.

    A recipe's rates are tuned for one replica's batch, and the global batch is `replicas`
    of them (whatever --batch_size=auto picks): counted so, the rule is lr x replicas.
    """
    from tfaccel import distribute

    if not FLAGS.scale_lr:
        return learning_rate
    return distribute.scale_learning_rate(learning_rate, strategy.num_replicas_in_sync,
                                          base_batch_size=1)


def pipeline_config(batch_size, drop_remainder=False):
    """The `tfaccel.data.PipelineConfig` the pipeline flags ask for."""
    from tfaccel.data import PipelineConfig

    return PipelineConfig(batch_size=batch_size, cache=FLAGS.cache,
                          shuffle_buffer=FLAGS.shuffle_buffer or None,
                          random_flip=FLAGS.random_flip, standardize=FLAGS.standardize,
                          deterministic=FLAGS.deterministic, drop_remainder=drop_remainder,
                          on_bad_example=FLAGS.on_bad_example, autotune=FLAGS.data_autotune,
                          ram_budget_mb=FLAGS.data_ram_budget_mb or None)


Inputs = collections.namedtuple("Inputs", "train validation test config steps_per_epoch")


def input_from_flags(splits, strategy=None, batch_size=None, epoch=None):
    """Train, validation and test batches of `splits` for `fit` under `strategy`.

    All three go through `tfaccel.data.build_splits` with the pipeline flags (--batch_size
    unless `batch_size` is given; full training batches when the strategy needs them), and
    each carries the shard policy of `tfaccel.distribute.with_shard_policy`, so that every
    worker trains on its own share.

    Args:
      splits: `tfaccel.data.Splits` (from `load_data`).
      strategy: the strategy `fit` runs under (None: TensorFlow's default).
      batch_size: global batch size; default --batch_size.
      epoch: optional epoch variable (`tfaccel.train.resume.EpochCounter().epoch`) that makes
        each epoch's shuffle the same after a resume.

    Returns:
      `Inputs(train, validation, test, config, steps_per_epoch)`: the datasets, their
      `PipelineConfig`, and the training batches per epoch.
    """
    import tensorflow as tf

    from tfaccel import data, distribute

    strategy = strategy or tf.distribute.get_strategy()
    batch_size = FLAGS.batch_size if batch_size is None else batch_size
    config = pipeline_config(batch_size, drop_remainder=distribute.needs_drop_remainder(strategy))
    workers = distribute.num_workers(strategy)
    if workers > 1 and config.cache not in choices.CACHE_MODES:  # each worker its own files
        resolver = strategy.cluster_resolver
        config = dataclasses.replace(
            config, cache=f"{config.cache}-{resolver.task_type}{resolver.task_id}")
    datasets = [distribute.with_shard_policy(ds, splits.info.in_memory, workers)
                for ds in data.build_splits(splits, config, seed=FLAGS.seed, epoch=epoch)]
    steps = data.steps_per_epoch(splits.info.num_examples["train"], batch_size,
                                 config.drop_remainder)
    return Inputs(*datasets, config, steps)


def lr_schedule(learning_rate, steps_per_epoch):
    """The `tfaccel.train.schedules` schedule the schedule flags ask for."""
    from tfaccel.train.schedules import make_schedule

    return make_schedule(FLAGS.lr_schedule, learning_rate, steps_per_epoch=steps_per_epoch,
                         epochs=FLAGS.epochs, warmup_epochs=FLAGS.warmup_epochs,
                         decay_epochs=FLAGS.decay_epochs, decay_rate=FLAGS.decay_rate,
                         min_lr_ratio=FLAGS.min_lr_ratio,
                         boundaries=float_list(FLAGS.lr_boundaries, "lr_boundaries"),
                         multipliers=float_list(FLAGS.lr_multipliers, "lr_multipliers"))


def run(main, model_dir_prefix=""):
    """Runs a recipe's `main` (`flagkit.run`): flags parsed and checked, then --model_dir
    (`default_model_dir(model_dir_prefix)`) and --backup_dir checked writable, all before
    TensorFlow is imported."""
    flagkit.run(main, preflight=lambda: check_output_dirs(model_dir_prefix))
