"""Resume a Keras 3 model's training after a crash: `backup_callbacks` for Keras 3 models.

`tfaccel.train.resume.backup_callbacks(..., flavour="keras3")` returns these:
Keras 3's own `BackupAndRestore` (its weights file, optimizer state included,
and a JSON file with the epochs done), with tfaccel's timing (every epoch, or
'Ns' between epoch-end backups and always the last one; `weights_path`
checkpoints) and a line saying where training continues. Keras 3 resumes at
the start of an epoch only (its `fit` has no initial step), so a step
frequency is refused rather than redoing part of an epoch on weights that have
already seen it. Under several workers only the chief writes the backup, and
every worker restores from it.

Example:

    from tfaccel.train import resume

    callbacks = resume.backup_callbacks("runs/a/backup", "epoch", epochs=10, flavour="keras3")
    model.fit(train_ds, epochs=10, callbacks=callbacks)  # a Keras 3 model
"""

import json
import os
import time

from tfaccel import distribute
from tfaccel.errors import ConfigError
from tfaccel.keras import keras3
from tfaccel.train.backup_timing import Backup, EpochBackups, parse_backup_freq

METADATA = "training_metadata.json"  # what Keras 3's BackupAndRestore writes beside its weights
WEIGHTS = "latest.weights.h5"

_CLASSES = {}


def _backup_class():
    """Keras3Backup, made on first call (importing this module imports no Keras 3)."""
    if "backup" not in _CLASSES:
        class Keras3Backup(EpochBackups, keras3().callbacks.BackupAndRestore):
            """Keras 3's BackupAndRestore at tfaccel's epoch-end moments (see the module)."""

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

        _CLASSES["backup"] = Keras3Backup
    return _CLASSES["backup"]


def read_keras3_backup(backup_dir):
    """The backup Keras 3's BackupAndRestore left in `backup_dir` (a `resume.Backup` at the end
    of its last epoch), or None."""
    try:
        with open(os.path.join(os.fspath(backup_dir), METADATA), encoding="utf-8") as f:
            epochs_done = int(json.load(f)["epoch"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    weights = os.path.join(os.fspath(backup_dir), WEIGHTS)
    return Backup(weights, epochs_done, None) if os.path.exists(weights) else None


def _reporter_class():
    if "reporter" not in _CLASSES:
        class Keras3ResumeReporter(keras3().callbacks.Callback):
            """`resume.ResumeReporter` for Keras 3: after the backup, says where `fit` continues.

            `resumed_at` is None on a fresh start, else (epoch from 1, 0); `finished` is True
            when the backup holds the finished training.
            """

            def __init__(self, backup_dir, epochs=None, printer=print, remove_dir_after_fit=True):
                super().__init__()
                self.backup_dir, self.epochs, self.printer = backup_dir, epochs, printer
                self.remove_dir_after_fit = remove_dir_after_fit
                self.resumed_at, self.finished = None, False

            def on_train_begin(self, logs=None):
                found = read_keras3_backup(self.backup_dir)
                if found is None:
                    self.printer(f"resume: no backup in {self.backup_dir}: starting from epoch 1")
                    return
                self.resumed_at = (found.epoch + 1, 0)
                total = f"/{self.epochs}" if self.epochs else ""
                self.finished = bool(self.epochs) and found.epoch >= self.epochs
                if self.finished:
                    self.printer(f"resume: backup {found.path} holds the finished training "
                                 f"(epoch {self.epochs}{total}): nothing left to train, writing "
                                 "the results again")
                else:
                    self.printer(f"resume: continuing from backup {found.path} at epoch "
                                 f"{self.resumed_at[0]}{total}, step 0")

            def on_train_end(self, logs=None):
                if self.remove_dir_after_fit:
                    try:
                        os.rmdir(self.backup_dir)
                    except OSError:
                        pass

        _CLASSES["reporter"] = Keras3ResumeReporter
    return _CLASSES["reporter"]


def keras3_backup_callbacks(backup_dir, backup_freq="epoch", epochs=None, printer=print,
                            delete_after_fit=True, weights_path=None):
    """[Keras3Backup, Keras3ResumeReporter]: `resume.backup_callbacks` for a Keras 3 model."""
    return [_backup_class()(backup_dir, backup_freq, delete_checkpoint=delete_after_fit,
                            weights_path=weights_path),
            _reporter_class()(backup_dir, epochs=epochs, printer=printer,
                              remove_dir_after_fit=delete_after_fit)]
