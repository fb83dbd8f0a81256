"""Private touchpoints: summaries and monitor (tf_keras TensorBoard callback)."""

_TENSORBOARD_WITHOUT_LR = {}


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
