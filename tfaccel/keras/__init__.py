"""The one place that decides which Keras tfaccel drives, and which Keras a model belongs to.

TF-MOT (pruning, quantization-aware training) only accepts tf_keras (Keras 2)
objects, so tfaccel builds, wraps and checks models with tf_keras: every other
tfaccel module does ``from tfaccel.keras import keras``; nothing else imports a
Keras directly. Keras 3 (the `keras` package, what ``import keras`` gives
since TensorFlow 2.16) is recognized here: `flavour_of` tells the two apart,
`keras3()` imports Keras 3 only when asked, and `tfaccel.keras.bridge`
translates models between the two, verified numerically, so that Keras 3 models
reach TF-MOT. `tfmot()` is the one place TF-MOT is imported, with its side
effect (it sets ``TF_USE_LEGACY_KERAS=1`` in the process) undone.

Example:

    from tfaccel.keras import ensure_tf_keras, flavour_of, keras, keras3

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2)])
    ensure_tf_keras(model)   # passes; a Keras 3 model raises WrongKerasError
    flavour_of(model)                              # 'tf_keras'
    flavour_of(keras3().layers.Dense(2))           # 'keras3'

What differs between the two Kerases when a helper picks a class or writes a file sits
here too, as small functions that take either Keras's objects: `clone_with_weights` (the
one layer-by-layer copy of a model), `set_global_policy` (both Kerases' dtype policy),
`save_for_serving` and `saved_flavour` (SavedModels and model files), `check_flavour`.
"""

import json
import os
import sys
import warnings
import zipfile

import tensorflow as tf
import tf_keras as keras

from tfaccel import _aliases, choices
from tfaccel.errors import ConfigError, ModelError, WrongKerasError, first_line as _first_line

FLAVOURS = choices.KERAS_FLAVOURS
"""The Kerases tfaccel knows: tf_keras (Keras 2, what TF-MOT needs) and Keras 3."""

# The top-level package a class comes from -> its flavour.
_PACKAGES = {"tf_keras": "tf_keras", "keras": "keras3"}

_HOW_TO_FIX = (
    "build it with `from tfaccel.keras import keras` (or `import tf_keras`), "
    "or set TF_USE_LEGACY_KERAS=1 before importing TensorFlow so that tf.keras is Keras 2"
)
_BRIDGE = "or translate it with tfaccel.keras.bridge.to_tf_keras(model)"


def _flavour_or_none(obj):
    for cls in type(obj).__mro__:
        package = (cls.__module__ or "").partition(".")[0]
        if package in _PACKAGES:
            return _PACKAGES[package]
    return None


def flavour_of(obj) -> str:
    """'tf_keras' or 'keras3': the Keras that `obj` (a model, layer, optimizer...) belongs to.

    Read from the classes of `obj`, so asking never imports a Keras: a Keras 3
    object exists only once Keras 3 is imported.

    Raises:
      ModelError: `obj` is an instance of neither Keras.
    """
    flavour = _flavour_or_none(obj)
    if flavour is None:
        raise ModelError(f"{type(obj).__name__} object {obj!r:.60} comes from neither tf_keras "
                         "nor Keras 3: pass a Keras model, layer or optimizer")
    return flavour


def is_keras3_object(obj) -> bool:
    """True when `obj` is an instance of a Keras 3 (`keras` package) class."""
    return _flavour_or_none(obj) == "keras3"


def keras3():
    """The Keras 3 package (`import keras`), imported on first call, never before.

    Raises:
      ModelError: Keras 3 is not installed, or `keras` is an old Keras 2.
    """
    try:
        import keras as keras_3  # deferred: Keras 3; the one import of Keras 3 in tfaccel
    except ImportError as e:
        raise ModelError(f"Keras 3 is not installed ({e}): pip install 'keras>=3'") from None
    if not keras_3.__version__.startswith("3."):
        raise ModelError(f"the `keras` package is {keras_3.__version__}, not Keras 3: "
                         "pip install 'keras>=3'")
    return keras_3


def keras3_if_loaded():
    """Keras 3 if this process has imported it already, else None (and nothing is imported).

    For settings that apply to every Keras in use (the global dtype policy): a program
    that never imported Keras 3 builds no Keras 3 model.
    """
    module = sys.modules.get("keras")
    version = str(vars(module).get("__version__", "")) if module is not None else ""
    return module if version.startswith("3.") else None


def check_flavour(flavour: str) -> str:
    """Returns `flavour` if it names a Keras tfaccel knows ('tf_keras' or 'keras3').

    Raises:
      ConfigError: an unknown flavour.
    """
    if flavour not in FLAVOURS:
        raise ConfigError(f"unknown Keras flavour={flavour!r}: use one of {', '.join(FLAVOURS)}")
    return flavour


