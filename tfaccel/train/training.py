"""Compiling, fitting, evaluating and exporting a classifier the way recipes do it.

These are the steps every recipe shares, as plain functions so that users'
own code can call them too.

Example:

    from tfaccel import data
    from tfaccel.train import models, training

    splits = data.load_dataset("digits")
    model = models.build_model("cnn", splits.info.input_shape, splits.info.num_classes)
    training.compile_classifier(model, training.make_optimizer("adam", 1e-3))
    model.fit(data.batch_dataset(splits.train, 64, training=True), epochs=5)
    print(training.evaluate(model, data.batch_dataset(splits.test, 256, training=False)))
"""

import json
import math
import os

from tfaccel import _compat, distribute
from tfaccel.choices import OPTIMIZERS
from tfaccel.errors import ConfigError, TrainingError
from tfaccel.io import atomic_path
from tfaccel.keras import keras, keras_for, keras_of, save_for_serving
from tfaccel.summaries import current_learning_rate
from tfaccel.train import resume
from tfaccel.train.schedules import for_keras


def make_optimizer(name, learning_rate, weight_decay=1e-4, *, beta_2=0.999, clip_norm=None,
                   ema_momentum=None, flavour="tf_keras", accumulation_steps=None):
    """An optimizer by name; `learning_rate` may be a float or a LearningRateSchedule.

    `flavour` is the Keras of the model it will train ('tf_keras' or 'keras3';
    `tfaccel.keras.flavour_of(model)`); a tfaccel schedule is adapted to Keras 3
    (`schedules.for_keras`). `accumulation_steps` (Keras 3 only) is Keras 3's own
    `gradient_accumulation_steps`: the update every N steps with the mean
    gradient of N batches (tf_keras models accumulate within a step instead:
    `tfaccel.performance.accumulate`).

    `beta_2` is Adam's and AdamW's second-moment decay (0.99 suits small batches of a
    language model, as nanoGPT uses); `clip_norm` clips the global gradient norm (None: no
    clipping); `ema_momentum` (e.g. 0.99) keeps an exponential moving average of the
    weights, which `fit` writes into the model when it ends (Keras's `use_ema`): the
    model trained then evaluates and exports with the averaged weights, while
    the per-epoch validation during `fit` sees the raw ones.
    """
    options = {} if not clip_norm else {"global_clipnorm": float(clip_norm)}
    if ema_momentum:
        options.update(use_ema=True, ema_momentum=float(ema_momentum))
    if accumulation_steps and accumulation_steps > 1:
        if flavour != "keras3":
            raise ConfigError("accumulation_steps is Keras 3's optimizer argument: for a tf_keras "
                              "model use tfaccel.enable_gradient_accumulation(model, steps)")
        options["gradient_accumulation_steps"] = int(accumulation_steps)
    keras = keras_for(flavour)
    learning_rate = for_keras(learning_rate, flavour, accumulation_steps or 1)
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate, **options)
    if name == "momentum":
        return keras.optimizers.SGD(learning_rate, momentum=0.9, nesterov=True, **options)
    if name == "adam":
        return keras.optimizers.Adam(learning_rate, beta_2=beta_2, **options)
    if name == "adamw":
        return keras.optimizers.AdamW(learning_rate, weight_decay=weight_decay, beta_2=beta_2,
                                      **options)
    if name == "rmsprop":
        return keras.optimizers.RMSprop(learning_rate, **options)
    raise ConfigError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")


