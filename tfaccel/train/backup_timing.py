"""When a backup is due, and what a backup holds: shared by both Kerases' backups.

`parse_backup_freq` reads a backup frequency; `EpochBackups` is the epoch-end timing
mixed into `resume.PeriodicBackup` (tf_keras) and `backup_keras3.Keras3Backup`
(Keras 3); `Backup` is what `resume.read_backup` finds. Use them through
`tfaccel.train.resume`.
"""

import dataclasses
import datetime
import os
import re

from tfaccel import _compat
from tfaccel.errors import ConfigError


def parse_backup_freq(value):
    """'epoch', a positive number of steps (int or string), or seconds: '60s' -> timedelta(60).

    A `datetime.timedelta` (or 'Ns') means: back up at the first epoch end at
    least that long after the previous backup (or the start), and after the
    last epoch.

    Raises:
      ConfigError: anything else.
    """
    if value == "epoch":
        return "epoch"
    if isinstance(value, datetime.timedelta):
        if value.total_seconds() < 0:
            raise ConfigError(f"backup_freq={value} must not be negative")
        return value
    seconds = re.fullmatch(r"(\d+(?:\.\d*)?)s", str(value).strip())
    if seconds:
        return datetime.timedelta(seconds=float(seconds.group(1)))
    try:
        steps = int(value)
    except (TypeError, ValueError):
        steps = 0
    if steps < 1:
        raise ConfigError(f"backup_freq={value!r} must be 'epoch', a positive number of steps "
                          "(e.g. 50) or of seconds between epoch-end backups (e.g. 60s)")
    return steps


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


class EpochBackups:
    """`PeriodicBackup`'s epoch-end timing, mixed in before either Keras's `BackupAndRestore`."""

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
        path = self.weights_path.format(epoch=epoch + 1)
        folder, name = os.path.split(os.path.abspath(path))
        os.makedirs(folder, exist_ok=True)
        # The whole name is kept at the end: Keras reads the format from it ('.weights.h5').
        tmp = os.path.join(folder, f".tmp-{os.getpid()}-{name}")
        try:
            self.model.save_weights(tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)

    def on_train_end(self, logs=None):
        # Stopped early (e.g. EarlyStopping) after an epoch that was not backed up: back it up
        # if it is kept, so that a kill while results are written after fit loses nothing.
        if (self.min_interval is not None and not self.delete_checkpoint
                and self._last_epoch is not None
                and self._last_epoch not in self.backed_up_epochs[-1:]):
            self._back_up_epoch(self._last_epoch, logs)
        super().on_train_end(logs)
