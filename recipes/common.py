"""What the recipes share: common flags, turning flags into data and models, and
turning bad input into one line and a non-zero exit.

Flags are read here and in the recipes only; everything below calls plain
tfaccel helpers. Nothing at import time or while flags are parsed loads
TensorFlow: the choices come from `tfaccel.choices`, so a bad flag is one
`error:` line (exit 2) in a fraction of a second. `run` imports TensorFlow
(quietly, `tfaccel.quiet`) only once the flags are good.
"""

import ast
import math
import os
import re
import sys

# Filters what TensorFlow's C++ code logs once loaded (errors and worse); tfaccel.quiet applies
# the same level to the lines its libraries print while they load, which this alone cannot.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging

from tfaccel import choices
from tfaccel.errors import ConfigError, TfaccelError

FLAGS = flags.FLAGS
EXIT_BAD_INPUT = 2

# Help groups: absl groups flags by the module that defines them, so the shared flags are
# defined under these names, and --help lists the recipe's own flags, then each group.
DATA, MODEL, TRAINING, DISTRIBUTION, PIPELINE, SCHEDULE, PERFORMANCE = GROUPS = (
    "data flags", "model flags", "training flags", "distribution flags", "input pipeline flags",
    "learning-rate schedule flags", "performance flags")


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
    """--model (zoo name or saved model path) and --model_fn."""
    flags.DEFINE_string("model", default, f"One of {', '.join(choices.MODELS)}, or a .keras/.h5 "
                        "file or SavedModel directory.", module_name=MODEL)
    flags.DEFINE_string("model_fn", None, "package.module:function(input_shape, num_classes) "
                        "returning a functional or Sequential tf_keras model; overrides --model. "
                        "The module must be importable: put its folder on PYTHONPATH (the "
                        "current folder is not searched).",
                        module_name=MODEL)


class BatchSizeParser(flags.ArgumentParser):
    """A positive integer, or 'auto' when `allow_auto` (then FLAGS.batch_size is 'auto')."""

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
    flags.DEFINE_integer("epochs", epochs, "Training epochs.", lower_bound=1,
                         module_name=TRAINING)
    flags.DEFINE(BatchSizeParser(auto_batch_size), "batch_size", batch_size,
                 "Global batch size (over all replicas)" + (
                     "; 'auto' trains a few steps at growing sizes and keeps the best measured "
                     "throughput that fits in memory." if auto_batch_size else "."),
                 serializer=flags.ArgumentSerializer(), module_name=TRAINING)
    flags.DEFINE_enum("optimizer", "adam", choices.OPTIMIZERS, "Optimizer.",
                      module_name=TRAINING)
    flags.DEFINE_float("learning_rate", learning_rate, "Peak learning rate (> 0).",
                       module_name=TRAINING)
    flags.DEFINE_string("model_dir", None, "Where logs, checkpoints, exports and reports go "
                        "(default: runs/<dataset>-<model>).", module_name=TRAINING)
    flags.DEFINE_integer("seed", 0, "Seed of initialization, shuffling and synthetic data.",
                         module_name=TRAINING)


def define_distribute_flags():
    """--strategy, --cpu_devices, --scale_lr, --cross_device_ops, --collective, --backup_dir,
    --backup_freq."""
    flags.DEFINE_string("strategy", "auto", f"Distribution strategy: "
                        f"{', '.join(choices.STRATEGIES)}. auto = multi_worker under TF_CONFIG/"
                        "Slurm, mirrored with several GPUs (or --cpu_devices>1), else default.",
                        module_name=DISTRIBUTION)
    check_choice("strategy", "strategy", choices.STRATEGIES)
    flags.DEFINE_integer("cpu_devices", None, "Split the CPU into N logical devices (stand-ins "
                         "for GPUs, so that mirrored training runs without them).",
                         module_name=DISTRIBUTION)
    flags.DEFINE_bool("scale_lr", False, "Multiply --learning_rate by the number of replicas "
                      "(linear scaling rule).", module_name=DISTRIBUTION)
    flags.DEFINE_string("cross_device_ops", "auto", f"Reduction of --strategy=mirrored: "
                        f"{', '.join(choices.CROSS_DEVICE_OPS)}.", module_name=DISTRIBUTION)
    check_choice("cross_device_ops", "cross-device ops", choices.CROSS_DEVICE_OPS)
    flags.DEFINE_string("collective", "auto", f"All-reduce of --strategy=multi_worker: "
                        f"{', '.join(choices.COLLECTIVES)}.", module_name=DISTRIBUTION)
    check_choice("collective", "collective", choices.COLLECTIVES)
    flags.DEFINE_string("backup_dir", None, "Where BackupAndRestore keeps the state to resume "
                        "from after a crash (default: <model_dir>/backup; the same for all "
                        "workers).", module_name=DISTRIBUTION)
    flags.DEFINE_string("backup_freq", "epoch", "Back up every 'epoch' or every N steps.",
                        module_name=DISTRIBUTION)


