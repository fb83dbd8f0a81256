"""Compiling, fitting, evaluating and exporting a classifier the way recipes do it.

These are the steps every recipe shares, as plain functions so that users'
own code can call them too.

Example:

    from tfaccel import data, models, training

    splits = data.load_dataset("digits")
    model = models.build_model("cnn", splits.info.input_shape, splits.info.num_classes)
    training.compile_classifier(model, training.make_optimizer("adam", 1e-3))
    model.fit(data.batch_dataset(splits.train, 64, training=True), epochs=5)
    print(training.evaluate(model, data.batch_dataset(splits.test, 256, training=False)))
"""

import os

from tfaccel.errors import ConfigError
from tfaccel.io import atomic_path
from tfaccel.keras import ensure_tf_keras, keras

OPTIMIZERS = ("sgd", "momentum", "adam", "adamw", "rmsprop")


def make_optimizer(name, learning_rate, weight_decay=1e-4):
    """An optimizer by name; `learning_rate` may be a float or a LearningRateSchedule."""
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate)
    if name == "momentum":
        return keras.optimizers.SGD(learning_rate, momentum=0.9, nesterov=True)
    if name == "adam":
        return keras.optimizers.Adam(learning_rate)
    if name == "adamw":
        return keras.optimizers.AdamW(learning_rate, weight_decay=weight_decay)
    if name == "rmsprop":
        return keras.optimizers.RMSprop(learning_rate)
    raise ConfigError(f"unknown optimizer {name!r}: use one of {', '.join(OPTIMIZERS)}")


def compile_classifier(model, optimizer, jit_compile=False, steps_per_execution=1):
    """Compiles `model` for integer labels and softmax outputs, tracking accuracy."""
    ensure_tf_keras(model)
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
        model.save(tmp, save_format="tf", include_optimizer=False)
    return {"keras": keras_path, "saved_model": saved_path}
