"""Resume training after a crash: Keras's BackupAndRestore plus a line saying where it resumed.

Rerunning the same command after a kill continues from the last backup
instead of epoch 1. Backups are taken every epoch, every N steps, or at the
first epoch end at least N seconds after the previous backup (`"60s"`), and
then always after the last epoch: with epochs far shorter than a save, the
saves then cost a small share of the run. By default they are deleted when
`fit` finishes; a program that writes results after `fit` should keep them
(`delete_after_fit=False`) and call `remove_backup` once its last result is in
place (recipes/train.py does). Under MultiWorkerMirroredStrategy every worker
uses the same `backup_dir` (the chief writes it) and all restart together.

One timing (`EpochBackups`, mixed into each Keras's `BackupAndRestore`), one
reader (`read_backup`) and one reporter (`ResumeReporter`) serve both Kerases.
What is Keras 3's own sits in one section at the end: its `BackupAndRestore`
(a weights file, optimizer state included, and a JSON file with the epochs
done), which resumes at the start of an epoch only (its `fit` has no initial
step), so a step frequency is refused for a Keras 3 model (`flavour="keras3"`)
rather than redoing part of an epoch on weights that have already seen it.

Example:

    from tfaccel.train import resume

    callbacks = resume.backup_callbacks("runs/a/backup", backup_freq="epoch", epochs=10)
    model.fit(train_ds, epochs=10, callbacks=callbacks)
    # prints "resume: continuing from backup runs/a/backup at epoch 4/10, step 0" after a crash
"""

import dataclasses
import datetime
import json
import math
import os
import shutil
import time

import tensorflow as tf

from tfaccel import _compat, distribute
from tfaccel.choices import parse_backup_freq as parse_backup_freq  # TensorFlow-free, for flags
from tfaccel.errors import ConfigError
from tfaccel.io import atomic_path
from tfaccel.keras import flavour_of, keras

__all__ = ["parse_backup_freq", "Backup", "ResumeReporter", "EpochCounter", "read_backup",
           "remove_backup", "EpochBackups", "PeriodicBackup", "backup_callbacks"]


# ------------------------------------------------------------------ reading a backup


@dataclasses.dataclass(frozen=True)
class Backup:
    """What a backup directory holds: the checkpoint and the last epoch (and step) it saved.

    Attributes:
      path: the checkpoint prefix (tf_keras) or weights file (Keras 3).
      epoch: the epoch it was taken in, counted from 1. With backups every epoch,
        that epoch was finished and a rerun continues at the next one.
      step: the steps of that epoch done when a step backup (`backup_freq=N`) was
        taken. For an end-of-epoch backup it is the epoch's step count or None
        (Keras records steps only when some callback runs per step; Keras 3 never).
    """

    path: str
    epoch: int
    step: int | None


def read_backup(backup_dir):
    """The latest backup in `backup_dir` (a `Backup`), or None if there is none.

    Reads the files without a model, so that a program (or a test) can say
    where a rerun will continue before building anything: tf_keras's
    checkpoints, else Keras 3's files.
    """
    found = _compat.latest_backup(backup_dir)
    if found is None:
        return read_keras3_backup(backup_dir)
    latest, epoch, batch = found
    return Backup(latest, epoch + 1, batch + 1 if batch >= 0 else None)


def remove_backup(backup_dir):
    """Deletes `backup_dir` with its backups; call once every result of the run is in place.

    Only the chief should call it under MultiWorkerMirroredStrategy: the
    directory is shared, and another worker removing it early would leave
    nothing to resume from if the chief is killed while writing its results.
    """
    shutil.rmtree(os.fspath(backup_dir), ignore_errors=True)


def _resumed(model, backup_dir, steps):
    """(checkpoint, (epoch from 1, step)) where this `fit` of `model` continues, None on a fresh
    start; read after the model's Keras's `BackupAndRestore` ran its `on_train_begin`."""
    if flavour_of(model) == "keras3":  # it has just loaded the backup in `backup_dir`
        found = read_keras3_backup(backup_dir)
        return None if found is None else (found.path, (found.epoch + 1, 0))
    restored = _compat.restored_backup(model)
    if restored is None:
        raise ConfigError("ResumeReporter must come after BackupAndRestore in the callbacks")
    if restored[0] is None:
        return None
    return restored[0], _compat.resumed_start(restored, steps)