def int_list(values):
    """The integers of a list flag that `require_ints` checked when the flags were parsed."""
    return tuple(int(v) for v in values)


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
    from tfaccel.train.models import resolve_model

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
                        "2 GB), memory, none, or a file path prefix in an existing folder.",
                        module_name=PIPELINE)
    flags.DEFINE_integer("shuffle_buffer", 0, "Shuffle buffer in examples (0: sized to 256 MB "
                         "and at most the dataset).", lower_bound=0, module_name=PIPELINE)
    flags.DEFINE_bool("random_flip", False, "Random left-right flips in training.",
                      module_name=PIPELINE)
    flags.DEFINE_bool("standardize", False, "Per-image standardization (zero mean, unit "
                      "variance).", module_name=PIPELINE)
    flags.DEFINE_bool("deterministic", False, "Keep element order through parallel input stages "
                      "(slower; off by default).", module_name=PIPELINE)
    flags.DEFINE_bool("data_autotune", False, "Run tf.data's autotune thread (off: each AUTOTUNE "
                      "stage runs min(16, cores) calls, and epochs end without its teardown "
                      "stall).", module_name=PIPELINE)
    flags.DEFINE_float("data_ram_budget_mb", 0.0, "tf.data autotune's RAM budget in MB (0: TF's "
                       "default); needs --data_autotune.", lower_bound=0.0, module_name=PIPELINE)


def pipeline_config(batch_size, drop_remainder=False):
    """The `tfaccel.data.PipelineConfig` the pipeline flags ask for."""
    from tfaccel.data import PipelineConfig

    if FLAGS.data_ram_budget_mb and not FLAGS.data_autotune:
        raise ConfigError(f"--data_ram_budget_mb={FLAGS.data_ram_budget_mb:g} is tf.data "
                          "autotune's RAM budget: add --data_autotune, or drop it")
    return PipelineConfig(batch_size=batch_size, cache=FLAGS.cache,
                          shuffle_buffer=FLAGS.shuffle_buffer or None,
                          random_flip=FLAGS.random_flip, standardize=FLAGS.standardize,
                          deterministic=FLAGS.deterministic, drop_remainder=drop_remainder,
                          on_bad_example=FLAGS.on_bad_example, autotune=FLAGS.data_autotune,
                          ram_budget_mb=FLAGS.data_ram_budget_mb or None)


def define_schedule_flags():
    """--lr_schedule, --warmup_epochs, --decay_epochs, --decay_rate, --min_lr_ratio, piecewise."""
    flags.DEFINE_string("lr_schedule", "constant", "Learning-rate schedule: "
                        f"{', '.join(choices.SCHEDULES)}.", module_name=SCHEDULE)
    check_choice("lr_schedule", "learning-rate schedule", choices.SCHEDULES)
    flags.DEFINE_float("warmup_epochs", 0.0, "Linear warmup from 0 to --learning_rate (epochs).",
                       module_name=SCHEDULE)
    flags.DEFINE_float("decay_epochs", None, "step: epochs between decays; exponential, "
                       "polynomial, cosine: decay length; cosine_restarts: first cycle; "
                       "epoch_exponential: epochs kept before decaying (default 10). Default: "
                       "derived from --epochs.", module_name=SCHEDULE)
    flags.DEFINE_float("decay_rate", 0.1, "step/exponential: factor per decay; epoch_exponential: "
                       "rate r of the per-epoch factor exp(-r).", module_name=SCHEDULE)
    flags.DEFINE_float("min_lr_ratio", 0.0, "cosine, cosine_restarts, polynomial: final learning "
                       "rate as a fraction of --learning_rate.", module_name=SCHEDULE)
    flags.DEFINE_list("lr_boundaries", [], "piecewise: epochs (after warmup) where the rate "
                      "changes.", module_name=SCHEDULE)
    flags.DEFINE_list("lr_multipliers", [], "piecewise: --learning_rate multipliers, one more "
                      "than --lr_boundaries.", module_name=SCHEDULE)


