"""Shared test setup.

The CPU is split into two logical devices before TensorFlow initializes, so
that MirroredStrategy code paths run here without GPUs (as Keras's own tests
do). Recipes are run as real subprocesses.
"""

import os
import resource
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(ROOT, "recipes")
NUM_CPU_DEVICES = 2

MAX_WORKERS = 4


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject.toml): one worker per core, at most MAX_WORKERS.

    Every worker trains models and starts recipe subprocesses with their own
    TensorFlow; more than a few at once would measure the machine's memory, not tfaccel.
    """
    del config
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(cores or 1, MAX_WORKERS))


def pytest_collection_modifyitems(config, items):
    """The `slow` tests first, so that parallel workers start on the long ones and finish
    together on the short ones (otherwise one long test started last sets the end)."""
    del config
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_CPU_DEVICES)])


FLAVOURS = ("tf_keras", "keras3")
"""The Kerases tests of shared behaviour run on (`flavour` fixture, or parametrize over it)."""


@pytest.fixture(params=FLAVOURS)
def flavour(request):
    """'tf_keras' then 'keras3': a test taking it runs on models of both Kerases."""
    return request.param


def keras_of_flavour(flavour):
    """The Keras package of `flavour` (tf_keras, or Keras 3 imported now)."""
    from tfaccel.keras import keras_for

    return keras_for(flavour)


def digits_arrays(split):
    """(images, labels) NumPy arrays of a `tfaccel.data` split (e.g. the bundled digits')."""
    import numpy as np

    x, y = zip(*split.as_numpy_iterator())
    return np.stack(x), np.asarray(y)


def mirrored_strategy():
    """MirroredStrategy over the logical CPU devices, as tfaccel builds it.

    Built by `tfaccel.distribute.make_strategy`, which reduces with
    ReductionToOneDevice on CPUs: TensorFlow's default (collective ops) clashes
    between two strategies made in one process ("Shape mismatch in the
    collective instance").
    """
    from tfaccel.distribute import make_strategy

    return make_strategy("mirrored")


def run_recipe(name, *args, timeout=600, env=None, cwd=None):
    """Runs recipes/<name>.py with flags in a subprocess; returns the CompletedProcess."""
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, full_env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, os.path.join(RECIPES, f"{name}.py"), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd or ROOT,
    )


FLAG_ERROR_CPU_SECONDS = 2.0
"""A bad flag's error costs its process well under a second of CPU (~0.1 s: Python, absl and
the recipe's flag checks); importing TensorFlow alone costs 6-7 s of CPU here. CPU time, not
the clock: a loaded 2-core machine stretches the clock, not the work, so the bound fails on a
TensorFlow import and holds at any load."""


