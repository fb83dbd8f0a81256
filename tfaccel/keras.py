"""The one place that decides which Keras tfaccel drives.

TF-MOT (pruning, quantization-aware training) only accepts tf_keras (Keras 2)
objects, so tfaccel builds, wraps and checks models with tf_keras. Every other
tfaccel module does ``from tfaccel.keras import keras``; nothing else imports a
Keras directly. Keras 3 support can later be added here, behind the same names.

Example:

    from tfaccel.keras import keras, ensure_tf_keras

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    ensure_tf_keras(model)   # passes; a Keras 3 model raises WrongKerasError
"""

import tf_keras as keras

from tfaccel.errors import WrongKerasError

_HOW_TO_FIX = (
    "build it with `from tfaccel.keras import keras` (or `import tf_keras`), "
    "or set TF_USE_LEGACY_KERAS=1 before importing TensorFlow so that tf.keras is Keras 2"
)


def is_keras3_object(obj) -> bool:
    """True when `obj` is an instance of a Keras 3 (`keras` package) class."""
    for cls in type(obj).__mro__:
        module = cls.__module__ or ""
        if module == "keras" or module.startswith("keras."):
            return True
    return False


def ensure_tf_keras(obj, what: str = "model"):
    """Returns `obj` unchanged if it is a tf_keras object, else raises.

    Args:
      obj: a model, layer or optimizer.
      what: how to call `obj` in the error message.

    Returns:
      `obj`.

    Raises:
      WrongKerasError: `obj` comes from Keras 3, which TF-MOT rejects.
    """
    if is_keras3_object(obj):
        name = getattr(obj, "name", type(obj).__name__)
        raise WrongKerasError(
            f"{what} {name!r} is a Keras 3 object ({type(obj).__module__}.{type(obj).__name__}) "
            f"but tfaccel drives tf_keras (Keras 2, required by TF-MOT): {_HOW_TO_FIX}."
        )
    return obj


__all__ = ["keras", "ensure_tf_keras", "is_keras3_object"]