def keras_for(flavour: str):
    """The Keras package of `flavour` ('tf_keras' or 'keras3'): `tf_keras` or Keras 3.

    Raises:
      ConfigError: an unknown flavour.
    """
    return keras3() if check_flavour(flavour) == "keras3" else keras


def keras_of(obj):
    """The Keras package `obj` (a model, layer, optimizer...) belongs to: `tf_keras` or Keras 3.

    How a helper serves both Kerases: it builds what it adds to a model (losses,
    metrics, optimizers, policies, clones) from the model's own Keras.

    Raises:
      ModelError: `obj` is an instance of neither Keras.
    """
    return keras_for(flavour_of(obj))


def _from_config(layer):
    return type(layer).from_config(layer.get_config())


def clone_with_weights(model, clone_layer=None, *, wrap=None, nested=True):
    """A copy of a Sequential or functional `model` (either Keras) holding the same weights.

    The one way tfaccel copies a model layer by layer: the model's own Keras's
    `clone_model` calls `clone_layer(layer)` for each layer (by default a new layer
    of the same class and config), `wrap(layer, new)` may put the new layer in a
    wrapper (pruning, a QAT annotation), and each new layer then gets the weights
    of the layer it stands for, so a layer may change its dtype policy or its
    wrapper (which changes the model's order of weights) and keep its values. The
    copy's variables are created in the current strategy scope; it is not compiled.

    Example:

        copy = clone_with_weights(model)                     # same outputs, new variables
        half = clone_with_weights(model, lambda layer: type(layer).from_config(
            {**layer.get_config(), "dtype": "mixed_bfloat16"}))

    Args:
      model: a built Sequential or functional model of either Keras.
      clone_layer: fn(layer) -> the unbuilt layer that stands for `layer` in the copy.
      wrap: fn(layer, new) -> what the copy calls in place of `layer`: `new` or a
        wrapper around it (the weights go into `new`).
      nested: copy the layers of a nested model one by one too (`clone_layer` sees
        them, not the nested model); False hands a nested model to `clone_layer`.

    Returns:
      The copy.

    Raises:
      ValueError: a subclassed model (Keras cannot clone it); whatever `clone_layer` or
        `wrap` raise.
    """
    k = keras_of(model)
    clone_layer = clone_layer or _from_config
    pairs = []

    def clone(layer):
        if nested and isinstance(layer, k.Model):
            return k.models.clone_model(layer, clone_function=clone)
        new = clone_layer(layer)
        pairs.append((layer, new))
        return wrap(layer, new) if wrap is not None else new

    copy = k.models.clone_model(model, clone_function=clone)
    for old, new in pairs:
        if old.weights:
            new.set_weights(old.get_weights())
    return copy


def _with_dtype(config, name):
    """`config` (a serialized model) with every layer's dtype policy replaced by `name`."""
    if isinstance(config, dict):
        return {k: (name if k == "dtype" else _with_dtype(v, name)) for k, v in config.items()}
    if isinstance(config, list):
        return [_with_dtype(v, name) for v in config]
    return config


