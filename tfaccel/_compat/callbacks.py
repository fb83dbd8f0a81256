"""Private touchpoints: summaries and monitor (tf_keras TensorBoard callback)."""

_TENSORBOARD_WITHOUT_LR = []


def tensorboard_without_learning_rate():
    """Keras's TensorBoard callback class, subclassed to log no `epoch_learning_rate` scalar.

    Built once, on first call (so that importing this module loads no Keras).
    Relies on tf_keras's private hook `TensorBoard._collect_learning_rate(logs)`,
    which `on_epoch_end` calls to add the schedule's value to the epoch's logs;
    the override returns `logs` unchanged. If a later tf_keras drops the hook
    the curve comes back (tests/test_summaries.py checks it is absent).
    Checked: tf_keras 2.21.
    """
    if not _TENSORBOARD_WITHOUT_LR:
        from tfaccel.keras import keras

        class TensorBoardWithoutLearningRate(keras.callbacks.TensorBoard):
            def _collect_learning_rate(self, logs):
                return logs

        _TENSORBOARD_WITHOUT_LR.append(TensorBoardWithoutLearningRate)
    return _TENSORBOARD_WITHOUT_LR[0]


def takes_logs_as_tensors(callback):
    """Tells Keras that `callback` never reads batch logs as NumPy, so steps need not wait.

    Keras's CallbackList converts each batch's logs to NumPy (which waits for
    the step's results) unless every callback with batch hooks sets tf_keras's
    private `Callback._supports_tf_logs`; a monitor that does not read the logs
    sets it so as not to slow the steps it measures. Checked: tf_keras 2.21.
    """
    callback._supports_tf_logs = True
    return callback