def define_host_allocator_flag():
    """--host_allocator (tfaccel.performance.memory.use_pooled_host_allocator)."""
    flags.DEFINE_enum("host_allocator", "pooled", choices.HOST_ALLOCATORS, "Host (CPU) tensors "
                      "from TensorFlow's pooled BFC allocator (faster parallel input pipelines; "
                      "keeps its peak) or from malloc (TensorFlow's default).",
                      module_name=PERFORMANCE)


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


def define_performance_flags():
    """--precision, --jit_compile, --grad_accum_steps, memory flags, batch-size search, monitor."""
    flags.DEFINE_string("precision", "float32", f"{', '.join(choices.PRECISIONS)}, or auto: "
                        "time each on the actual model and data and keep the fastest (never "
                        "slower than float32).", module_name=PERFORMANCE)
    check_choice("precision", "precision", (*choices.PRECISIONS, "auto"))
    flags.DEFINE_string("jit_compile", "false", f"XLA: {', '.join(choices.JIT_CHOICES)} (auto: "
                        "measured like --precision=auto).", module_name=PERFORMANCE)
    check_choice("jit_compile", "jit_compile", choices.JIT_CHOICES, lower=True)
    flags.DEFINE_integer("grad_accum_steps", 1, "Split each --batch_size batch into N "
                         "micro-batches and accumulate their gradients into one update (memory "
                         "of batch/N).", module_name=PERFORMANCE)
    flags.DEFINE_bool("memory_growth", False, "Allocate GPU memory on demand instead of all up "
                      "front.", module_name=PERFORMANCE)
    flags.DEFINE_integer("gpu_memory_limit", None, "Cap each GPU at this many MB.",
                         module_name=PERFORMANCE)
    flags.DEFINE_string("gpu_allocator", "default", "GPU allocator: "
                        f"{', '.join(choices.ALLOCATORS)} (cuda_malloc_async: CUDA's "
                        "stream-ordered memory pool).", module_name=PERFORMANCE)
    check_choice("gpu_allocator", "GPU allocator", choices.ALLOCATORS)
    define_host_allocator_flag()
    flags.DEFINE_integer("max_batch_size", 1024, "--batch_size=auto: largest size to try.",
                         module_name=PERFORMANCE)
    flags.DEFINE_float("memory_budget_mb", None, "--batch_size=auto on CPU: reject sizes whose "
                       "peak RSS exceeds this (default: current RSS + half the available "
                       "memory).", module_name=PERFORMANCE)
    flags.DEFINE_integer("monitor_every_n_steps", 50, "Log GPU (NVML) or CPU utilization and "
                         "memory every N steps to TensorBoard; 0: off.", module_name=PERFORMANCE)


def lr_schedule(learning_rate, steps_per_epoch):
    """The `tfaccel.train.schedules` schedule the schedule flags ask for."""
    from tfaccel.train.schedules import make_schedule

    def floats(values, name):
        try:
            return [float(v) for v in values]
        except ValueError:
            raise ConfigError(f"--{name}={','.join(values)} must be comma-separated numbers"
                              ) from None

    return make_schedule(FLAGS.lr_schedule, learning_rate, steps_per_epoch=steps_per_epoch,
                         epochs=FLAGS.epochs, warmup_epochs=FLAGS.warmup_epochs,
                         decay_epochs=FLAGS.decay_epochs, decay_rate=FLAGS.decay_rate,
                         min_lr_ratio=FLAGS.min_lr_ratio,
                         boundaries=floats(FLAGS.lr_boundaries, "lr_boundaries"),
                         multipliers=floats(FLAGS.lr_multipliers, "lr_multipliers"))


RECIPES_DIR = os.path.dirname(os.path.abspath(__file__))


def _is_recipe_module(module_name):
    if module_name in GROUPS or module_name == "__main__":
        return True
    if os.path.abspath(module_name) == os.path.abspath(sys.argv[0]):
        return True
    leaf = module_name.rpartition(".")[2]
    return os.path.exists(os.path.join(RECIPES_DIR, leaf + ".py"))


def _recipe_flags():
    return [flag for module, module_flags in FLAGS.flags_by_module_dict().items()
            if _is_recipe_module(module) for flag in module_flags]


def flag_values():
    """{flag: value} of the flags the recipes define (absl's own left out), for reports."""
    return {flag.name: flag.value for flag in _recipe_flags()}


def command_line():
    """The command that reproduces this run."""
    return " ".join(["python", *sys.argv])


def reject_extra_args(argv):
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {' '.join(argv[1:])!r}: every option is a "
                          "--flag (see --helpshort)")


