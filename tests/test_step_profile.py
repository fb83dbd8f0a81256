"""tfaccel.performance.step_profile: a profiler trace of chosen steps, and its op times."""

import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import check_flag_error

from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.performance import step_profile


def test_traces_the_chosen_steps_under_the_logdir_and_sums_their_ops(tmp_path):
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10)])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).normal(size=(8 * 16, 64)).astype("float32")
    ds = tf.data.Dataset.from_tensor_slices((x, np.arange(len(x)) % 10)).batch(16)
    lines = []
    profile = step_profile.ProfileSteps(tmp_path / "train", 3, 5, printer=lines.append)
    model.fit(ds, epochs=1, verbose=0, callbacks=[profile])
    path = step_profile.last_trace(tmp_path / "train")
    assert path and path.startswith(os.path.join(str(tmp_path / "train"), "plugins", "profile"))
    table = {row["op"]: row for row in profile.table}
    products = [row for op, row in table.items() if "MatMul" in op]  # oneDNN fuses some
    # 2 layers: 2 products forward, 3 backward (no input gradient for the first), per step.
    assert sum(row["ops_per_step"] for row in products) == pytest.approx(5, abs=0.5), table
    assert all(row["ms_per_step"] > 0 for row in products)
    assert sum(row["share"] for row in profile.table) == pytest.approx(1.0)
    assert "Process" not in table  # the executor's wrapper events are not ops
    assert lines and lines[0].startswith("profile of steps 3-5 (")


def test_a_fit_shorter_than_the_range_ends_the_trace_with_it(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile("sgd", "mse")
    profile = step_profile.ProfileSteps(tmp_path, 2, 50, printer=None)
    model.fit(np.ones((32, 4)), np.ones((32, 2)), batch_size=8, epochs=1, verbose=0,
              callbacks=[profile])
    assert step_profile.last_trace(tmp_path) and profile.table
    assert step_profile.last_trace(tmp_path / "nothing") is None


@pytest.mark.parametrize("start,stop", [(0, 3), (5, 2), (1.5, 3)])
def test_bad_step_ranges_are_refused(start, stop):
    with pytest.raises(ConfigError, match="1 <= start <= stop, e.g. 20,24"):
        step_profile.check_profile_steps(start, stop)


def test_train_lm_refuses_a_bad_range_in_one_line(tmp_path):
    check_flag_error("train_lm", f"--model_dir={tmp_path / 'run'}", "--profile_steps=9,2",
                     line="--profile_steps=9,2 must be start,stop: two step numbers, start <= "
                     "stop, e.g. --profile_steps=20,24")
