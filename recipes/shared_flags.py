"""The flags the recipes share, defined by group (each group is a section of --help).

A recipe calls the `define_*` functions of the groups it reads, and only those: every
flag a recipe accepts is one it acts on. absl checks each value while the flags are parsed
(recipes/flagkit.py), before TensorFlow loads: the bounds and choices given here, and the
validators registered here, which call the checks the tfaccel helpers run themselves
(`tfaccel.choices`, `parse_backup_freq`, `parse_device_memory`), so that each rule has one
home. recipes/common.py re-exports these functions and turns the flags into tfaccel calls.
"""

from absl import flags
from flagkit import (
    DATA,
    DISTRIBUTION,
    MODEL,
    PERFORMANCE,
    PIPELINE,
    SCHEDULE,
    TRAINING,
    BatchSizeParser,
    check_flag,
    check_flags,
    check_in,
    recipe_path,
    require_ints,
)

from tfaccel import choices
from tfaccel.choices import parse_backup_freq
from tfaccel.errors import ConfigError

# A ParameterServerStrategy needs ps and coordinator tasks that no recipe runs.
RECIPE_STRATEGIES = tuple(s for s in choices.STRATEGIES if s != "parameter_server")

def define_data_flags():
    """--dataset, --data_dir and the shape of synthetic or image-folder data."""
    flags.DEFINE_enum("dataset", "digits", choices.DATASETS, "Where examples come from.",
                      module_name=DATA)
    flags.DEFINE_string("data_dir", None, "Folder (image_dir) or .npz file (npz).",
                        module_name=DATA)
    flags.DEFINE_list("image_size", ["64", "64"], "height,width images from a folder are "
                      "resized to.", module_name=DATA)
    require_ints("image_size", "height,width: two positive integers", count=2)
    flags.DEFINE_list("synthetic_shape", ["8", "8", "1"], "Shape of one synthetic example.",
                      module_name=DATA)
    require_ints("synthetic_shape", "comma-separated positive sizes")
    flags.DEFINE_integer("synthetic_classes", 10, "Classes of synthetic data.", lower_bound=2,
                         module_name=DATA)
    flags.DEFINE_integer("synthetic_examples", 1024, "Training examples of synthetic data.",
                         lower_bound=1, module_name=DATA)
    flags.DEFINE_enum("on_bad_example", "fail", choices.ON_BAD_EXAMPLE, "A corrupt or non-image "
                      "file (image_dir) or a bad TFRecord: 'fail' stops with its name, 'skip' "
                      "leaves it out and names it.", module_name=DATA)
    flags.DEFINE_string("tfrecord_features", "image=bytes,label=int64", "Feature spec of "
                        "--dataset=tfrecord records: name=bytes|int64|float[shape],...",
                        module_name=DATA)
    flags.DEFINE_string("tfds_name", None, "TFDS dataset name (name or name:version) for "
                        "--dataset=tfds; its data must already be on disk.", module_name=DATA)


def define_model_flags(default="cnn"):
    """--model (zoo name or saved model path), --keras and --model_fn."""
    flags.DEFINE_string("model", default, f"One of {', '.join(choices.MODELS)}, or a .keras/.h5 "
                        "file or SavedModel directory.", module_name=MODEL)
    flags.DEFINE_enum("keras", "tf_keras", choices.KERAS_FLAVOURS,
                      "The Keras of the model: tf_keras (Keras 2) or keras3 (the `keras` package). "
                      "Zoo models are built in it; a model file or --model_fn model keeps its own "
                      "Keras unless --keras is given (then it is translated, verified: "
                      "tfaccel.keras.bridge). See docs/keras3.md.", module_name=MODEL)
    flags.DEFINE_string("model_fn", None, "package.module:function(input_shape, num_classes) "
                        "returning a functional or Sequential model (tf_keras or Keras 3); "
                        "overrides --model. "
                        "The module must be importable: put its folder on PYTHONPATH (the "
                        "current folder is not searched).",
                        module_name=MODEL)


def define_train_flags(epochs=30, batch_size=64, learning_rate=1e-3, auto_batch_size=False,
                       optimizer="adam"):
    """--epochs (unless `epochs` is None), --batch_size (may be 'auto' if `auto_batch_size`),
    --optimizer, --learning_rate, --model_dir, --seed."""
    if epochs is not None:
        flags.DEFINE_integer("epochs", epochs, "Training epochs.", lower_bound=1,
                             module_name=TRAINING)
    flags.DEFINE(BatchSizeParser(auto_batch_size), "batch_size", batch_size,
                 "Global batch size (over all replicas)" + (
                     "; 'auto' trains a few steps at growing sizes and keeps the best measured "
                     "throughput that fits in memory." if auto_batch_size else "."),
                 serializer=flags.ArgumentSerializer(), module_name=TRAINING)
    flags.DEFINE_enum("optimizer", optimizer, choices.OPTIMIZERS, "Optimizer.",
                      module_name=TRAINING)
    flags.DEFINE_float("learning_rate", learning_rate, "Peak learning rate (> 0).",
                       module_name=TRAINING)
    flags.DEFINE_string("model_dir", None, "Where logs, checkpoints, exports and reports go "
                        "(default: runs/<dataset>-<model>).", module_name=TRAINING)
    flags.DEFINE_integer("seed", 0, "Seed of initialization, shuffling and synthetic data.",
                         module_name=TRAINING)


