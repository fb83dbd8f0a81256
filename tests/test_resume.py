"""tfaccel.train.resume: backups, where training resumes, and a real kill -9 of the train recipe."""

import datetime
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
from conftest import FLAVOURS, RECIPES, ROOT, keras_of_flavour

from tfaccel import data, distribute
from tfaccel.errors import ConfigError, TrainingError
from tfaccel.keras import keras
from tfaccel.train import resume, training


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


def _model(strategy, flavour="tf_keras"):
    keras = keras_of_flavour(flavour)
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
        model.compile(keras.optimizers.SGD(0.1), "sparse_categorical_crossentropy")
    return model


def _data():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 4)).astype(np.float32), rng.integers(0, 3, 16)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(4)  # 4 steps per epoch


@pytest.mark.parametrize(
    "strategy_name, freq, crash_step, backed_up, resumed_at, first_epoch, iterations", [
        # Crash in epoch 3: epochs 1-2 backed up (no step is recorded: nothing runs per step).
        ("default", "epoch", 10, (2, None), (3, 0), 2, 8),
        ("default", "0s", 10, (2, None), (3, 0), 2, 8),  # no time between backups: every epoch
        # backups every 3 steps: the last after step 6 = epoch 2, step 2
        ("default", 3, 8, (2, 2), (2, 2), 1, 6),
        ("mirrored", 3, 8, (2, 2), (2, 2), 1, 6),
    ])
def test_training_resumes_where_the_last_backup_was(tmp_path, strategy_name, freq, crash_step,
                                                    backed_up, resumed_at, first_epoch,
                                                    iterations):
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
    backup = resume.read_backup(tmp_path)
    assert (backup.epoch, backup.step) == backed_up and os.path.exists(backup.path + ".index")

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


def test_a_kept_backup_of_finished_training_trains_nothing_more(tmp_path):
    model, messages = _model(distribute.make_strategy("default")), []
    model.fit(_data(), epochs=3, verbose=0, callbacks=resume.backup_callbacks(
        tmp_path, epochs=3, printer=messages.append, delete_after_fit=False))
    backup = resume.read_backup(tmp_path)
    assert backup.epoch == 3  # kept: results can be written after fit
    trained = model.get_weights()

    model, record = _model(distribute.make_strategy("default")), _Record()
    callbacks = resume.backup_callbacks(tmp_path, epochs=3, printer=messages.append,
                                        delete_after_fit=False)
    history = model.fit(_data(), epochs=3, verbose=0, callbacks=[*callbacks, record])
    assert re.fullmatch(r"resume: backup \S+ holds the finished training \(epoch 3/3\): nothing "
                        r"left to train, writing the results again", messages[-1])
    assert callbacks[-1].finished and callbacks[-1].resumed_at == (4, 0)
    assert record.epochs == [] and history.history == {}
    for restored, saved in zip(model.get_weights(), trained):
        np.testing.assert_array_equal(restored, saved)
    resume.remove_backup(tmp_path)
    assert not tmp_path.exists() and resume.read_backup(tmp_path) is None


