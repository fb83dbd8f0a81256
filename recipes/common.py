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


def define_train_flags(epochs=30, batch_size=64, learning_rate=1e-3):
    """--epochs, --batch_size, --optimizer, --learning_rate, --model_dir, --seed."""
    from tfaccel.training import OPTIMIZERS

    flags.DEFINE_integer("epochs", epochs, "Training epochs.", lower_bound=0)
    flags.DEFINE_integer("batch_size", batch_size, "Global batch size (over all replicas).",
                         lower_bound=1)
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