def check_strategy(value):
    """--strategy: a recipe's choice (not parameter_server, which no recipe drives)."""
    if value == "parameter_server":
        raise ConfigError(f"--strategy=parameter_server needs parameter-server and coordinator "
                          f"tasks that {recipe_path()} does not run: use --strategy=multi_worker, "
                          "or tfaccel.distribute.make_strategy in your own code")
    check_in(value, "strategy", RECIPE_STRATEGIES)


def define_distribute_flags():
    """--strategy, --cpu_devices, --scale_lr, --cross_device_ops, --collective."""
    flags.DEFINE_string("strategy", "auto", f"Distribution strategy: "
                        f"{', '.join(RECIPE_STRATEGIES)}. auto = multi_worker under TF_CONFIG/"
                        "Slurm, mirrored with several GPUs (or --cpu_devices>1), else default.",
                        module_name=DISTRIBUTION)
    check_flag("strategy", check_strategy)
    flags.DEFINE_integer("cpu_devices", None, "Split the CPU into N logical devices (stand-ins "
                         "for GPUs, so that mirrored training runs without them).",
                         module_name=DISTRIBUTION)
    check_flag("cpu_devices", lambda n: n is None or choices.check_cpu_devices(n))
    flags.DEFINE_bool("scale_lr", False, "Multiply every learning rate by the number of replicas "
                      "(linear scaling rule).", module_name=DISTRIBUTION)
    flags.DEFINE_enum("cross_device_ops", "auto", choices.CROSS_DEVICE_OPS, "Reduction of "
                      "--strategy=mirrored.", module_name=DISTRIBUTION)
    flags.DEFINE_enum("collective", "auto", choices.COLLECTIVES, "All-reduce of "
                      "--strategy=multi_worker.", module_name=DISTRIBUTION)


# The train recipe's --backup_freq: a backup (tens of ms for a small model) at most once a
# minute, and after the last epoch, costs a small share of epochs of any length.
TRAIN_BACKUP_FREQ = "60s"


def define_backup_flags(default_freq="epoch"):
    """--backup_dir, --backup_freq: for recipes that resume from a backup after a crash."""
    flags.DEFINE_string("backup_dir", None, "Where BackupAndRestore keeps the state to resume "
                        "from after a crash (default: <model_dir>/backup; the same for all "
                        "workers).", module_name=DISTRIBUTION)
    flags.DEFINE_string("backup_freq", default_freq, "Back up every 'epoch', every N steps, or "
                        "at the first epoch end N seconds after the last backup ('60s'; every "
                        "epoch under several workers); the last epoch is always backed up.",
                        module_name=DISTRIBUTION)
    check_flag("backup_freq", parse_backup_freq)


def _check_ram_budget(data_ram_budget_mb, data_autotune):
    if data_ram_budget_mb and not data_autotune:
        raise ConfigError(f"--data_ram_budget_mb={data_ram_budget_mb:g} is tf.data autotune's RAM "
                          "budget: add --data_autotune, or drop it")


def define_pipeline_flags():
    """--cache, --shuffle_buffer, --random_flip, --standardize, --deterministic, --data_autotune,
    --data_ram_budget_mb (tfaccel.data)."""
    flags.DEFINE_string("cache", "auto", "Cache decoded examples: auto (in memory when they fit "
                        "2 GB), memory, none, or a file path prefix in an existing folder.",
                        module_name=PIPELINE)
    check_flag("cache", choices.check_cache)
    flags.DEFINE_integer("shuffle_buffer", 0, "Shuffle buffer in examples (0: sized to 256 MB "
                         "and at most the dataset).", lower_bound=0, module_name=PIPELINE)
    flags.DEFINE_bool("random_flip", False, "Random left-right flips in training.",
                      module_name=PIPELINE)
    flags.DEFINE_bool("standardize", False, "Per-image standardization (zero mean, unit "
                      "variance).", module_name=PIPELINE)
    flags.DEFINE_bool("deterministic", False, "Keep element order through parallel input stages "
                      "(slower), so that a rerun sees the same batches.", module_name=PIPELINE)
    flags.DEFINE_bool("data_autotune", False, "Run tf.data's autotune thread (off: each AUTOTUNE "
                      "stage runs min(16, cores) calls, and epochs end without its teardown "
                      "stall).", module_name=PIPELINE)
    flags.DEFINE_float("data_ram_budget_mb", 0.0, "tf.data autotune's RAM budget in MB (0: TF's "
                       "default); needs --data_autotune.", lower_bound=0.0, module_name=PIPELINE)
    check_flags(("data_ram_budget_mb", "data_autotune"), _check_ram_budget)