class _Clock:
    """A clock that `_Tick` moves on by `seconds_per_epoch` at each epoch begin."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class _Tick(keras.callbacks.Callback):
    def __init__(self, clock, seconds_per_epoch, stop_after=None):
        super().__init__()
        self.clock, self.seconds, self.stop_after = clock, seconds_per_epoch, stop_after

    def on_epoch_begin(self, epoch, logs=None):
        self.clock.now += self.seconds

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.stop_after:
            self.model.stop_training = True  # as EarlyStopping does


def test_timed_backups_skip_short_epochs_and_always_keep_the_last(tmp_path):
    clock, model = _Clock(), _model(distribute.make_strategy("default"))
    weights = str(tmp_path / "checkpoints" / "ckpt-{epoch:03d}.weights.h5")
    backup = resume.PeriodicBackup(tmp_path / "backup", "25s", delete_checkpoint=False,
                                   weights_path=weights, clock=clock)
    model.fit(_data(), epochs=5, verbose=0, callbacks=[backup, _Tick(clock, 10)])
    # Epoch ends at 10, 20, 30 (25 s after the start: backed up), 40 (10 s after), 50 (the last).
    assert backup.backed_up_epochs == [2, 4]
    assert resume.read_backup(tmp_path / "backup").epoch == 5
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["ckpt-003.weights.h5",
                                                            "ckpt-005.weights.h5"]
    saved = _model(distribute.make_strategy("default"))
    saved.load_weights(weights.format(epoch=5))
    for a, b in zip(saved.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_run_stopped_early_backs_up_its_last_epoch_when_the_backup_is_kept(tmp_path):
    clock, model = _Clock(), _model(distribute.make_strategy("default"))
    backup = resume.PeriodicBackup(tmp_path, "1000s", delete_checkpoint=False, clock=clock)
    model.fit(_data(), epochs=5, verbose=0, callbacks=[backup, _Tick(clock, 1, stop_after=1)])
    assert backup.backed_up_epochs == [1]  # not due by time: backed up as fit ended
    assert resume.read_backup(tmp_path).epoch == 2


def test_a_crash_before_the_interval_resumes_from_the_start(tmp_path):
    clock, model, messages = _Clock(), _model(distribute.make_strategy("default")), []
    callbacks = resume.backup_callbacks(tmp_path, "1000s", epochs=5, printer=messages.append)
    callbacks[0].clock = clock
    with pytest.raises(_Crash):
        model.fit(_data(), epochs=5, verbose=0,
                  callbacks=[*callbacks, _Tick(clock, 10), _CrashAt(10)])
    assert resume.read_backup(tmp_path) is None


def test_no_step_backup_holds_a_non_finite_loss(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(16, 4)).astype(np.float32), rng.integers(0, 3, 16)
    x[9] = np.nan  # batch 3 of 4
    model = _model(distribute.make_strategy("default"))
    with pytest.raises(TrainingError, match="at epoch 1, step 3"):  # read at the epoch's end
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(4), epochs=2, verbose=0,
                  callbacks=[training.StopOnNonFiniteLoss(), *resume.backup_callbacks(
                      tmp_path, 1, epochs=2, printer=lambda _: None)])
    backup = resume.read_backup(tmp_path)
    assert (backup.epoch, backup.step) == (1, 2)  # steps 1 and 2 backed up, not 3 and 4
    assert all(np.isfinite(tf.train.load_checkpoint(backup.path).get_tensor(name)).all()
               for name, _ in tf.train.list_variables(backup.path) if "kernel" in name)


def test_backup_arguments_are_checked():
    assert resume.parse_backup_freq("epoch") == "epoch"
    assert resume.parse_backup_freq("25") == 25
    assert resume.parse_backup_freq("60s") == datetime.timedelta(seconds=60)
    assert resume.parse_backup_freq("1.5s") == datetime.timedelta(seconds=1.5)
    for bad in ("s", "-5s", "60m", "1e3s"):
        with pytest.raises(ConfigError, match="e.g. 60s"):
            resume.parse_backup_freq(bad)
    for bad in ("0", "-3", "often", None):
        with pytest.raises(ConfigError, match="must be 'epoch', a positive number of steps"):
            resume.parse_backup_freq(bad)
    with pytest.raises(ConfigError, match="backup_dir is empty"):
        resume.backup_callbacks("", "epoch")


# --- kill -9 the real recipe, rerun the same command.

def _env():
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [ROOT, env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _train_command(model_dir, epochs, *extra, backup_freq="epoch"):
    """The recipe's command; backups every epoch unless `backup_freq` is None (the default,
    60s, backs up the digits' short epochs only after the last one: nothing to kill after)."""
    freq = [f"--backup_freq={backup_freq}"] if backup_freq else []
    return [sys.executable, os.path.join(RECIPES, "train.py"), f"--epochs={epochs}",
            "--learning_rate=3e-3", f"--model_dir={model_dir}", *freq, *extra]


