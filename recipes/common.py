"""What the recipes share: common flags, turning flags into data and models, and
turning tfaccel's errors into one line and a non-zero exit.

Flags are read here and in the recipes only; everything below calls plain
tfaccel helpers.
"""

import os
import sys

# Quiet TensorFlow's C++ start-up chatter (CUDA probing on CPU machines) before it loads.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging  # noqa: E402

from tfaccel.errors import TfaccelError  # noqa: E402

FLAGS = flags.FLAGS
EXIT_BAD_INPUT = 2


def define_data_flags():
    """--dataset, --data_dir and the shape of synthetic or image-folder data."""
    from tfaccel.data import DATASETS

    flags.DEFINE_enum("dataset", "digits", DATASETS, "Where examples come from.")
    flags.DEFINE_string("data_dir", None, "Folder (image_dir) or .npz file (npz).")
    flags.DEFINE_list("image_size", ["64", "64"], "height,width images from a folder are resized to.")
    flags.DEFINE_list("synthetic_shape", ["8", "8", "1"], "Shape of one synthetic example.")
    flags.DEFINE_integer("synthetic_classes", 10, "Classes of synthetic data.", lower_bound=2)
    flags.DEFINE_integer("synthetic_examples", 1024, "Training examples of synthetic data.",
                         lower_bound=1)
    flags.DEFINE_string("on_bad_example", "fail", "A corrupt or non-image file (image_dir) or a "
                        "bad TFRecord: 'fail' stops with its name, 'skip' leaves it out and names it.")
    flags.DEFINE_string("tfrecord_features", "image=bytes,label=int64", "Feature spec of "
                        "--dataset=tfrecord records: name=bytes|int64|float[shape],...")
    flags.DEFINE_string("tfds_name", None, "TFDS dataset name (name or name:version) for "
                        "--dataset=tfds; its data must already be on disk.")


def define_model_flags(default="cnn"):
    """--model (zoo name or saved model path) and --model_fn."""
    from tfaccel.models import MODELS

    flags.DEFINE_string("model", default, f"One of {', '.join(MODELS)}, or a .keras/.h5 file "
                        "or SavedModel directory.")
    flags.DEFINE_string("model_fn", None, "package.module:function(input_shape, num_classes) "
                        "returning a tf_keras model; overrides --model.")


class BatchSizeParser(flags.ArgumentParser):
    """A positive integer, or 'auto' when `allow_auto` (then FLAGS.batch_size is the string 'auto')."""

    def __init__(self, allow_auto=False):
        self.allow_auto = allow_auto

    def parse(self, argument):
        text = str(argument).strip().lower()
        if self.allow_auto and text == "auto":
            return "auto"
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1 or isinstance(argument, bool):
            raise ValueError(f"{argument!r} is not a batch size: use a positive integer, e.g. 64"
                             + (", or 'auto' to measure the fastest that fits" if self.allow_auto
                                else ""))
        return value

    def flag_type(self):
        return "int or 'auto'" if self.allow_auto else "int"


def define_train_flags(epochs=30, batch_size=64, learning_rate=1e-3, auto_batch_size=False):
    """--epochs, --batch_size (may be 'auto' if `auto_batch_size`), --optimizer, --learning_rate,
    --model_dir, --seed."""
    from tfaccel.training import OPTIMIZERS

    flags.DEFINE_integer("epochs", epochs, "Training epochs.", lower_bound=1)
    flags.DEFINE(BatchSizeParser(auto_batch_size), "batch_size", batch_size,
                 "Global batch size (over all replicas)" + (
                     "; 'auto' trains a few steps at growing sizes and keeps the best measured "
                     "throughput that fits in memory." if auto_batch_size else "."),
                 serializer=flags.ArgumentSerializer())
    flags.DEFINE_enum("optimizer", "adam", OPTIMIZERS, "Optimizer.")
    flags.DEFINE_float("learning_rate", learning_rate, "Peak learning rate.", lower_bound=0.0)
    flags.DEFINE_string("model_dir", None, "Where logs, checkpoints, exports and reports go "
                        "(default: runs/<dataset>-<model>).")
    flags.DEFINE_integer("seed", 0, "Seed of initialization, shuffling and synthetic data.")