def rebuild_from_config(model, dtype=None):
    """`model` rebuilt from its own serialized config (every dtype policy `dtype` when given),
    same class, holding the same weights; None when its class does not rebuild that way (no
    usable config, or other weights).

    How a model of a class of its own is copied (a KerasHub `GPT2CausalLM` stays one, with
    its `generate()`), where `clone_with_weights` would make a plain functional model.
    """
    saving = keras_of(model).saving
    previous = None
    try:
        if dtype is not None:
            previous = set_global_policy(dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Keras 3: "compile() was not called" (we do not)
            config = saving.serialize_keras_object(model)
            clone = saving.deserialize_keras_object(
                config if dtype is None else _with_dtype(config, dtype))
        if type(clone) is not type(model) or len(clone.weights) != len(model.weights):
            return None
        clone.set_weights(model.get_weights())
    except Exception:  # noqa: BLE001 (any class whose config does not rebuild it: None)
        return None
    finally:
        if previous is not None:
            set_global_policy(previous)
    return clone


def copy_model(model, what="copy"):
    """A new model of `model`'s own class (either Keras) holding the same weights, nothing
    shared: rebuilt from its config (`rebuild_from_config`: KerasHub tasks, subclasses with a
    config, registered layers), else layer by layer (`clone_with_weights`: a Sequential or
    functional model whose custom layers are not registered for serialization).

    Raises:
      ModelError: neither works (a subclassed model without a config): one line, `what`
        naming the purpose.
    """
    clone = rebuild_from_config(model)
    if clone is not None:
        return clone
    try:
        return clone_with_weights(model)
    except (TypeError, ValueError, NotImplementedError) as e:
        raise ModelError(f"cannot {what} model {model.name!r} ({type(model).__name__}): its "
                         f"get_config() does not rebuild it and Keras cannot clone it "
                         f"({_first_line(e)}): give it a get_config(), or build it as a "
                         "functional model") from None


def set_global_policy(name: str) -> str:
    """Sets the global dtype policy `name` of tf_keras and, if imported, Keras 3.

    Keras 3 is not imported for this: a program that has not imported it builds
    no Keras 3 model.

    Returns:
      The name of tf_keras's previous global policy.
    """
    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(name)
    keras_3 = keras3_if_loaded()
    if keras_3 is not None:
        keras_3.config.set_dtype_policy(name)
    return previous


def save_for_serving(model, path):
    """Writes `model` (either Keras) to `path` as a SavedModel for serving, without optimizer.

    tf_keras saves one with `model.save`; Keras 3 writes SavedModels only through
    `model.export`.
    """
    if is_keras3_object(model):
        model.export(path, format="tf_saved_model", verbose=False)
    else:
        model.save(path, save_format="tf", include_optimizer=False)
    return path


def saved_flavour(path):
    """(flavour, version) of the Keras that wrote the model file `path`.

    ('keras3', '3.15.1') for a .keras file written by Keras 3 (its metadata.json
    says so); ('tf_keras', version) for one written by tf_keras, and
    ('tf_keras', None) for anything else (.h5 files, SavedModel directories,
    which tf_keras reads).
    """
    version = None
    if os.path.isfile(path) and zipfile.is_zipfile(path):
        try:
            with zipfile.ZipFile(path) as archive:
                metadata = json.loads(archive.read("metadata.json"))
            version = str(metadata.get("keras_version") or "") or None
        except (KeyError, ValueError, OSError, zipfile.BadZipFile):
            version = None
    return ("keras3" if version and not version.startswith("2.") else "tf_keras"), version


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
        bridge = f", {_BRIDGE}" if what == "model" else ""
        raise WrongKerasError(
            f"{what} {name!r} is a Keras 3 object ({type(obj).__module__}.{type(obj).__name__}) "
            f"but tfaccel drives tf_keras (Keras 2, required by TF-MOT): {_HOW_TO_FIX}{bridge}."
        )
    return obj


def tfmot():
    """The `tensorflow_model_optimization` package, imported here and nowhere else.

    Importing TF-MOT sets ``TF_USE_LEGACY_KERAS=1`` in the process and then reads
    `tf.keras`, which would make `tf.keras` (if nothing had read it yet) tf_keras
    for good. Here `tf.keras` is resolved first, under the environment the user
    set, and the variable is put back as it was, so `import keras`, `tf.keras`
    and ``os.environ`` look after the import as they did before it. Imported on
    first use: it is slow.
    """
    module = sys.modules.get("tensorflow_model_optimization")
    if module is not None:
        return module

    before = os.environ.get("TF_USE_LEGACY_KERAS")
    getattr(tf.keras, "version", None)  # resolves the lazy tf.keras as the user's setting says
    try:
        import tensorflow_model_optimization  # deferred: TF-MOT
    finally:
        if before is None:
            os.environ.pop("TF_USE_LEGACY_KERAS", None)
        else:
            os.environ["TF_USE_LEGACY_KERAS"] = before
    return tensorflow_model_optimization


def input_specs(model, batch_size=None, sequence_length=None):
    """`tf.TensorSpec`s of `model`'s inputs (either Keras), in `model.inputs` order, with the
    batch dimension `batch_size` and every other unknown dimension `sequence_length`.

    What a traced or exported step needs: a fixed signature. A variable-length input (token
    ids of shape (None, None)) is given the length the caller chooses, not a failure.

    Raises:
      ModelError: the model has no inputs yet (not built).
      ConfigError: a variable-length input and no `sequence_length`.
    """
    inputs = getattr(model, "inputs", None)
    if not inputs:
        raise ModelError(f"model {model.name!r} has no inputs yet: build it (call it once or "
                         "give it an Input) first")
    specs = []
    for tensor in inputs:
        name = getattr(tensor, "name", None)
        shape = [batch_size, *tensor.shape[1:]]
        if any(d is None for d in shape[1:]):
            if sequence_length is None:
                raise ConfigError(f"input {name!r} of {model.name!r} has a variable length "
                                  f"{tuple(tensor.shape)}: pass sequence_length= (the length "
                                  "to fix it at)")
            shape = [shape[0], *(int(sequence_length) if d is None else d for d in shape[1:])]
        specs.append(tf.TensorSpec(shape, tf.as_dtype(tensor.dtype), name=name))
    return specs


__getattr__ = _aliases.submodule_getattr(__name__)  # tfaccel.keras.bridge, loaded on first use

__all__ = ["keras", "keras3_if_loaded", "keras_for", "keras_of", "ensure_tf_keras",
           "is_keras3_object", "flavour_of", "keras3", "FLAVOURS", "check_flavour",
           "clone_with_weights", "set_global_policy", "save_for_serving", "saved_flavour",
           "tfmot", "input_specs", "copy_model", "rebuild_from_config"]
