"""Private touchpoints: summaries, monitor and resume (Keras's TensorBoard and
BackupAndRestore callbacks)."""
import json
import os
import shutil

from tfaccel.io import atomic_path

_TENSORBOARD_WITHOUT_LR = {}
_KERAS3_WHOLE_FILE_BACKUP = []


def tensorboard_without_learning_rate(flavour="tf_keras"):
    """Keras's TensorBoard callback class, subclassed to log no `epoch_learning_rate` scalar.

    Built once per Keras ('tf_keras' or 'keras3'), on first call (so that importing
    this module loads no Keras). Relies on the private hook
    `TensorBoard._collect_learning_rate(logs)` (tf_keras and Keras 3 alike), which
    `on_epoch_end` calls to add the schedule's value to the epoch's logs; the
    override returns `logs` unchanged. If a later Keras drops the hook the curve
    comes back (tests/test_summaries.py checks it is absent).
    Checked: tf_keras 2.21, Keras 3.15.
    """
    if flavour not in _TENSORBOARD_WITHOUT_LR:
        from tfaccel.keras import keras_for  # deferred: tf_keras (tfaccel.keras loads it)

        class TensorBoardWithoutLearningRate(keras_for(flavour).callbacks.TensorBoard):
            def _collect_learning_rate(self, logs):
                return logs

        _TENSORBOARD_WITHOUT_LR[flavour] = TensorBoardWithoutLearningRate
    return _TENSORBOARD_WITHOUT_LR[flavour]


def takes_logs_as_tensors(callback):
    """Tells Keras that `callback` never reads batch logs as NumPy, so steps need not wait.

    Keras's CallbackList converts each batch's logs to NumPy (which waits for
    the step's results) unless every callback with batch hooks sets tf_keras's
    private `Callback._supports_tf_logs`; a monitor that does not read the logs
    sets it so as not to slow the steps it measures. Checked: tf_keras 2.21.
    """
    callback._supports_tf_logs = True
    return callback


def keras3_backup_writing_whole_files():
    """Keras 3's `BackupAndRestore`, subclassed so that a kill mid-backup leaves the last one whole.

    Keras 3.15 writes `latest.weights.h5` in place, then opens
    `training_metadata.json` for writing (emptying it) and writes the epoch
    count: a kill between the two left an empty file that the rerun could not
    read (a CI run's kill -9 test caught one). The subclass writes both files
    under temporary names and renames the weights, then the count, one system
    call apart; only a kill between those two renames leaves the new weights
    beside the old count, and the rerun then trains that epoch once more.

    Built once, on first call (so that importing this module loads no Keras 3).
    Relies on the private hook `_save_model()`, which `on_epoch_end` and
    `on_train_batch_end` call, and on its `_weights_path`,
    `_training_metadata_path`, their `_prev_` copies, `_current_epoch` and
    `_last_batch_seen`. Checked: Keras 3.15.
    """
    if not _KERAS3_WHOLE_FILE_BACKUP:
        from tfaccel.keras import keras3  # deferred: Keras 3 (tfaccel.keras loads it)

        class BackupWritingWholeFiles(keras3().callbacks.BackupAndRestore):
            def _save_model(self):
                os.makedirs(self.backup_dir, exist_ok=True)
                if self.double_checkpoint:
                    for path, prev in ((self._weights_path, self._prev_weights_path),
                                       (self._training_metadata_path,
                                        self._prev_training_metadata_path)):
                        if os.path.exists(path):
                            with atomic_path(prev) as tmp:
                                shutil.copyfile(path, tmp)
                count = json.dumps({"epoch": self._current_epoch, "batch": self._last_batch_seen})
                with atomic_path(self._training_metadata_path) as count_tmp:
                    with open(count_tmp, "w", encoding="utf-8") as f:
                        f.write(count)
                    with atomic_path(self._weights_path) as weights_tmp:
                        self.model.save_weights(weights_tmp)

        _KERAS3_WHOLE_FILE_BACKUP.append(BackupWritingWholeFiles)
    return _KERAS3_WHOLE_FILE_BACKUP[0]
