"""Resume training after a crash: Keras's BackupAndRestore plus a line saying where it resumed.

Rerunning the same command after a kill continues from the last backup
instead of epoch 1. Backups are taken every epoch or every N steps. By default
they are deleted when `fit` finishes; a program that writes results after `fit`
(an export, a report) should keep them with `delete_after_fit=False` and call
`remove_backup` once its last result is in place, or a kill while it writes
them loses every epoch (recipes/train.py does this). Under
MultiWorkerMirroredStrategy every worker must use the same `backup_dir` (the
chief writes it, the others write temporary copies Keras removes) and all
workers must be restarted together.

Example:

    from tfaccel.train import resume

    callbacks = resume.backup_callbacks("runs/a/backup", backup_freq="epoch", epochs=10)
    model.fit(train_ds, epochs=10, callbacks=callbacks)
    # prints "resume: continuing from backup runs/a/backup at epoch 4/10, step 0" after a crash
"""

import dataclasses
import os
import shutil

import tensorflow as tf

from tfaccel import _compat
from tfaccel.errors import ConfigError
from tfaccel.keras import keras


def parse_backup_freq(value):
    """'epoch' or a positive number of steps (given as int or string), as BackupAndRestore takes it.

    Raises:
      ConfigError: anything else.
    """
    if value == "epoch":
        return "epoch"
    try:
        steps = int(value)
    except (TypeError, ValueError):
        steps = 0
    if steps < 1:
        raise ConfigError(f"backup_freq={value!r} must be 'epoch' or a positive number of steps, "
                          "e.g. 50")
    return steps


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
    reshuffling would start again from epoch 1's order. Put it after
    `BackupAndRestore` (as `backup_callbacks` returns them) so that it sees the
    restored epoch; it sets the variable before each epoch's data is read.

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


@dataclasses.dataclass(frozen=True)
class Backup:
    """What a backup directory holds: the checkpoint and the last epoch (and step) it saved.

    Attributes:
      path: the checkpoint prefix.
      epoch: the epoch it was taken in, counted from 1. With backups every epoch,
        that epoch was finished and a rerun continues at the next one.
      step: the steps of that epoch done when a step backup (`backup_freq=N`) was
        taken. For an end-of-epoch backup it is the epoch's step count or None
        (Keras records steps only when some callback runs per step).
    """

    path: str
    epoch: int
    step: int | None


def read_backup(backup_dir):
    """The latest backup BackupAndRestore wrote to `backup_dir`, or None if there is none.

    Reads the checkpoint without a model, so that a program (or a test) can say
    where a rerun will continue before building anything.
    """
    found = _compat.latest_backup(backup_dir)
    if found is None:
        return None
    latest, epoch, batch = found
    return Backup(latest, epoch + 1, batch + 1 if batch >= 0 else None)


def remove_backup(backup_dir):
    """Deletes `backup_dir` with its backups; call once every result of the run is in place.

    Only the chief should call it under MultiWorkerMirroredStrategy: the
    directory is shared, and another worker removing it early would leave
    nothing to resume from if the chief is killed while writing its results.
    """
    shutil.rmtree(os.fspath(backup_dir), ignore_errors=True)


def backup_callbacks(backup_dir, backup_freq="epoch", epochs=None, printer=print,
                     delete_after_fit=True):
    """[BackupAndRestore, ResumeReporter] for `fit`: back up to `backup_dir`, resume from it.

    Args:
      backup_dir: where backups go (the same directory for every worker).
      backup_freq: 'epoch' or a number of steps.
      epochs: total epochs, for the resume message (and to tell finished training).
      printer: where the resume message goes.
      delete_after_fit: delete the backups when `fit` returns. Pass False when
        results are written after `fit`, and call `remove_backup` after the last
        one: a rerun after a kill in between then writes them again from the
        backup instead of training from epoch 1.

    Returns:
      The two callbacks, in the order they must run.

    Raises:
      ConfigError: a bad `backup_freq` or an empty `backup_dir`.
    """
    if not backup_dir:
        raise ConfigError("backup_dir is empty: give a directory for the backups")
    freq = parse_backup_freq(backup_freq)
    backup_dir = os.fspath(backup_dir)
    return [keras.callbacks.BackupAndRestore(backup_dir, save_freq=freq,
                                             delete_checkpoint=delete_after_fit),
            ResumeReporter(backup_dir, epochs=epochs, printer=printer,
                           remove_dir_after_fit=delete_after_fit)]