def define_schedule_flags(schedule="constant", warmup_epochs=0.0, min_lr_ratio=0.0):
    """--lr_schedule, --warmup_epochs, --decay_epochs, --decay_rate, --min_lr_ratio, piecewise."""
    flags.DEFINE_enum("lr_schedule", schedule, choices.SCHEDULES, "Learning-rate schedule.",
                      module_name=SCHEDULE)
    flags.DEFINE_float("warmup_epochs", warmup_epochs, "Linear warmup from 0 to --learning_rate "
                       "(epochs).", module_name=SCHEDULE)
    flags.DEFINE_float("decay_epochs", None, "step: epochs between decays; exponential, "
                       "polynomial, cosine: decay length; cosine_restarts: first cycle; "
                       "epoch_exponential: epochs kept before decaying (default 10). Default: "
                       "derived from --epochs.", module_name=SCHEDULE)
    flags.DEFINE_float("decay_rate", 0.1, "step/exponential: factor per decay; epoch_exponential: "
                       "rate r of the per-epoch factor exp(-r).", module_name=SCHEDULE)
    flags.DEFINE_float("min_lr_ratio", min_lr_ratio, "cosine, cosine_restarts, polynomial: "
                       "final learning rate as a fraction of --learning_rate.",
                       module_name=SCHEDULE)
    flags.DEFINE_list("lr_boundaries", [], "piecewise: epochs (after warmup) where the rate "
                      "changes.", module_name=SCHEDULE)
    flags.DEFINE_list("lr_multipliers", [], "piecewise: --learning_rate multipliers, one more "
                      "than --lr_boundaries.", module_name=SCHEDULE)
    check_flags(("lr_schedule", "epochs", "warmup_epochs", "decay_epochs", "lr_boundaries",
                 "lr_multipliers"), _check_schedule)


def float_list(values, name):
    """The numbers of list flag --name (a ConfigError if one is not)."""
    try:
        return [float(v) for v in values]
    except ValueError:
        raise ConfigError(f"--{name}={','.join(values)} must be comma-separated numbers"
                          ) from None


def _check_schedule(lr_schedule, warmup_epochs, decay_epochs, lr_boundaries, lr_multipliers,
                    epochs=None):
    """`make_schedule`'s rules on the schedule flags (a recipe without --epochs: no warmup
    limit)."""
    choices.check_schedule(lr_schedule, float("inf") if epochs is None else epochs,
                           warmup_epochs, decay_epochs,
                           float_list(lr_boundaries, "lr_boundaries"),
                           float_list(lr_multipliers, "lr_multipliers"))


def define_host_allocator_flag():
    """--host_allocator (tfaccel.performance.memory.use_pooled_host_allocator)."""
    flags.DEFINE_enum("host_allocator", "pooled", choices.HOST_ALLOCATORS, "Host (CPU) tensors "
                      "from TensorFlow's pooled BFC allocator (faster parallel input pipelines; "
                      "keeps its peak) or from malloc (TensorFlow's default).",
                      module_name=PERFORMANCE)


def _check_auto_budget(value):
    if value < 0:
        raise ConfigError(f"--auto_budget_seconds={value:g} is not a time budget: give seconds "
                          "> 0, or 0 for the default (10% of one epoch or 60 s)")


# --batch_size=auto tries powers of two from this many examples (rounded up to a multiple of
# the replicas) up to --max_batch_size.
AUTO_BATCH_START = 16


def _check_accumulation(grad_accum_steps, batch_size):
    # Here on one replica; once the strategy is known, the recipe checks its replicas too.
    choices.check_accumulation_steps(grad_accum_steps,
                                     None if batch_size == "auto" else batch_size)


def _check_search_range(batch_size, max_batch_size):
    if batch_size == "auto" and max_batch_size < AUTO_BATCH_START:
        raise ConfigError(f"--max_batch_size={max_batch_size} is below the smallest size "
                          f"--batch_size=auto tries ({AUTO_BATCH_START}): give "
                          f"--max_batch_size>={AUTO_BATCH_START}, or a --batch_size")