def run_with_cpu_seconds(command, **kwargs):
    """`subprocess.run(command, **kwargs)` and the CPU seconds (user + system) the process and
    its children used, from the kernel's accounting of waited-for children (so one call at a
    time per process: concurrent calls would count each other's)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(command, **kwargs)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return proc, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def check_flag_error(name, *args, line, env=None):
    """Runs recipes/<name>.py with bad flags: exit 2, `error: <line>` the one line on stderr
    (no traceback), within FLAG_ERROR_CPU_SECONDS of CPU. Returns the CompletedProcess."""
    full_env = dict(os.environ, **(env or {}))
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, full_env.get("PYTHONPATH")]))
    proc, seconds = run_with_cpu_seconds(
        [sys.executable, os.path.join(RECIPES, f"{name}.py"), *map(str, args)],
        capture_output=True, text=True, timeout=120, env=full_env, cwd=ROOT)
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [f"error: {line}"], proc.stderr[-2000:]
    assert seconds < FLAG_ERROR_CPU_SECONDS, (
        f"{name} {' '.join(args)} used {seconds:.2f} s of CPU (limit {FLAG_ERROR_CPU_SECONDS} s)")
    return proc


def launch_recipe(name, *args, workers=2, tmpdir, timeout=900):
    """Runs recipes/<name>.py as `workers` local workers (`tfaccel launch`), with the system's
    temporary folder at `tmpdir` (where non-chief workers write); returns the CompletedProcess.
    """
    env = {k: v for k, v in os.environ.items()
           if k not in ("TF_CONFIG", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    os.makedirs(tmpdir, exist_ok=True)
    env["TMPDIR"] = str(tmpdir)
    return subprocess.run(
        [sys.executable, "-m", "tfaccel", "launch", "--workers", str(workers), "--timeout",
         str(timeout - 60), "--", os.path.join(RECIPES, f"{name}.py"), *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)


def check_only_chief_wrote(proc, model_dir, tmpdir):
    """Asserts that a 2-worker launch kept only the chief's files.

    Every event file under `model_dir` comes from worker 0's process (TensorBoard names them
    `events.out.tfevents.<time>.<host>.<pid>.<n>`, with `.v2` after files TensorFlow's
    summary ops write, without it after `summaries.ScalarFile`'s), worker 1 wrote to a
    temporary folder that
    is gone, and no `tfaccel-worker*` folder is left in `tmpdir`. Returns `model_dir`'s names.
    """
    import re

    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    pids = {int(i): p for i, p in re.findall(r"^launch: worker (\d) is pid (\d+)", proc.stdout,
                                             re.MULTILINE)}
    assert set(pids) == {0, 1}, proc.stdout[-2000:]
    events = [name for _, _, names in os.walk(model_dir) for name in names
              if name.startswith("events.out.tfevents.")]
    writers = {re.fullmatch(r"events\.out\.tfevents\.\d+\..+\.(\d+)\.\d+(\.v2)?", name).group(1)
               for name in events}
    assert events and writers == {pids[0]}, events
    assert not any("workertemp" in d for _, dirs, _ in os.walk(model_dir) for d in dirs)
    other = re.search(r"^\[worker 1\] wrote (\S+):", proc.stdout, re.MULTILINE).group(1)
    assert other != str(model_dir) and not os.path.exists(other)
    assert os.path.dirname(other) == str(tmpdir)
    assert not [n for n in os.listdir(tmpdir) if n.startswith("tfaccel-")]
    return sorted(os.listdir(model_dir))


@pytest.fixture
def recipe():
    """Fixture form of `run_recipe`."""
    return run_recipe


# ---- a trained digits CNN and its TFLite files (test_tflite, test_tflite_eval)


def train_digits_cnn():
    """A digits CNN trained briefly, its test split as arrays, and its Keras predictions."""
    import numpy as np

    from tfaccel import data
    from tfaccel.keras import keras
    from tfaccel.train import models, training

    keras.utils.set_random_seed(0)
    splits = data.load_dataset("digits")
    model = models.build_model("cnn", splits.info.input_shape, splits.info.num_classes)
    training.compile_classifier(model, training.make_optimizer("adam", 2e-3))
    model.fit(data.batch_dataset(splits.train, 64, training=True), epochs=4, verbose=0)
    x, y = (np.concatenate(a) for a in zip(*data.batch_dataset(
        splits.test, 512, training=False).as_numpy_iterator()))
    return splits, model, x, y, model.predict(x, verbose=0).argmax(-1)


def convert_float_and_int8(trained, out):
    """{'float': path, 'int8': path} of the trained model converted into directory `out`."""
    from tfaccel.compress import tflite

    splits, model, *_ = trained
    return {mode: tflite.convert_to_tflite(model, str(out / f"{mode}.tflite"), mode=mode,
                                           representative_data=splits.train,
                                           num_calibration_samples=100)
            for mode in ("float", "int8")}


@pytest.fixture(scope="session")
def trained():
    """(splits, model, x_test, y_test, Keras predictions) of a briefly trained digits CNN."""
    return train_digits_cnn()


@pytest.fixture(scope="session")
def files(trained, tmp_path_factory):
    """{'float': path, 'int8': path} of `trained`'s model converted to TFLite."""
    return convert_float_and_int8(trained, tmp_path_factory.mktemp("tflite"))
