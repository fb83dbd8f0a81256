"""Resume training after a crash: Keras's BackupAndRestore plus a line saying where it resumed.

Rerunning the same command after a kill continues from the last backup
instead of epoch 1. Backups are taken every epoch or every N steps, and are
deleted when `fit` finishes, so a completed run's rerun starts afresh. Under
MultiWorkerMirroredStrategy every worker must use the same `backup_dir` (the
chief writes it, the others write temporary copies Keras removes) and all
workers must be restarted together.

Example:

    from tfaccel import resume

    callbacks = resume.backup_callbacks("runs/a/backup", backup_freq="epoch", epochs=10)
    model.fit(train_ds, epochs=10, callbacks=callbacks)
    # prints "resume: continuing from backup runs/a/backup at epoch 4/10, step 0" after a crash
"""

import os

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
        continues (epoch counted from 1, as Keras prints it).
    """

    def __init__(self, backup_dir, epochs=None, printer=print):
        super().__init__()
        self.backup_dir = backup_dir
        self.epochs = epochs
        self.printer = printer
        self.resumed_at = None

    def on_train_begin(self, logs=None):
        state = getattr(self.model, "_training_state", None)
        if state is None:
            raise ConfigError("ResumeReporter must come after BackupAndRestore in the callbacks")
        latest = state.read_checkpoint_manager.latest_checkpoint
        if latest is None:
            self.printer(f"resume: no backup in {self.backup_dir}: starting from epoch 1")
            return
        # Private, but the very counters Keras restores and reads to pick the first epoch.
        epoch = int(state._ckpt_saved_epoch.numpy())
        batch = int(state._ckpt_saved_batch.numpy())
        # Keras's rule (worker_training_state.maybe_load_initial_counters_from_ckpt): an epoch
        # backup resumes at the next epoch, a step backup at the next step (the next epoch after
        # an epoch's last step).
        steps = (self.params or {}).get("steps")
        if batch >= 0 and steps and batch == steps - 1:
            self.resumed_at = (epoch + 2, 0)
        elif batch >= 0:
            self.resumed_at = (epoch + 1, batch + 1)
        else:
            self.resumed_at = (epoch + 2, 0)
        total = f"/{self.epochs}" if self.epochs else ""
        self.printer(f"resume: continuing from backup {latest} at epoch {self.resumed_at[0]}{total}, "
                     f"step {self.resumed_at[1]}")

    def on_train_end(self, logs=None):
        # BackupAndRestore deletes its backups after a finished fit but leaves their folder.
        try:
            os.rmdir(self.backup_dir)
        except OSError:
            pass


def backup_callbacks(backup_dir, backup_freq="epoch", epochs=None, printer=print):
    """[BackupAndRestore, ResumeReporter] for `fit`: back up to `backup_dir`, resume from it.

    Args:
      backup_dir: where backups go (the same directory for every worker).
      backup_freq: 'epoch' or a number of steps.
      epochs: total epochs, for the resume message.
      printer: where the resume message goes.

    Returns:
      The two callbacks, in the order they must run.

    Raises:
      ConfigError: a bad `backup_freq` or an empty `backup_dir`.
    """
    if not backup_dir:
        raise ConfigError("backup_dir is empty: give a directory for the backups")
    freq = parse_backup_freq(backup_freq)
    backup_dir = os.fspath(backup_dir)
    return [keras.callbacks.BackupAndRestore(backup_dir, save_freq=freq, delete_checkpoint=True),
            ResumeReporter(backup_dir, epochs=epochs, printer=printer)]
