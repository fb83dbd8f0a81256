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
Keras 3 models get `backup_keras3`'s callbacks (`flavour="keras3"`).

Example:

    from tfaccel.train import resume

    callbacks = resume.backup_callbacks("runs/a/backup", backup_freq="epoch", epochs=10)
    model.fit(train_ds, epochs=10, callbacks=callbacks)
    # prints "resume: continuing from backup runs/a/backup at epoch 4/10, step 0" after a crash
"""

import datetime
import math
import os
import shutil
import time

import tensorflow as tf

from tfaccel import _compat
from tfaccel.errors import ConfigError
from tfaccel.keras import keras
from tfaccel.train.backup_keras3 import keras3_backup_callbacks, read_keras3_backup
from tfaccel.train.backup_timing import Backup, EpochBackups, parse_backup_freq

__all__ = ["parse_backup_freq", "Backup", "ResumeReporter", "EpochCounter", "read_backup",
           "remove_backup", "PeriodicBackup", "backup_callbacks"]


class ResumeReporter(keras.callbacks.Callback):
    """Says at the start of `fit` whether training resumes from a backup, and where.

    Must come after `BackupAndRestore` in the callback list: it reads the state
    that callback restored in its own `on_train_begin`.

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
        restored = _compat.restored_backup(self.model)
        if restored is None:
            raise ConfigError("ResumeReporter must come after BackupAndRestore in the callbacks")
        latest = restored[0]
        if latest is None:
            self.printer(f"resume: no backup in {self.backup_dir}: starting from epoch 1")
            return
        self.resumed_at = _compat.resumed_start(restored, (self.params or {}).get("steps"))
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
        restored = _compat.restored_backup(self.model)
        if restored is not None and restored[0] is not None:
            # The first epoch's iterator is made before on_epoch_begin: set it now.
            steps = (self.params or {}).get("steps")
            self.epoch.assign(_compat.resumed_start(restored, steps)[0] - 1)
        else:
            self.epoch.assign(0)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch.assign(epoch)

    def on_epoch_end(self, epoch, logs=None):
        self.epoch.assign(epoch + 1)  # Keras makes the next epoch's iterator before its begin


def read_backup(backup_dir):
    """The latest backup BackupAndRestore wrote to `backup_dir`, or None if there is none.

    Reads the checkpoint without a model, so that a program (or a test) can say
    where a rerun will continue before building anything. A Keras 3 model's backup
    (`backup_keras3`) is read too.
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
    """[PeriodicBackup, ResumeReporter] for `fit`: back up to `backup_dir`, resume from it.

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
      flavour: the model's Keras ('keras3': `backup_keras3`, epoch-end backups only).

    Returns:
      The two callbacks, in the order they must run.

    Raises:
      ConfigError: a bad `backup_freq` or an empty `backup_dir`.
    """
    if not backup_dir:
        raise ConfigError("backup_dir is empty: give a directory for the backups")
    backup_dir = os.fspath(backup_dir)
    if flavour == "keras3":
        return keras3_backup_callbacks(backup_dir, backup_freq, epochs, printer,
                                       delete_after_fit, weights_path)
    return [PeriodicBackup(backup_dir, backup_freq, delete_checkpoint=delete_after_fit,
                           weights_path=weights_path),
            ResumeReporter(backup_dir, epochs=epochs, printer=printer,
                           remove_dir_after_fit=delete_after_fit)]