def compile_classifier(model, optimizer, jit_compile=False, steps_per_execution=1):
    """Compiles `model` (either Keras) for integer labels and softmax outputs, tracking accuracy.

    The optimizer must come from the model's Keras (`make_optimizer(flavour=...)`).
    """
    keras = keras_of(model)
    if keras_of(optimizer) is not keras:
        raise ConfigError(f"the optimizer is a {keras_of(optimizer).__name__} one but model "
                          f"{model.name!r} is a {keras.__name__} model: make it with "
                          "make_optimizer(..., flavour=tfaccel.keras.flavour_of(model))")
    model.compile(
        optimizer=optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(),
        metrics=[keras.metrics.SparseCategoricalAccuracy(name="accuracy")],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


def evaluate(model, dataset):
    """{'loss': ..., 'accuracy': ...} of `model` on a batched dataset."""
    values = model.evaluate(dataset, verbose=0, return_dict=True)
    return {k: float(v) for k, v in values.items()}


def export_model(model, directory, keras_name="model.keras", saved_model_name="saved_model"):
    """Saves `model` as a .keras file and a SavedModel directory, each atomically.

    The .keras file keeps the compiled optimizer state (Keras's native format
    always does, so training can continue from it); the SavedModel, meant for
    serving, leaves it out, which makes it about a third of the size for a small
    model.

    Returns:
      {'keras': path, 'saved_model': path}.
    """
    os.makedirs(directory, exist_ok=True)
    keras_path = os.path.join(directory, keras_name)
    saved_path = os.path.join(directory, saved_model_name)
    with atomic_path(keras_path) as tmp:
        model.save(tmp)
    with atomic_path(saved_path) as tmp:
        save_for_serving(model, tmp)
    return {"keras": keras_path, "saved_model": saved_path}


def read_finished_run(model_dir, metrics_name="metrics.json",
                      artifacts=("model.keras", "saved_model")):
    """The metrics of the finished run in `model_dir`, or None if it holds none or only part of one.

    A run is finished when its metrics file exists and every artifact named in
    `artifacts` is there too. Recipes write the metrics file last and
    atomically, so it marks a complete set of outputs: a run killed while
    exporting has none, and its rerun must write them again.
    """
    path = os.path.join(os.fspath(model_dir), metrics_name)
    try:
        with open(path, encoding="utf-8") as f:
            metrics = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(metrics, dict):
        return None
    if not all(os.path.exists(os.path.join(os.fspath(model_dir), a)) for a in artifacts):
        return None
    return metrics


def settle_finished_run(model_dir, backup_dir, strategy, retrain=False,
                        artifacts=("model.keras", "saved_model")):
    """What a rerun of a recipe in `model_dir` must do: the finished run's metrics (do not
    train again), or None (train: nothing finished, or `retrain`).

    Every worker reads the same folder, so all of them decide alike; the chief then
    removes the backup a kill after metrics.json left behind, and under `retrain` that
    metrics file too, before any worker could restore the stale backup.
    """

    finished = read_finished_run(model_dir, artifacts=artifacts)
    distribute.barrier(strategy)  # every worker has read it before the chief may change it
    if finished is None:
        return None
    if distribute.is_chief(strategy):
        resume.remove_backup(backup_dir)
        if retrain:
            os.remove(os.path.join(os.fspath(model_dir), "metrics.json"))
    if not retrain:
        return finished
    distribute.barrier(strategy)
    return None


_MAX_PENDING = 1000  # steps whose losses StopOnNonFiniteLoss keeps unread at most


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Stops `fit` with a `TrainingError` naming the first step whose loss is NaN or infinite.

    Keras's `TerminateOnNaN` only sets `stop_training`: `fit` then returns as if
    it had finished, and what comes next (evaluation, export, a report) runs on
    a broken model and writes results that look like any other. Raising instead
    ends the program before those are written; recipes turn it into one
    `error:` line and exit code 2. A `BackupAndRestore` backup of the last
    finished epoch is kept (Keras deletes nothing when `fit` raises).

    The losses are read every `check_every_n_steps` steps and at each epoch's
    end, before the callbacks after it in the list back up or log that epoch,
    never at each step: a per-step read makes the host wait for every step
    (on a GPU, it stops queueing the next one) and makes Keras convert every
    step's logs. The step named is still the first non-finite one (Keras's
    running mean of the loss stays non-finite from that step on), and
    `resume.PeriodicBackup` backs up no step from there on. The learning rate
    named is the one at the check.

    The message names the likely cause: a loss already non-finite at the very
    first step, before any update, comes from the data (or the model's
    initialization), not from the learning rate; float16 without loss scaling
    overflows; otherwise the learning rate is usually too high.

    Example:

        model.fit(train_ds, epochs=10, callbacks=[training.StopOnNonFiniteLoss()])
        # TrainingError: the training loss became nan at epoch 3, step 7 (learning rate 10): ...

    Args:
      check_every_n_steps: read the losses this often within an epoch (None:
        at the epoch's end, and every 1000 steps of a long epoch).

    Raises:
      TrainingError: from `fit`, at the first check after a non-finite loss.
    """

    def __init__(self, check_every_n_steps=None):
        super().__init__()
        if check_every_n_steps is not None and int(check_every_n_steps) < 1:
            raise ConfigError(f"check_every_n_steps={check_every_n_steps} must be at least 1 "
                              "(or None: at each epoch's end)")
        self.check_every_n_steps = check_every_n_steps and int(check_every_n_steps)
        _compat.takes_logs_as_tensors(self)  # it keeps the loss tensors and reads them later
        self._epoch = 0
        self._pending = []  # (batch, steps seen this epoch, loss tensor) not yet read
        self._start_step = 0
        self._steps_seen = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch
        self._pending = []
        # Steps done before this epoch (a resumed run counts on): tells the first update ever.
        self._start_step = int(self.model.optimizer.iterations.numpy())
        self._steps_seen = 0

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        self._steps_seen += 1
        if loss is None:
            return
        self._pending.append((batch, self._steps_seen, loss))
        if len(self._pending) >= (self.check_every_n_steps or _MAX_PENDING):
            self._check()

    def on_epoch_end(self, epoch, logs=None):
        self._check()

    def _check(self):
        pending, self._pending = self._pending, []
        if not pending or math.isfinite(float(pending[-1][2])):  # the running mean: one read
            return
        for batch, seen, loss in pending:
            value = float(loss)
            if not math.isfinite(value):
                first = self._start_step + seen <= 1  # the model's first update ever
                raise TrainingError(self._message(value, batch, first))

    def _message(self, loss, batch, first):
        where = f"epoch {self._epoch + 1}, step {batch + 1}"
        try:
            rate = f"learning rate {current_learning_rate(self.model.optimizer):g}"
        except (AttributeError, TypeError, ValueError):
            rate = "learning rate unknown"
        float16 = any(getattr(layer, "compute_dtype", None) == "float16"
                      for layer in _layers(self.model))
        scaled = isinstance(self.model.optimizer,
                            keras_of(self.model).mixed_precision.LossScaleOptimizer)
        if first:
            return (f"the training loss was {loss} at the first step ({where}), before any "
                    "update: check the data for NaN/Inf values (and labels in range), or the "
                    "model's output")
        fixes = ["lower the learning rate (e.g. by 10x)",
                 "check the data for NaN/Inf values"]
        if float16 and not scaled:
            fixes.insert(0, "use loss scaling for float16 (tfaccel.wrap_optimizer)")
        else:
            fixes.insert(1, "use loss scaling if training in float16")
        return (f"the training loss became {loss} at {where} ({rate}): "
                f"{', '.join(fixes[:-1])}, or {fixes[-1]}")


def _layers(model):
    """Every layer inside `model`, those of nested models too, in either Keras."""
    for layer in getattr(model, "layers", ()):
        yield layer
        yield from _layers(layer)