def check_output_dirs(prefix=""):
    """Raises ConfigError unless --model_dir (default_model_dir(prefix)) and --backup_dir, if
    given, can be created and written; writes nothing. Call it before any work."""
    from tfaccel.io import check_writable_dir

    check_writable_dir(default_model_dir(prefix), "--model_dir")
    if "backup_dir" in FLAGS and FLAGS.backup_dir:
        check_writable_dir(FLAGS.backup_dir, "--backup_dir")


# --- Checks that run while the flags are parsed, before TensorFlow loads.

_CHECKS = []


def check_flag(name, check):
    """Runs `check(value)` on --name right after parsing; a ConfigError it raises is the line."""
    _CHECKS.append((name, check))


def check_choice(name, what, options, lower=False):
    """--name must be one of `options` (`lower`: compared lower-cased); None passes."""

    def check(value):
        key = str(value).strip().lower() if lower and value is not None else value
        if value is not None and key not in options:
            raise ConfigError(f"unknown {what} {value!r}: use one of {', '.join(options)}")

    check_flag(name, check)


def require_ints(name, what, count=None, example=None, rule=None, allow_empty=False):
    """List flag --name must be positive integers (`count` of them, and `rule(ints)` true).

    `what` describes a valid value for the message, `example` is one (default: the flag's
    default).
    """

    def check(values):
        if allow_empty and not values:
            return
        try:
            ints = [int(v) for v in values]
        except ValueError:
            ints = []
        if (not ints or min(ints) < 1 or (count is not None and len(ints) != count)
                or (rule is not None and not rule(ints))):
            shown = example or ",".join(FLAGS[name].default or [])
            raise ConfigError(f"--{name}={','.join(values)} must be {what}"
                              + (f", e.g. --{name}={shown}" if shown else ""))

    check_flag(name, check)


def _number_hint(flag):
    """', e.g. --name=<default>' (a learning rate without one: --learning_rate's default)."""
    example = flag.default
    if example is None and flag.name.endswith("learning_rate") and "learning_rate" in FLAGS:
        example = FLAGS["learning_rate"].default
    return f", e.g. --{flag.name}={example:g}" if example is not None else ""


def _check_numbers():
    """Every float flag finite; every learning rate > 0 (nan, inf or 0 only waste a run)."""
    for flag in _recipe_flags():
        value = flag.value
        if not isinstance(flag.parser, flags.FloatParser) or value is None:
            continue
        if not math.isfinite(value):
            raise ConfigError(f"--{flag.name}={value} is not a finite number: give a number"
                              + _number_hint(flag))
        if flag.name.endswith("learning_rate") and value <= 0:
            raise ConfigError(f"--{flag.name}={value:g}: a learning rate must be > 0"
                              + _number_hint(flag))


_UNKNOWN = re.compile(r"Unknown command line flag '([^']+)'(?:\. Did you mean: (.+?) \?)?$")
_MISSING = re.compile(r"Missing value for flag (-+[^\s]+)")
_FLAGFILE = re.compile(r"Unable to open flagfile: (?:\[Errno \d+\] )?([^:]+): '(.*)'")
_ILLEGAL = re.compile(r"flag --([A-Za-z0-9_.-]+)=(.*?): (.*)$", re.DOTALL)
_REASONS = ((re.compile(r"invalid literal for int\(\)"), "not an integer"),
            (re.compile(r"could not convert string to float"), "not a number"),
            (re.compile(r"Non-boolean argument"), "not true or false"))
_KINDS = {"IntegerParser": "an integer", "FloatParser": "a number",
          "BooleanParser": "true or false"}


def _shown_value(text):
    if text.startswith("["):  # a list flag's value as absl prints it
        try:
            return ",".join(map(str, ast.literal_eval(text)))
        except (ValueError, SyntaxError):
            pass
    return text


def _value_fix(name):
    """'give an integer >= 1, e.g. --epochs=30' for the flag `name`."""
    if name not in FLAGS:
        return "see --helpshort"
    flag = FLAGS[name]
    kind = _KINDS.get(type(flag.parser).__name__, "a valid value")
    bounds = [f"{op} {bound:g}" for op, bound in ((">=", getattr(flag.parser, "lower_bound", None)),
                                                  ("<=", getattr(flag.parser, "upper_bound", None)))
              if bound is not None]
    example = flag.default
    if isinstance(example, bool):
        example = str(example).lower()
    elif isinstance(example, (list, tuple)):
        example = ",".join(map(str, example)) or None
    return (f"give {kind}{' ' + ' and '.join(bounds) if bounds else ''}"
            + (f", e.g. --{name}={example}" if example is not None else ""))