class ResumeReporter(keras.callbacks.Callback):
    """Says at the start of `fit` whether training resumes from a backup, and where.

    Must come after `BackupAndRestore` in the callback list: it reads the state
    that callback restored in its own `on_train_begin`. Serves models of either Keras.

    Attributes:
      resumed_at: None on a fresh start, else (epoch, step) where training
        continues (epoch counted from 1, as Keras prints it); epoch is
        `epochs + 1` when the backup holds finished training.
      finished: True when the backup holds finished training (`fit` then
        runs no epoch): the program was stopped after training but before its
        results were written, and only has to write them again.
    """

    def __init__(self, backup_dir, epochs=None, printer=print, remove_dir_after_fit=True):
        super().__init__()
        self.backup_dir = backup_dir
        self.epochs = epochs
        self.printer = printer
        self.remove_dir_after_fit = remove_dir_after_fit
        self.resumed_at = None
        self.finished = False

    def on_train_begin(self, logs=None):
        resumed = _resumed(self.model, self.backup_dir, (self.params or {}).get("steps"))
        if resumed is None:
            self.printer(f"resume: no backup in {self.backup_dir}: starting from epoch 1")
            return
        latest, self.resumed_at = resumed
        total = f"/{self.epochs}" if self.epochs else ""
        self.finished = bool(self.epochs) and self.resumed_at[0] > self.epochs
        if self.finished:
            self.printer(f"resume: backup {latest} holds the finished training (epoch "
                         f"{self.epochs}{total}): nothing left to train, writing the results again")
            return
        self.printer(f"resume: continuing from backup {latest} "
                     f"at epoch {self.resumed_at[0]}{total}, "
                     f"step {self.resumed_at[1]}")

    def on_train_end(self, logs=None):
        # BackupAndRestore deletes its backups after a finished fit but leaves their folder.
        if not self.remove_dir_after_fit:
            return
        try:
            os.rmdir(self.backup_dir)
        except OSError:
            pass


class EpochCounter(keras.callbacks.Callback):
    """Keeps `epoch` (an int64 variable) at the epoch `fit` is in, counted from 0, resumes too.

    Give `epoch` to `tfaccel.data.build_pipeline` (or `build_splits`) with a seed:
    the training data of epoch k is then shuffled the same way in an
    uninterrupted run and in one resumed from a backup, where tf.data's own
    reshuffling would start again from epoch 1's order. Put it after the backup
    callbacks: it sets the restored epoch before each epoch's data is read.

    Example:

        counter = resume.EpochCounter()
        train = data.build_pipeline(splits.train, config, training=True, seed=0,
                                    epoch=counter.epoch)
        model.fit(train, epochs=10, callbacks=[*resume.backup_callbacks(backup_dir), counter])
    """

    def __init__(self):
        super().__init__()
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="data_epoch")

    def on_train_begin(self, logs=None):
        # tf_keras makes the first epoch's iterator before on_epoch_begin: set it now. (Keras 3
        # makes it after, and no tf_keras state is restored into its models.)
        restored = _compat.restored_backup(self.model)
        if restored is not None and restored[0] is not None:
            steps = (self.params or {}).get("steps")
            self.epoch.assign(_compat.resumed_start(restored, steps)[0] - 1)
        else:
            self.epoch.assign(0)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch.assign(epoch)

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.assign(epoch + 1)  # Keras makes the next epoch's iterator before its begin


# ------------------------------------------------------------------ when a backup is taken