def define_distribute_flags():
    """--strategy, --cpu_devices, --scale_lr, --cross_device_ops, --collective, --backup_dir/_freq."""
    from tfaccel.distribute import COLLECTIVES, CROSS_DEVICE_OPS, STRATEGIES

    # Plain strings, checked by tfaccel.distribute, so that a bad value is one 'error:' line.
    flags.DEFINE_string("strategy", "auto", f"Distribution strategy: {', '.join(STRATEGIES)}. "
                        "auto = multi_worker under TF_CONFIG/Slurm, mirrored with several GPUs "
                        "(or --cpu_devices>1), else default.")
    flags.DEFINE_integer("cpu_devices", None, "Split the CPU into N logical devices (stand-ins "
                         "for GPUs, so that mirrored training runs without them).")
    flags.DEFINE_bool("scale_lr", False, "Multiply --learning_rate by the number of replicas "
                      "(linear scaling rule).")
    flags.DEFINE_string("cross_device_ops", "auto", f"Reduction of --strategy=mirrored: "
                        f"{', '.join(CROSS_DEVICE_OPS)}.")
    flags.DEFINE_string("collective", "auto", f"All-reduce of --strategy=multi_worker: "
                        f"{', '.join(COLLECTIVES)}.")
    flags.DEFINE_string("backup_dir", None, "Where BackupAndRestore keeps the state to resume "
                        "from after a crash (default: <model_dir>/backup; the same for all workers).")
    flags.DEFINE_string("backup_freq", "epoch", "Back up every 'epoch' or every N steps.")


def _ints(values, name):
    try:
        ints = tuple(int(v) for v in values)
    except ValueError:
        raise TfaccelError(f"--{name}={','.join(values)} must be comma-separated integers, "
                           "e.g. 64,64") from None
    if not ints or any(i <= 0 for i in ints):
        raise TfaccelError(f"--{name}={','.join(values)} must be positive integers")
    return ints


def load_data():
    """The dataset the flags ask for (raises DataError before any training)."""
    from tfaccel.data import load_dataset

    return load_dataset(
        FLAGS.dataset,
        FLAGS.data_dir,
        image_size=_ints(FLAGS.image_size, "image_size"),
        input_shape=_ints(FLAGS.synthetic_shape, "synthetic_shape"),
        num_classes=FLAGS.synthetic_classes,
        num_examples=FLAGS.synthetic_examples,
        seed=FLAGS.seed,
        on_bad_example=FLAGS.on_bad_example,
        features=FLAGS.tfrecord_features,
        tfds_name=FLAGS.tfds_name,
    )


def load_model(info):
    """The model the flags ask for, checked against the dataset `info`."""
    from tfaccel.models import resolve_model

    return resolve_model(FLAGS.model, info.input_shape, info.num_classes, FLAGS.model_fn)


def model_label():
    """A short name of the model for default paths and reports."""
    if FLAGS.model_fn:
        return FLAGS.model_fn.rpartition(":")[2]
    base = os.path.basename(os.path.normpath(FLAGS.model))
    return base.rsplit(".", 1)[0] if "." in base else base


def default_model_dir(prefix=""):
    return FLAGS.model_dir or os.path.join("runs", f"{prefix}{FLAGS.dataset}-{model_label()}")