def flag_error_message(error):
    """absl's flag error as one line that names the flag and what to give instead."""
    text = " ".join(str(error).split())
    if match := _UNKNOWN.search(text):
        name, guesses = match.groups()
        if guesses:
            return (f"unknown flag --{name}: did you mean --{guesses.split(',')[0].strip()}? "
                    "(--helpshort lists every flag of this recipe)")
        return f"unknown flag --{name}: --helpshort lists every flag of this recipe"
    if match := _MISSING.search(text):
        return f"flag {match.group(1)} needs a value: write {match.group(1)}=VALUE"
    if match := _FLAGFILE.search(text):
        reason, path = match.groups()
        return (f"cannot open --flagfile={path} ({reason.strip()}): give an existing flag file, "
                "e.g. one in recipes/presets/")
    if match := _ILLEGAL.match(text):
        name, value, reason = match.groups()
        value = _shown_value(value)
        if value.startswith("--"):  # `--epochs --model_dir=x`: absl took the next flag as value
            return (f"flag --{name} needs a value (it took {value!r} as one): write "
                    f"--{name}=VALUE")
        if enum := re.match(r"value should be one of <(.*)>$", reason):
            return f"--{name}={value}: use one of {', '.join(enum.group(1).split('|'))}"
        if name.endswith("learning_rate") and "non-negative" in reason:
            return f"--{name}={value}: a learning rate must be > 0{_number_hint(FLAGS[name])}"
        for pattern, plain in _REASONS:
            if pattern.search(reason):
                reason = plain
        if "use " in reason or "e.g." in reason:
            return f"--{name}={value}: {reason}"
        return f"--{name}={value}: {reason}: {_value_fix(name)}"
    return f"{text}: see --helpshort"


def _fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def parse_flags(argv):
    """absl's flags_parser for the recipes: every bad flag is one 'error:' line and exit 2.

    Also rejects stray arguments, runs the checks registered with `check_flag`, and rejects
    nan/inf floats and learning rates <= 0, all before TensorFlow is imported.
    """
    try:
        argv = FLAGS(argv)
        reject_extra_args(argv)
        for name, check in _CHECKS:
            if name in FLAGS:
                check(FLAGS[name].value)
        _check_numbers()
    except flags.Error as e:
        _fail(flag_error_message(e))
    except TfaccelError as e:
        _fail(str(e))
    return argv


def recipe_help():
    """--help: the recipe's docstring, its own flags, then each group of shared flags."""
    doc = (sys.modules["__main__"].__doc__ or f"USAGE: {sys.argv[0]} [flags]\n").rstrip()
    sections = "\n".join(FLAGS.module_help(module) for module in (sys.argv[0], *GROUPS))
    return (f"{doc}\n\nflags:{sections}\n\n--flagfile=FILE reads flags from a file (see "
            "recipes/presets/); --helpfull also lists absl's own flags.")


class _HelpFlag(flags.BooleanFlag):
    """--help / --helpshort / -?: `recipe_help` on stdout, exit 0."""

    def __init__(self, name, short_name=None):
        super().__init__(name, False, "show this recipe's flags, grouped", short_name=short_name,
                         allow_hide_cpp=True, allow_override=True)

    def parse(self, argument):
        if self._parse(argument):
            try:
                print(recipe_help(), flush=True)
            except BrokenPipeError:  # `--help | head`
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)


def _define_help_flags():
    app.define_help_flags()  # absl's (--helpfull, --helpxml); ours replace --help, --helpshort
    flags.DEFINE_flag(_HelpFlag("help", short_name="?"), module_name="absl.app")
    flags.DEFINE_flag(_HelpFlag("helpshort"), module_name="absl.app")


def run(main, model_dir_prefix=""):
    """Runs `main` under absl: flag errors and a TfaccelError become one 'error:' line, exit 2.

    Once the flags are parsed and checked, --model_dir (`default_model_dir(model_dir_prefix)`)
    and --backup_dir are checked writable, then TensorFlow is imported (without its start-up
    chatter), then `main` runs.
    """

    def guarded(argv):
        try:
            check_output_dirs(model_dir_prefix)
            from tfaccel.quiet import import_tensorflow

            import_tensorflow()
            return main(argv)
        except TfaccelError as e:
            _fail(str(e))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)

    logging.set_verbosity(logging.WARNING)
    _define_help_flags()
    app.run(guarded, flags_parser=parse_flags)