class EpochBackups:
    """The epoch-end timing, mixed in before either Keras's `BackupAndRestore` (see
    `PeriodicBackup`)."""

    def _init_interval(self, freq, weights_path, clock):
        interval = freq.total_seconds() if isinstance(freq, datetime.timedelta) else None
        self.min_interval = interval if interval is not None else (0.0 if freq == "epoch" else None)
        self.weights_path = weights_path
        self.clock = clock
        self.backed_up_epochs = []  # epochs (from 0) backed up at their end, in this process
        self._last_backup = None
        self._last_epoch = None

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._last_backup = self.clock()
        self._last_epoch = None
        if self.min_interval and _compat.num_workers(self.model.distribute_strategy) > 1:
            self.min_interval = 0.0  # every worker must take the same decision

    def _due(self, epoch):
        if self.min_interval is None:  # step backups: Keras backs up from its batch hooks
            return False
        last = (self.params or {}).get("epochs")
        return (self.min_interval == 0 or (last is not None and epoch + 1 >= last)
                or self.clock() - self._last_backup >= self.min_interval)

    def on_epoch_end(self, epoch, logs=None):
        self._last_epoch = epoch
        if self._due(epoch):
            self._back_up_epoch(epoch, logs)
        elif self.min_interval is None and self.weights_path:
            self._save_weights(epoch)

    def keras_epoch_backup(self, epoch, logs):
        """The Keras `BackupAndRestore`'s own epoch-end backup (a subclass may narrow it)."""
        super().on_epoch_end(epoch, logs)

    def _back_up_epoch(self, epoch, logs):
        self.keras_epoch_backup(epoch, logs)
        self._last_backup = self.clock()
        self.backed_up_epochs.append(epoch)
        if self.weights_path:
            self._save_weights(epoch)

    def _save_weights(self, epoch):
        with atomic_path(self.weights_path.format(epoch=epoch + 1)) as tmp:
            self.model.save_weights(tmp)

    def on_train_end(self, logs=None):
        # Stopped early (e.g. EarlyStopping) after an epoch that was not backed up: back it up
        # if it is kept, so that a kill while results are written after fit loses nothing.
        if (self.min_interval is not None and not self.delete_checkpoint
                and self._last_epoch is not None
                and self._last_epoch not in self.backed_up_epochs[-1:]):
            self._back_up_epoch(self._last_epoch, logs)
        super().on_train_end(logs)


class PeriodicBackup(EpochBackups, keras.callbacks.BackupAndRestore):
    """Keras's `BackupAndRestore`, backing up at most every `min_interval` and after the last epoch.

    A backup of a small model takes tens of milliseconds, as long as a whole
    epoch of the digits CNN: backing up every epoch then made the train recipe
    1.6x slower than a bare `fit`. With `backup_freq` a `timedelta` (or 'Ns'),
    an epoch end backs up only when that much time passed since the previous
    backup (or the start of `fit`); the last epoch (and, with the backup kept
    after `fit`, the last one done when `fit` stops early) is always backed up,
    so that a program killed while it writes its results after `fit` resumes
    with nothing left to train. Under several workers, whose clocks would
    disagree, it backs up every epoch.
    'epoch' and a number of steps behave as in Keras, except that a step whose
    running loss is NaN or infinite is not backed up (nor any later step of its
    epoch): `StopOnNonFiniteLoss` may stop the run only at the epoch's end.

    With `weights_path` (a format string with `{epoch}`, counted from 1, e.g.
    'checkpoints/ckpt-{epoch:03d}.weights.h5') the weights are saved there
    (HDF5, atomically) at every epoch-end backup, and at every epoch end with
    step backups: one save moment serves resuming and keeping checkpoints.

    Args:
      backup_dir: where backups go (the same directory for every worker).
      backup_freq: 'epoch', a number of steps, or a `timedelta` / 'Ns'.
      delete_checkpoint: delete the backups when `fit` finishes.
      weights_path: optional weights file per backup, as above.
      clock: seconds now (default `time.monotonic`); for tests.
    """

    def __init__(self, backup_dir, backup_freq="epoch", delete_checkpoint=True,
                 weights_path=None, clock=time.monotonic):
        freq = parse_backup_freq(backup_freq)
        every_epoch = freq == "epoch" or isinstance(freq, datetime.timedelta)
        super().__init__(os.fspath(backup_dir), save_freq="epoch" if every_epoch else freq,
                         delete_checkpoint=delete_checkpoint)
        self._init_interval(freq, weights_path, clock)

    def on_train_batch_begin(self, batch, logs=None):
        if self.min_interval is None:  # only step backups need Keras's per-step bookkeeping
            super().on_train_batch_begin(batch, logs)  # (a variable assigned at every step)

    def on_train_batch_end(self, batch, logs=None):
        if self.min_interval is not None:
            return
        loss = (logs or {}).get("loss")  # Keras's running mean: non-finite from a bad step on
        if loss is None or math.isfinite(float(loss)):  # a non-finite step is never backed up
            super().on_train_batch_end(batch, logs)


