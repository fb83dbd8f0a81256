"""tfaccel.resume: backups, where training resumes, and a real kill -9 of the train recipe."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import tensorflow as tf
from conftest import RECIPES, ROOT

from tfaccel import distribute, resume
from tfaccel.errors import ConfigError
from tfaccel.keras import keras


class _Crash(Exception):
    pass


class _CrashAt(keras.callbacks.Callback):
    """Raises at the start of global step `step` (counted from 1), like a killed process."""

    def __init__(self, step):
        super().__init__()
        self.step = step
        self.seen = 0

    def on_train_batch_begin(self, batch, logs=None):
        self.seen += 1
        if self.seen == self.step:
            raise _Crash(f"crash at step {self.step}")


class _Record(keras.callbacks.Callback):
    """Records the epochs that run and the weights and step count `fit` starts from."""

    def __init__(self):
        super().__init__()
        self.epochs = []

    def on_train_begin(self, logs=None):
        self.start_weights = [w.copy() for w in self.model.get_weights()]
        self.start_iterations = int(self.model.optimizer.iterations.numpy())

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


def _model(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    return model


def _data():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 4)).astype(np.float32), rng.integers(0, 3, 16)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(4)  # 4 steps per epoch


@pytest.mark.parametrize("strategy_name, freq, crash_step, resumed_at, first_epoch, iterations", [
    ("default", "epoch", 10, (3, 0), 2, 8),  # crash in epoch 3: epochs 1-2 were backed up
    ("default", 3, 8, (2, 2), 1, 6),  # backups every 3 steps: the last after step 6 = epoch 2, step 2
    ("mirrored", 3, 8, (2, 2), 1, 6),
])
def test_training_resumes_where_the_last_backup_was(tmp_path, strategy_name, freq, crash_step,
                                                    resumed_at, first_epoch, iterations):
    strategy = distribute.make_strategy(strategy_name)
    messages = []
    model = _model(strategy)
    crashed_weights = []

    class _Snapshot(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == iterations:
                crashed_weights.append([w.copy() for w in self.model.get_weights()])

    with pytest.raises(_Crash):
        model.fit(_data(), epochs=5, verbose=0, callbacks=[
            *resume.backup_callbacks(tmp_path, freq, epochs=5, printer=messages.append),
            _Snapshot(), _CrashAt(crash_step)])
    assert messages == [f"resume: no backup in {tmp_path}: starting from epoch 1"]

    model, record = _model(strategy), _Record()
    callbacks = resume.backup_callbacks(tmp_path, freq, epochs=5, printer=messages.append)
    model.fit(_data(), epochs=5, verbose=0, callbacks=[*callbacks, record])
    assert callbacks[-1].resumed_at == resumed_at
    assert re.fullmatch(rf"resume: continuing from backup \S+ at epoch {resumed_at[0]}/5, "
                        rf"step {resumed_at[1]}", messages[-1])
    assert record.epochs[0] == first_epoch and record.epochs[-1] == 4
    assert record.start_iterations == iterations
    for restored, saved in zip(record.start_weights, crashed_weights[-1]):
        np.testing.assert_array_equal(restored, saved)
    assert not tmp_path.exists()  # a finished fit deletes its backups and their folder


def test_backup_arguments_are_checked():
    assert resume.parse_backup_freq("epoch") == "epoch"
    assert resume.parse_backup_freq("25") == 25
    for bad in ("0", "-3", "often", None):
        with pytest.raises(ConfigError, match="must be 'epoch' or a positive number of steps"):
            resume.parse_backup_freq(bad)
    with pytest.raises(ConfigError, match="backup_dir is empty"):
        resume.backup_callbacks("", "epoch")


# --- Slow: kill -9 the real recipe, rerun the same command.

@pytest.mark.slow
def test_recipe_resumes_after_kill_9(tmp_path):
    epochs = 6
    command = [sys.executable, os.path.join(RECIPES, "train.py"), f"--epochs={epochs}",
               "--learning_rate=3e-3", f"--model_dir={tmp_path / 'run'}"]
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    first = subprocess.Popen(command, env=env, cwd=ROOT, text=True, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True)
    lines = []

    def read():
        for line in iter(first.stdout.readline, ""):
            lines.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    try:
        # "Epoch 2/6" is printed after epoch 1's end callbacks, the backup among them.
        while not any(line.startswith(f"Epoch 2/{epochs}") for line in lines):
            assert first.poll() is None, "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "no second epoch within 240s"
            time.sleep(0.05)
        delay = random.uniform(0, 2.0)
        print(f"killing the first run {delay:.2f}s after its first backup")
        time.sleep(delay)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    reader.join(timeout=10)
    assert first.returncode == -signal.SIGKILL
    done_before_kill = max(int(m.group(1)) for m in
                           (re.match(rf"Epoch (\d+)/{epochs}", line) for line in lines) if m)
    assert not (tmp_path / "run" / "metrics.json").exists()

    second = subprocess.run(command, env=env, cwd=ROOT, text=True, capture_output=True,
                            timeout=300)
    assert second.returncode == 0, second.stderr[-3000:]
    match = re.search(rf"^resume: continuing from backup \S+ at epoch (\d+)/{epochs}, step 0$",
                      second.stdout, re.MULTILINE)
    assert match, second.stdout[-3000:]
    resumed = int(match.group(1))
    # It resumed after the last completed epoch: at the one that was running when killed,
    # or the next one if that epoch's backup was written just before the kill.
    assert 2 <= resumed and done_before_kill <= resumed <= done_before_kill + 1
    ran = [int(e) for e in re.findall(rf"^Epoch (\d+)/{epochs}$", second.stdout, re.MULTILINE)]
    assert ran == list(range(resumed, epochs + 1))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    print(f"killed after 'Epoch {done_before_kill}/{epochs}' was printed, resumed at epoch {resumed}, "
          f"test accuracy {metrics['test_accuracy']:.4f}")
    assert metrics["resumed_at_epoch"] == resumed
    assert metrics["test_accuracy"] >= 0.95
    assert not (tmp_path / "run" / "backup").exists()