def define_pipeline_flags():
    """--cache, --shuffle_buffer, --random_flip, --standardize, --deterministic, --data_autotune,
    --data_ram_budget_mb (tfaccel.data)."""
    flags.DEFINE_string("cache", "auto", "Cache decoded examples: auto (in memory when they fit "
                        "2 GB), memory, none, or a file path prefix.")
    flags.DEFINE_integer("shuffle_buffer", 0, "Shuffle buffer in examples (0: sized to 256 MB "
                         "and at most the dataset).", lower_bound=0)
    flags.DEFINE_bool("random_flip", False, "Random left-right flips in training.")
    flags.DEFINE_bool("standardize", False, "Per-image standardization (zero mean, unit variance).")
    flags.DEFINE_bool("deterministic", False, "Keep element order through parallel input stages "
                      "(slower; off by default).")
    flags.DEFINE_bool("data_autotune", False, "Run tf.data's autotune thread (off: each AUTOTUNE "
                      "stage runs min(16, cores) calls, and epochs end without its teardown stall).")
    flags.DEFINE_float("data_ram_budget_mb", 0.0, "tf.data autotune's RAM budget in MB (0: TF's "
                       "default); needs --data_autotune.", lower_bound=0.0)


def pipeline_config(batch_size, drop_remainder=False):
    """The `tfaccel.data.PipelineConfig` the pipeline flags ask for."""
    from tfaccel.data import PipelineConfig

    if FLAGS.data_ram_budget_mb and not FLAGS.data_autotune:
        raise TfaccelError(f"--data_ram_budget_mb={FLAGS.data_ram_budget_mb:g} is tf.data autotune's "
                           "RAM budget: add --data_autotune, or drop it")
    return PipelineConfig(batch_size=batch_size, cache=FLAGS.cache,
                          shuffle_buffer=FLAGS.shuffle_buffer or None, random_flip=FLAGS.random_flip,
                          standardize=FLAGS.standardize, deterministic=FLAGS.deterministic,
                          drop_remainder=drop_remainder, on_bad_example=FLAGS.on_bad_example,
                          autotune=FLAGS.data_autotune, ram_budget_mb=FLAGS.data_ram_budget_mb or None)


def define_schedule_flags():
    """--lr_schedule, --warmup_epochs, --decay_epochs, --decay_rate, --min_lr_ratio, piecewise."""
    from tfaccel.schedules import SCHEDULES

    # Plain strings, checked by tfaccel.schedules, so that a bad value is one 'error:' line.
    flags.DEFINE_string("lr_schedule", "constant", f"Learning-rate schedule: {', '.join(SCHEDULES)}.")
    flags.DEFINE_float("warmup_epochs", 0.0, "Linear warmup from 0 to --learning_rate (epochs).")
    flags.DEFINE_float("decay_epochs", None, "step: epochs between decays; exponential, polynomial, "
                       "cosine: decay length; cosine_restarts: first cycle; epoch_exponential: epochs "
                       "kept before decaying (default 10). Default: derived from --epochs.")
    flags.DEFINE_float("decay_rate", 0.1, "step/exponential: factor per decay; epoch_exponential: "
                       "rate r of the per-epoch factor exp(-r).")
    flags.DEFINE_float("min_lr_ratio", 0.0, "cosine, cosine_restarts, polynomial: final learning "
                       "rate as a fraction of --learning_rate.")
    flags.DEFINE_list("lr_boundaries", [], "piecewise: epochs (after warmup) where the rate changes.")
    flags.DEFINE_list("lr_multipliers", [], "piecewise: --learning_rate multipliers, one more "
                      "than --lr_boundaries.")


def define_host_allocator_flag():
    """--host_allocator (tfaccel.memory.use_pooled_host_allocator)."""
    from tfaccel.memory import HOST_ALLOCATORS

    flags.DEFINE_enum("host_allocator", "pooled", HOST_ALLOCATORS, "Host (CPU) tensors from "
                      "TensorFlow's pooled BFC allocator (faster parallel input pipelines; keeps its "
                      "peak) or from malloc (TensorFlow's default).")


def use_host_allocator():
    """Applies --host_allocator; call before TensorFlow allocates its first tensor."""
    from tfaccel import memory

    if FLAGS.host_allocator == "pooled":
        memory.use_pooled_host_allocator()


def check_host_allocator():
    """Warns when --host_allocator=pooled came too late; initializes TensorFlow's devices."""
    from tfaccel import memory

    if FLAGS.host_allocator == "pooled" and not memory.pooled_host_allocator_active():
        print("warning: --host_allocator=pooled had no effect: TensorFlow allocated host memory "
              "before the recipe could set it")