def backup_callbacks(backup_dir, backup_freq="epoch", epochs=None, printer=print,
                     delete_after_fit=True, weights_path=None, flavour="tf_keras"):
    """[the backup, ResumeReporter] for `fit`: back up to `backup_dir`, resume from it.

    Args:
      backup_dir: where backups go (the same directory for every worker).
      backup_freq: 'epoch', a number of steps, or seconds between epoch-end
        backups ('60s' or a `timedelta`; the last epoch is always backed up).
      epochs: total epochs, for the resume message (and to tell finished training).
      printer: where the resume message goes.
      delete_after_fit: delete the backups when `fit` returns. Pass False when
        results are written after `fit`, and call `remove_backup` after the last
        one: a rerun after a kill in between then writes them again from the
        backup instead of training from epoch 1.
      weights_path: save the weights at each backup too (see `PeriodicBackup`).
      flavour: the model's Keras: 'tf_keras' (`PeriodicBackup`) or 'keras3' (Keras 3's
        own backup, at epoch ends only).

    Returns:
      The two callbacks, in the order they must run.

    Raises:
      ConfigError: a bad `backup_freq` (steps, for Keras 3) or an empty `backup_dir`.
    """
    if not backup_dir:
        raise ConfigError("backup_dir is empty: give a directory for the backups")
    backup_dir = os.fspath(backup_dir)
    backup = _keras3_backup_class() if flavour == "keras3" else PeriodicBackup
    return [backup(backup_dir, backup_freq, delete_checkpoint=delete_after_fit,
                   weights_path=weights_path),
            ResumeReporter(backup_dir, epochs=epochs, printer=printer,
                           remove_dir_after_fit=delete_after_fit)]


# ------------------------------------------------------------------ Keras 3's own backup

KERAS3_METADATA = "training_metadata.json"  # what Keras 3's BackupAndRestore writes: the epochs
KERAS3_WEIGHTS = "latest.weights.h5"  # done, and beside it the weights with the optimizer's

_KERAS3_BACKUP = []


def read_keras3_backup(backup_dir):
    """The backup Keras 3's BackupAndRestore left in `backup_dir` (a `Backup` at the end of its
    last epoch), or None."""
    try:
        with open(os.path.join(os.fspath(backup_dir), KERAS3_METADATA), encoding="utf-8") as f:
            epochs_done = int(json.load(f)["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    weights = os.path.join(os.fspath(backup_dir), KERAS3_WEIGHTS)
    return Backup(weights, epochs_done, None) if os.path.exists(weights) else None


def _keras3_backup_class():
    """Keras3Backup, made on first call (importing this module imports no Keras 3)."""
    if _KERAS3_BACKUP:
        return _KERAS3_BACKUP[0]

    class Keras3Backup(EpochBackups, _compat.keras3_backup_writing_whole_files()):
        """Keras 3's BackupAndRestore at `PeriodicBackup`'s epoch-end moments; under several
        workers only the chief writes the backup, and every worker restores from it."""

        def __init__(self, backup_dir, backup_freq="epoch", delete_checkpoint=True,
                     weights_path=None, clock=time.monotonic):
            freq = parse_backup_freq(backup_freq)
            if isinstance(freq, int):
                raise ConfigError(
                    f"backup_freq={backup_freq!r} steps: a Keras 3 model resumes at epoch "
                    "starts only (Keras 3's fit has no initial step): use 'epoch' or seconds "
                    "between epoch-end backups (e.g. 60s), or a tf_keras model")
            super().__init__(os.fspath(backup_dir), save_freq="epoch",
                             double_checkpoint=True, delete_checkpoint=delete_checkpoint)
            self._init_interval(freq, weights_path, clock)

        def keras_epoch_backup(self, epoch, logs):
            if distribute.is_chief(self.model.distribute_strategy):  # one writer
                super().keras_epoch_backup(epoch, logs)

        def on_train_end(self, logs=None):
            if distribute.is_chief(self.model.distribute_strategy):
                super().on_train_end(logs)

    _KERAS3_BACKUP.append(Keras3Backup)
    return Keras3Backup
