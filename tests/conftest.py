"""Shared test setup.

The CPU is split into two logical devices before TensorFlow initializes, so
that MirroredStrategy code paths run here without GPUs (as Keras's own tests
do). Recipes are run as real subprocesses.
"""

import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(ROOT, "recipes")
NUM_CPU_DEVICES = 2

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(NUM_CPU_DEVICES)])


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


@pytest.fixture
def recipe():
    """Fixture form of `run_recipe`."""
    return run_recipe
