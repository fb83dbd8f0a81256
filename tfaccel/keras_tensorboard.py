"""`TensorBoard`: Keras's TensorBoard callback for models of either Keras, without a learning rate.

Re-exported as `tfaccel.summaries.TensorBoard`, which is how to use it.
"""

import os

from tfaccel import _compat
from tfaccel.keras import flavour_of, keras
from tfaccel.scalar_file import ScalarFile

_TENSORBOARDS = {}


def _tensorboard_class(flavour):
    """Keras's TensorBoard of `flavour`, its scalars written by `ScalarFile`, no learning rate."""
    if flavour in _TENSORBOARDS:
        return _TENSORBOARDS[flavour]

    class KerasTensorBoard(_compat.tensorboard_without_learning_rate(flavour)):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._scalars = {name: ScalarFile(os.path.join(self.log_dir, name))
                             for name in ("train", "validation")}

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}
            for name, keep in (("train", lambda k: not k.startswith("val_")),
                               ("validation", lambda k: k.startswith("val_"))):
                self._scalars[name].write({f"epoch_{k.removeprefix('val_')}": v
                                           for k, v in logs.items() if keep(k)}, epoch)
            super().on_epoch_end(epoch, {})  # histograms and embeddings, as Keras writes them

        def on_train_batch_end(self, batch, logs=None):
            # Keras writes batch_<metric> at each call even for update_freq='epoch' (0.4 ms each).
            super().on_train_batch_end(batch, None if self.update_freq == "epoch" else logs)

        def on_test_end(self, logs=None):
            optimizer = getattr(self.model, "optimizer", None)
            if logs and optimizer is not None and hasattr(optimizer, "iterations"):
                self._scalars["validation"].write(
                    {f"evaluation_{k}_vs_iterations": v for k, v in logs.items()},
                    int(optimizer.iterations.numpy()), flush=False)
            super().on_test_end({})

        def on_train_end(self, logs=None):
            super().on_train_end(logs)
            for scalar_file in self._scalars.values():
                scalar_file.close()

    _TENSORBOARDS[flavour] = KerasTensorBoard
    return KerasTensorBoard


class TensorBoard(keras.callbacks.Callback):
    """Keras's TensorBoard callback, its scalars written by `ScalarFile`, without a learning rate.

    The scalars (`epoch_<metric>` in `train/` and `validation/`,
    `evaluation_<metric>_vs_iterations`) keep Keras's tags and steps. Keras's
    `epoch_learning_rate` is left out: the rate the *next* update would use,
    one step off `LearningRateLogger`'s `learning_rate`. Everything else
    (graphs, histograms, profiles) is Keras's: the TensorBoard callback of the
    model's own Keras (tf_keras or Keras 3), made when `fit` gives the model.

    Example: `model.fit(ds, callbacks=[summaries.LearningRateLogger("runs/a/logs/train"),
    summaries.TensorBoard("runs/a/logs")])`.
    """

    def __init__(self, log_dir="logs", **kwargs):
        super().__init__()
        self.log_dir, self._kwargs = os.fspath(log_dir), kwargs
        self._keras_callback = self._flavour = None
        _compat.takes_logs_as_tensors(self)  # as Keras's TensorBoard does

    def set_model(self, model):
        super().set_model(model)
        flavour = flavour_of(model)
        if self._keras_callback is None or self._flavour != flavour:
            self._keras_callback = _tensorboard_class(flavour)(self.log_dir, **self._kwargs)
            self._flavour = flavour
            if getattr(self, "params", None):
                self._keras_callback.set_params(self.params)
        self._keras_callback.set_model(model)

    def set_params(self, params):
        super().set_params(params)
        if self._keras_callback is not None:
            self._keras_callback.set_params(params)


def _forward(hook):
    def forwarded(self, *args, **kwargs):
        return getattr(self._keras_callback, hook)(*args, **kwargs)
    forwarded.__name__ = hook
    return forwarded


_FORWARDED = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end",
              "on_train_batch_begin", "on_train_batch_end", "on_test_begin", "on_test_end",
              "on_test_batch_begin", "on_test_batch_end", "on_predict_begin", "on_predict_end",
              "on_predict_batch_begin", "on_predict_batch_end")
for _hook in _FORWARDED:
    setattr(TensorBoard, _hook, _forward(_hook))