def define_performance_flags():
    """--precision, --jit_compile, --grad_accum_steps, memory flags, batch-size search, monitor."""
    from tfaccel.memory import ALLOCATORS
    from tfaccel.precision import JIT_CHOICES, PRECISIONS

    # Plain strings, checked by tfaccel.precision, so that a bad value is one 'error:' line.
    flags.DEFINE_string("precision", "float32", f"{', '.join(PRECISIONS)}, or auto: time each on "
                        "the actual model and data and keep the fastest (never slower than float32).")
    flags.DEFINE_string("jit_compile", "false", f"XLA: {', '.join(JIT_CHOICES)} (auto: measured "
                        "like --precision=auto).")
    flags.DEFINE_integer("grad_accum_steps", 1, "Split each --batch_size batch into N micro-batches "
                         "and accumulate their gradients into one update (memory of batch/N).")
    flags.DEFINE_bool("memory_growth", False, "Allocate GPU memory on demand instead of all up front.")
    flags.DEFINE_integer("gpu_memory_limit", None, "Cap each GPU at this many MB.")
    flags.DEFINE_string("gpu_allocator", "default", f"GPU allocator: {', '.join(ALLOCATORS)} "
                        "(cuda_malloc_async: CUDA's stream-ordered memory pool).")
    define_host_allocator_flag()
    flags.DEFINE_integer("max_batch_size", 1024, "--batch_size=auto: largest size to try.")
    flags.DEFINE_float("memory_budget_mb", None, "--batch_size=auto on CPU: reject sizes whose peak "
                       "RSS exceeds this (default: current RSS + half the available memory).")
    flags.DEFINE_integer("monitor_every_n_steps", 50, "Log GPU (NVML) or CPU utilization and "
                         "memory every N steps to TensorBoard; 0: off.")


def lr_schedule(learning_rate, steps_per_epoch):
    """The `tfaccel.schedules` schedule the schedule flags ask for."""
    from tfaccel.schedules import make_schedule

    def floats(values, name):
        try:
            return [float(v) for v in values]
        except ValueError:
            raise TfaccelError(f"--{name}={','.join(values)} must be comma-separated numbers") from None

    return make_schedule(FLAGS.lr_schedule, learning_rate, steps_per_epoch=steps_per_epoch,
                         epochs=FLAGS.epochs, warmup_epochs=FLAGS.warmup_epochs,
                         decay_epochs=FLAGS.decay_epochs, decay_rate=FLAGS.decay_rate,
                         min_lr_ratio=FLAGS.min_lr_ratio,
                         boundaries=floats(FLAGS.lr_boundaries, "lr_boundaries"),
                         multipliers=floats(FLAGS.lr_multipliers, "lr_multipliers"))


RECIPES_DIR = os.path.dirname(os.path.abspath(__file__))


def _is_recipe_module(module_name):
    if os.path.abspath(module_name) == os.path.abspath(sys.argv[0]) or module_name == "__main__":
        return True
    leaf = module_name.rpartition(".")[2]
    return os.path.exists(os.path.join(RECIPES_DIR, leaf + ".py"))


def flag_values():
    """{flag: value} of the flags the recipes define (absl's own left out), for reports."""
    return {
        flag.name: flag.value
        for module, module_flags in FLAGS.flags_by_module_dict().items()
        if _is_recipe_module(module)
        for flag in module_flags
    }


def command_line():
    """The command that reproduces this run."""
    return " ".join(["python", *sys.argv])


def reject_extra_args(argv):
    if len(argv) > 1:
        raise TfaccelError(f"unexpected arguments {' '.join(argv[1:])!r}: every option is a "
                           "--flag (see --helpshort)")


def run(main):
    """Runs `main` under absl; a TfaccelError becomes one 'error:' line and exit code 2."""

    def guarded(argv):
        try:
            return main(argv)
        except TfaccelError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(EXIT_BAD_INPUT)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)

    logging.set_verbosity(logging.WARNING)
    app.run(guarded)