def _check_device_memory(value):
    if value is not None:
        from tfaccel.performance import plan

        plan.parse_device_memory(value)


def define_performance_flags(batch_search=True):
    """--precision, --jit_compile, --grad_accum_steps, memory flags, the batch-size search's
    (unless not `batch_search`), monitor."""
    flags.DEFINE_enum("precision", "float32", (*choices.PRECISIONS, "auto"), "auto: time each "
                      "on the actual model and data and keep the fastest (never slower than "
                      "float32).", module_name=PERFORMANCE)
    flags.DEFINE_enum("jit_compile", "false", choices.JIT_CHOICES, "XLA (auto: measured like "
                      "--precision=auto); any case.", case_sensitive=False,
                      module_name=PERFORMANCE)
    flags.DEFINE_integer("grad_accum_steps", 1, "Split each --batch_size batch into N "
                         "micro-batches and accumulate their gradients into one update (memory "
                         "of batch/N).", module_name=PERFORMANCE)
    check_flags(("grad_accum_steps", "batch_size"), _check_accumulation)
    flags.DEFINE_bool("memory_growth", False, "Allocate GPU memory on demand instead of all up "
                      "front.", module_name=PERFORMANCE)
    flags.DEFINE_integer("gpu_memory_limit", None, "Cap each GPU at this many MB.",
                         module_name=PERFORMANCE)
    flags.DEFINE_enum("gpu_allocator", "default", choices.ALLOCATORS, "GPU allocator "
                      "(cuda_malloc_async: CUDA's stream-ordered memory pool).",
                      module_name=PERFORMANCE)
    check_flags(("memory_growth", "gpu_memory_limit", "gpu_allocator"),
                lambda memory_growth, gpu_memory_limit, gpu_allocator: choices.check_gpu_memory(
                    memory_growth, gpu_memory_limit, gpu_allocator))
    define_host_allocator_flag()
    if batch_search:
        flags.DEFINE_integer("max_batch_size", 1024, "--batch_size=auto: largest size to try.",
                             module_name=PERFORMANCE)
        check_flags(("batch_size", "max_batch_size"), _check_search_range)
        flags.DEFINE_float("memory_budget_mb", None, "--batch_size=auto on CPU: reject sizes "
                           "whose peak RSS exceeds this (default: current RSS + half the available "
                           "memory).", module_name=PERFORMANCE)
    flags.DEFINE_float("auto_budget_seconds", 0.0, "Wall-clock budget of each timed search "
                       "(--precision/--jit_compile=auto, --batch_size=auto), shared by its "
                       "candidates; 0: 10% of one epoch or 60 s, whichever is larger.",
                       module_name=PERFORMANCE)
    check_flag("auto_budget_seconds", _check_auto_budget)
    flags.DEFINE_bool("plan", False, "Before training, print the memory plan of this run's "
                      "settings (as `tfaccel plan`: per-device breakdown, verdict, changes that "
                      "fit) and log it to TensorBoard (text and a chart).",
                      module_name=PERFORMANCE)
    flags.DEFINE_string("device_memory", None, "Memory of one device for --plan and "
                        "--batch_size=auto (which skips sizes the plan says cannot fit): 24GB, "
                        "16000MB or a card (rtx4090, a100-80gb, ...); default: the first GPU's, "
                        "else the host's available RAM.", module_name=PERFORMANCE)
    check_flag("device_memory", _check_device_memory)
    flags.DEFINE_integer("monitor_every_n_steps", 50, "Log GPU (NVML) or CPU utilization and "
                         "memory every N steps to TensorBoard; 0: off.", lower_bound=0,
                         module_name=PERFORMANCE)


# --- Optimizer settings beyond the learning rate (the language-model recipes).

def define_optimizer_flags(beta2=0.999, clip_norm=0.0, weight_decay=1e-4, ema=0.0):
    """--adam_beta2, --clip_norm, --weight_decay, --ema (`training.make_optimizer`)."""
    flags.DEFINE_float("adam_beta2", beta2, "adam/adamw: decay of the second-moment estimate.",
                       lower_bound=0.0, upper_bound=0.99999, module_name=TRAINING)
    flags.DEFINE_float("clip_norm", clip_norm, "Clip the global gradient norm to this (0: no "
                       "clipping).", lower_bound=0.0, module_name=TRAINING)
    flags.DEFINE_float("weight_decay", weight_decay, "adamw: decoupled weight decay.",
                       lower_bound=0.0, module_name=TRAINING)
    flags.DEFINE_float("ema", ema, "Keep an exponential moving average of the weights with "
                       "this momentum (e.g. 0.99) and end training with it (0: off).",
                       lower_bound=0.0, upper_bound=0.9999, module_name=TRAINING)