class _Run:
    """The recipe as a subprocess whose output is read as it comes, to kill it on an event."""

    def __init__(self, command, env=None):
        self.started = time.time()
        self.proc = subprocess.Popen(command, env=env or _env(), cwd=ROOT, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in iter(self.proc.stdout.readline, ""):
            self.lines.append(line)

    def wait_for(self, event, timeout=240):
        """True once `event()` holds; False if the process ended first."""
        deadline = time.monotonic() + timeout
        while not event():
            if self.proc.poll() is not None:
                return event()
            assert time.monotonic() < deadline, (f"no event within {timeout}s:\n"
                                                 f"{self.output[-3000:]}")
            time.sleep(0.01)
        return True

    def kill(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.finish()

    def finish(self, timeout=300):
        self.proc.wait(timeout=timeout)
        self.reader.join(timeout=10)
        return self.proc.returncode

    @property
    def output(self):
        return "".join(self.lines)

    def epochs_run(self, epochs):
        return [int(e) for e in re.findall(rf"^Epoch (\d+)/{epochs}$", self.output, re.MULTILINE)]


def _written_since(path, run):
    return os.path.exists(path) and os.path.getmtime(path) >= run.started


def _expected_start(model_dir, epochs):
    """The line a rerun must start with, from what the killed run left on disk."""
    if training.read_finished_run(model_dir) is not None:
        return rf"^{re.escape(str(model_dir))} holds a finished run \(test accuracy [\d.]+ in "
    backup = resume.read_backup(model_dir / "backup")
    if backup is None:
        return r"^resume: no backup in \S+: starting from epoch 1$"
    if backup.epoch == epochs:
        return rf"^resume: backup \S+ holds the finished training \(epoch {epochs}/{epochs}\)"
    return rf"^resume: continuing from backup \S+ at epoch {backup.epoch + 1}/{epochs}, step 0$"


# Issue 17's Keras 3 run: mirrored on 2 logical CPUs, bfloat16, accumulation, a schedule.
KERAS3_COMBINED = ("--keras=keras3", "--strategy=mirrored", "--cpu_devices=2",
                   "--precision=mixed_bfloat16", "--grad_accum_steps=2", "--batch_size=64",
                   "--lr_schedule=cosine", "--warmup_epochs=1")
BACKUP_WRITTEN = {"tf_keras": os.path.join("backup", "chief", "checkpoint"),
                  "keras3": os.path.join("backup", "training_metadata.json")}


@pytest.mark.slow
@pytest.mark.parametrize("flavour, flags", [("tf_keras", ()), ("keras3", KERAS3_COMBINED)])
def test_recipe_resumes_after_kill_9(tmp_path, flavour, flags):
    epochs, model_dir = 6, tmp_path / "run"
    command = _train_command(model_dir, epochs, *flags)
    first = _Run(command)
    try:
        # Killed as soon as the first backup is written (not after a delay, which a fast CPU can
        # outrun to the end of training).
        assert first.wait_for(lambda: os.path.exists(model_dir / BACKUP_WRITTEN[flavour]))
    finally:
        assert first.kill() == -signal.SIGKILL, first.output[-3000:]
    backup = resume.read_backup(model_dir / "backup")
    assert backup is not None and 1 <= backup.epoch < epochs
    assert not (model_dir / "metrics.json").exists()

    second = subprocess.run(command, env=_env(), cwd=ROOT, text=True, capture_output=True,
                            timeout=300, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = backup.epoch + 1
    assert re.search(rf"^resume: continuing from backup {re.escape(backup.path)} at epoch "
                     rf"{resumed}/{epochs}, step 0$", second.stdout, re.MULTILINE), \
        second.stdout[-3000:]
    ran = [int(e) for e in re.findall(rf"^Epoch (\d+)/{epochs}$", second.stdout, re.MULTILINE)]
    assert ran == list(range(resumed, epochs + 1))
    metrics = json.loads((model_dir / "metrics.json").read_text())
    print(f"killed after the backup of epoch {backup.epoch}, resumed at epoch {resumed}, "
          f"test accuracy {metrics['test_accuracy']:.4f}")
    assert metrics["resumed_at_epoch"] == resumed and metrics["keras"] == flavour
    assert metrics["test_accuracy"] >= 0.95
    assert not (model_dir / "backup").exists()


@pytest.mark.slow
def test_kill_while_exporting_keeps_the_training(tmp_path):
    epochs, model_dir = 3, tmp_path / "run"
    command = _train_command(model_dir, epochs, backup_freq=None)  # the default backs up the end
    first = _Run(command)
    try:
        # model.keras is renamed into place complete; saved_model/ and metrics.json come after.
        assert first.wait_for(lambda: os.path.exists(model_dir / "model.keras"))
    finally:
        assert first.kill() == -signal.SIGKILL, first.output[-3000:]
    assert not (model_dir / "metrics.json").exists()
    assert training.read_finished_run(model_dir) is None
    backup = resume.read_backup(model_dir / "backup")
    assert backup is not None and backup.epoch == epochs, "the backup went before the export"
    trained = keras.models.load_model(model_dir / "model.keras", compile=False).get_weights()

    # The rerun only writes the results again, from the very weights trained before the kill.
    second = subprocess.run(command, env=_env(), cwd=ROOT, text=True, capture_output=True,
                            timeout=300, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    assert re.search(rf"^resume: backup \S+ holds the finished training \(epoch {epochs}/{epochs}"
                     r"\): nothing left to train", second.stdout, re.MULTILINE), second.stdout
    assert not re.search(r"^Epoch \d+/", second.stdout, re.MULTILINE), second.stdout
    exported = keras.models.load_model(model_dir / "model.keras", compile=False).get_weights()
    for a, b in zip(trained, exported):
        np.testing.assert_array_equal(a, b)
    metrics = training.read_finished_run(model_dir)
    assert metrics is not None and metrics["resumed_at_epoch"] == epochs + 1
    assert metrics["validation_accuracy"] is not None
    assert (model_dir / "saved_model" / "saved_model.pb").exists()
    assert not (model_dir / "backup").exists()

    # A finished run is reported, not trained again; --retrain trains from epoch 1.
    stamp = os.path.getmtime(model_dir / "metrics.json")
    third = subprocess.run(command, env=_env(), cwd=ROOT, text=True, capture_output=True,
                           timeout=300, check=False)
    assert third.returncode == 0, third.stderr[-3000:]
    lines = third.stdout.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(
        rf"{re.escape(str(model_dir))} holds a finished run \(test accuracy "
        rf"{metrics['test_accuracy']:.4f} in metrics.json\): not training again; pass --retrain "
        r"\(or another --model_dir\) to train again", lines[0]), third.stdout
    assert os.path.getmtime(model_dir / "metrics.json") == stamp
    fourth = subprocess.run([*command, "--retrain"], env=_env(), cwd=ROOT, text=True,
                            capture_output=True, timeout=300, check=False)
    assert fourth.returncode == 0, fourth.stderr[-3000:]
    assert "starting from epoch 1" in fourth.stdout
    assert re.findall(rf"^Epoch (\d+)/{epochs}$", fourth.stdout, re.MULTILINE) == ["1", "2", "3"]
    assert json.loads((model_dir / "metrics.json").read_text())["resumed_at_epoch"] is None


@pytest.mark.slow
def test_ten_random_kills_never_restart_a_finished_epoch(tmp_path):
    """kill -9 at 10 random moments, rerunning the same command each time (seeds printed)."""
    seed = int(os.environ.get("TFACCEL_KILL_SEED", "20261"))
    epochs, model_dir = 8, tmp_path / "run"
    command = _train_command(model_dir, epochs)
    # The moments, on the timeline of one uninterrupted run: an event, then a random delay.
    rng = random.Random(seed)
    timeline = ["start", *(f"Epoch {k}/{epochs}" for k in range(1, epochs + 1)),
                "model.keras", "saved_model", "metrics.json"]
    moments = [(timeline[i], rng.uniform(0, 6.0) if i == 0 else rng.uniform(0, 0.3))
               for i in sorted(rng.randrange(len(timeline)) for _ in range(10))]
    print(f"kill moments from seed {seed} (TFACCEL_KILL_SEED=<n> replays others): "
          + ", ".join(f"{d:.2f}s after {a}" for a, d in moments))
    backed_up = 0  # the last epoch known to be in a backup (or finished)
    for i, (anchor, delay) in enumerate(moments):
        expected = _expected_start(model_dir, epochs)
        first = backed_up + 1
        if anchor.startswith("Epoch") and int(anchor.split()[1].split("/")[0]) < first:
            anchor = "start"  # that epoch is in the backup already: this run will not print it
        print(f"kill {i + 1}: {delay:.2f}s after {anchor}")
        run = _Run(command)
        try:
            if anchor.startswith("Epoch"):
                run.wait_for(lambda a=anchor, r=run: any(line.strip() == a for line in r.lines))
            elif anchor != "start":
                run.wait_for(lambda a=anchor, r=run: _written_since(model_dir / a, r))
            time.sleep(delay)
        finally:
            code = run.kill()
        assert code in (0, -signal.SIGKILL), run.output[-3000:]
        _check_rerun_start(run, expected, backed_up, epochs)
        backup = resume.read_backup(model_dir / "backup")
        now = epochs if training.read_finished_run(model_dir) else (backup.epoch if backup else 0)
        assert now >= backed_up, f"kill {i + 1}: the backup went back from {backed_up} to {now}"
        backed_up = now
        print(f"  -> {'exited' if code == 0 else 'killed'}; backed up: epoch {now}")

    expected = _expected_start(model_dir, epochs)
    last = _Run(command)
    assert last.finish() == 0, last.output[-3000:]
    _check_rerun_start(last, expected, backed_up, epochs)
    metrics = training.read_finished_run(model_dir)
    assert metrics is not None and metrics["test_accuracy"] >= 0.9
    assert not (model_dir / "backup").exists()
    print(f"final test accuracy {metrics['test_accuracy']:.4f}")


def _check_rerun_start(run, expected, backed_up, epochs):
    """The run began where the disk said (if it got as far as saying), never at epoch 1 again."""
    ran = run.epochs_run(epochs)
    if backed_up:
        assert 1 not in ran and "starting from epoch 1" not in run.output, run.output[-3000:]
    said = [line for line in run.lines
            if line.startswith("resume:") or " holds a finished run " in line]
    if said:
        assert re.search(expected, said[0].rstrip("\n")), (expected, said[0])
    if ran:
        assert ran == list(range(ran[0], ran[0] + len(ran)))
        assert ran[0] == backed_up + 1 or (backed_up == 0 and ran[0] == 1), (backed_up, ran)


# --- The data order of a resumed run is the uninterrupted run's.

def _labelled(n=64):
    rng = np.random.default_rng(1)
    return tf.data.Dataset.from_tensor_slices(
        (rng.normal(size=(n, 4)).astype(np.float32), np.arange(n) % 3))


def _pipeline(counter):
    # A fresh pipeline, as in a restarted process: tf.data's own reshuffling starts again.
    keras.utils.set_random_seed(0)
    config = data.PipelineConfig(batch_size=8, cache="memory", deterministic=True)
    return data.build_pipeline(_labelled(), config, training=True, seed=3, epoch=counter.epoch)


def test_epoch_k_is_shuffled_alike_in_a_fresh_pipeline():
    counter = resume.EpochCounter()
    continuous = _pipeline(counter)
    orders = []
    for k in range(4):
        counter.epoch.assign(k)
        orders.append(np.concatenate([y for _, y in continuous.as_numpy_iterator()]))
    assert len({tuple(o) for o in orders}) == 4  # a new order every epoch
    assert all(sorted(o) == sorted(orders[0]) for o in orders)  # each a permutation
    for k in (2, 3):
        counter.epoch.assign(k)
        fresh = np.concatenate([y for _, y in _pipeline(counter).as_numpy_iterator()])
        np.testing.assert_array_equal(fresh, orders[k])
    assert continuous.cardinality() == 8  # Keras still knows the steps per epoch


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("strategy_name", ["default", "mirrored"])
def test_resumed_fit_ends_with_the_uninterrupted_weights(tmp_path, strategy_name, flavour):
    strategy = distribute.make_strategy(strategy_name)
    messages = []

    def train(backup_dir, crash_step=None):
        model, counter = _model(strategy, flavour), resume.EpochCounter()
        callbacks = [*resume.backup_callbacks(backup_dir, epochs=4, printer=messages.append,
                                              flavour=flavour), counter]
        if crash_step:
            callbacks.append(_CrashAt(crash_step))
        model.fit(_pipeline(counter), epochs=4, verbose=0, callbacks=callbacks)
        return model.get_weights(), callbacks[1].resumed_at

    uninterrupted, _ = train(tmp_path / "a")
    with pytest.raises(_Crash):
        train(tmp_path / "b", crash_step=20)  # in epoch 3: epochs 1-2 backed up
    backup = resume.read_backup(tmp_path / "b")
    assert backup.epoch == 2 and os.path.exists(backup.path + (".index" if flavour == "tf_keras"
                                                               else ""))
    resumed, resumed_at = train(tmp_path / "b")
    assert resumed_at == (3, 0)
    assert re.fullmatch(r"resume: continuing from backup \S+ at epoch 3/4, step 0", messages[-1])
    for a, b in zip(uninterrupted, resumed):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert not (tmp_path / "b").exists()  # a finished fit deletes its backups and their folder


def test_keras3_backups_are_taken_at_epoch_ends_only(tmp_path):
    with pytest.raises(ConfigError, match="resumes at epoch starts only"):
        resume.backup_callbacks(tmp_path, 50, flavour="keras3")
    # Seconds between backups: the short epochs back up only after the last one.
    model = _model(distribute.make_strategy("default"), "keras3")
    callbacks = resume.backup_callbacks(tmp_path, "60s", epochs=3, delete_after_fit=False,
                                        flavour="keras3",
                                        weights_path=str(tmp_path / "ckpt-{epoch}.weights.h5"))
    model.fit(_data(), epochs=3, verbose=0, callbacks=callbacks)
    assert callbacks[0].backed_up_epochs == [2]
    assert resume.read_backup(tmp_path) == resume.Backup(
        str(tmp_path / resume.KERAS3_WEIGHTS), 3, None)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-3.weights.h5"]
    # The one reporter serves both Kerases; the Keras 3 part is its BackupAndRestore.
    assert type(callbacks[1]) is resume.ResumeReporter
    assert isinstance(callbacks[0], resume.EpochBackups)
    assert isinstance(callbacks[0], keras_of_flavour("keras3").callbacks.BackupAndRestore)


@pytest.mark.parametrize("killed_in", ["weights", "epoch_count"])
def test_a_kill_during_a_keras3_backup_leaves_the_last_whole_one(tmp_path, monkeypatch,
                                                                  killed_in):
    """Keras 3 empties `training_metadata.json` before it writes the count: a kill between the
    two once left a backup no one could read (a CI run's kill -9 test caught it)."""
    keras3 = keras_of_flavour("keras3")
    after_epoch_1 = []

    class _Snapshot(keras3.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                after_epoch_1.extend(w.copy() for w in self.model.get_weights())

    def crash_with_half_a_file(filepath, *args, **kwargs):
        with open(filepath, "wb") as f:
            f.write(b"\x89HDF half")
        raise _Crash("killed while writing the weights")

    real_dumps = json.dumps

    def crash_on_the_second_count(obj, *args, **kwargs):
        if isinstance(obj, dict) and obj.get("epoch") == 2:
            raise _Crash("killed while writing the epoch count")
        return real_dumps(obj, *args, **kwargs)

    model = _model(distribute.make_strategy("default"), "keras3")
    callbacks = [*resume.backup_callbacks(tmp_path, epochs=3, flavour="keras3"), _Snapshot()]

    class _CrashInSecondBackup(keras3.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 1 and killed_in == "weights":
                monkeypatch.setattr(self.model, "save_weights", crash_with_half_a_file)
            elif epoch == 1:
                monkeypatch.setattr(json, "dumps", crash_on_the_second_count)

    with pytest.raises(_Crash):
        model.fit(_data(), epochs=3, verbose=0, callbacks=[*callbacks, _CrashInSecondBackup()])
    monkeypatch.undo()
    assert resume.read_backup(tmp_path) == resume.Backup(
        str(tmp_path / resume.KERAS3_WEIGHTS), 1, None)
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]

    messages, record = [], _Record()
    model = _model(distribute.make_strategy("default"), "keras3")
    model.fit(_data(), epochs=3, verbose=0, callbacks=[
        *resume.backup_callbacks(tmp_path, epochs=3, flavour="keras3", printer=messages.append),
        record])
    assert re.fullmatch(r"resume: continuing from backup \S+ at epoch 2/3, step 0", messages[-1])
    assert record.epochs == [1, 2]
    for restored, saved in zip(record.start_weights, after_epoch_1, strict=True):
        np.testing.assert_array_equal(restored, saved)


def test_the_former_backup_modules_are_resume():
    import tfaccel.train.backup_keras3 as keras3_module
    import tfaccel.train.backup_timing as timing_module

    assert keras3_module is resume and timing_module is resume
    assert timing_module.parse_backup_freq("2") == 2 and keras3_module.read_keras3_backup


@pytest.mark.slow
def test_resumed_recipe_ends_with_the_uninterrupted_weights(tmp_path):
    # Dropout's random state is not in a backup (docs/distribution.md): a model without it.
    (tmp_path / "nodropout.py").write_text(
        "from tfaccel import models\n\n\n"
        "def cnn(input_shape, num_classes):\n"
        "    return models.cnn(input_shape, num_classes, dropout=0.0)\n")
    epochs = 4
    flags = ["--model_fn=nodropout:cnn", "--deterministic"]
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env["PYTHONPATH"]])
    weights = {}
    for name in ("uninterrupted", "killed"):
        model_dir = tmp_path / name
        command = _train_command(model_dir, epochs, *flags)
        if name == "killed":
            first = _Run(command, env=env)
            try:
                assert first.wait_for(lambda d=model_dir: os.path.exists(
                    d / "backup" / "chief" / "checkpoint"))
            finally:
                assert first.kill() == -signal.SIGKILL, first.output[-3000:]
        proc = subprocess.run(command, env=env, cwd=ROOT, text=True, capture_output=True,
                              timeout=300, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert ("continuing from backup" in proc.stdout) == (name == "killed"), proc.stdout
        weights[name] = keras.models.load_model(model_dir / "model.keras",
                                                compile=False).get_weights()
    for a, b in zip(weights["uninterrupted"], weights["killed"]):
        np.testing.assert_array_equal(a, b)
