"""A small model zoo that fits any input shape and class count, and the user's own models.

Every model ends in a float32 softmax (so it stays float32 under a mixed
precision policy) and is a flat functional tf_keras model, which is what TF-MOT
pruning and quantization accept.

Example:

    from tfaccel.train.models import build_model

    model = build_model("cnn", input_shape=(8, 8, 1), num_classes=10)
    model.summary()
"""

import importlib
import inspect
import os
import traceback

import numpy as np

from tfaccel import _compat
from tfaccel.choices import MODELS
from tfaccel.errors import ModelError, WrongKerasError, first_line
from tfaccel.keras import bridge, flavour_of, keras, keras_for, saved_flavour
from tfaccel.train import gpt_layers  # noqa: F401  (registers tfaccel's layers: its files load)
from tfaccel.train.precision import precision_scope
from tfaccel.train.schedules import keras3_schedule_class

MODEL_FILE_HINT = "a .keras/.h5 file or a SavedModel directory"


def _head(x, num_classes):
    x = keras.layers.Dense(num_classes, name="logits")(x)
    return keras.layers.Activation("softmax", dtype="float32", name="probabilities")(x)


def mlp(input_shape, num_classes, hidden=(256, 128), dropout=0.1):
    """Flatten, then dense ReLU layers with dropout."""
    inputs = keras.Input(input_shape, name="image")
    x = keras.layers.Flatten()(inputs)
    for i, units in enumerate(hidden):
        x = keras.layers.Dense(units, activation="relu", name=f"dense_{i}")(x)
        if dropout:
            x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, _head(x, num_classes), name="mlp")


def cnn(input_shape, num_classes, filters=(32, 64), dense_units=128, dropout=0.25):
    """Two 3x3 convolutions, max pooling, a dense layer: ~151k parameters on 8x8 digits."""
    inputs = keras.Input(input_shape, name="image")
    x = inputs
    for i, f in enumerate(filters):
        x = keras.layers.Conv2D(f, 3, padding="same", activation="relu", name=f"conv_{i}")(x)
    x = keras.layers.MaxPooling2D(2, name="pool")(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dropout(dropout)(x)
    x = keras.layers.Dense(dense_units, activation="relu", name="dense")(x)
    x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, _head(x, num_classes), name="cnn")


def resnet(input_shape, num_classes, widths=(16, 32, 64), blocks_per_stage=2):
    """A small pre-pooling residual network with BatchNorm (ResNet-v1 basic blocks)."""

    def conv_bn(x, filters, stride, name, relu=True):
        x = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False,
                                name=f"{name}_conv")(x)
        x = keras.layers.BatchNormalization(name=f"{name}_bn")(x)
        return keras.layers.ReLU(name=f"{name}_relu")(x) if relu else x

    inputs = keras.Input(input_shape, name="image")
    x = conv_bn(inputs, widths[0], 1, "stem")
    for s, width in enumerate(widths):
        for b in range(blocks_per_stage):
            stride = 2 if (b == 0 and s > 0 and min(x.shape[1:3]) >= 4) else 1
            name = f"stage{s}_block{b}"
            shortcut = x
            y = conv_bn(x, width, stride, f"{name}_a")
            y = conv_bn(y, width, 1, f"{name}_b", relu=False)
            if stride != 1 or shortcut.shape[-1] != width:
                shortcut = keras.layers.Conv2D(width, 1, strides=stride, use_bias=False,
                                               name=f"{name}_proj")(shortcut)
                shortcut = keras.layers.BatchNormalization(name=f"{name}_proj_bn")(shortcut)
            x = keras.layers.ReLU(name=f"{name}_out")(
                keras.layers.Add(name=f"{name}_add")([y, shortcut]))
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, _head(x, num_classes), name="resnet")


def mobilenet_v2(input_shape, num_classes, alpha=0.35, bn_momentum=0.9):
    """Keras's MobileNetV2 (random init, `weights=None`), upsampled to 32x32 if smaller.

    BatchNorm momentum is `bn_momentum` (Keras: 0.999), so that the moving statistics
    settle within the short runs small datasets get.
    """
    inputs = keras.Input(input_shape, name="image")
    x = inputs
    if len(input_shape) != 3:
        raise ModelError(f"mobilenet_v2 needs image inputs (height, width, channels), got "
                         f"{input_shape}")
    if min(input_shape[:2]) < 32:
        x = keras.layers.Resizing(max(32, input_shape[0]), max(32, input_shape[1]),
                                  name="upsample")(x)
    base = keras.applications.MobileNetV2(input_tensor=x, include_top=False, weights=None,
                                          alpha=alpha, pooling="avg")
    # Keras's momentum 0.999 suits ImageNet's long runs; after a few hundred steps (digits: 30
    # epochs of 23) the moving statistics are still far off and inference scores chance.
    for layer in base.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = bn_momentum
    return keras.Model(inputs, _head(base.output, num_classes), name="mobilenet_v2")


_BUILDERS = {"mlp": mlp, "cnn": cnn, "resnet": resnet, "mobilenet_v2": mobilenet_v2}


def build_model(name, input_shape, num_classes, **kwargs):
    """Builds a zoo model by name (one of `MODELS`)."""
    if name not in _BUILDERS:
        raise ModelError(f"unknown model {name!r}: use one of {', '.join(MODELS)}, "
                         f"or give {MODEL_FILE_HINT}")
    if num_classes < 2:
        raise ModelError(f"num_classes={num_classes}: a classifier needs at least 2 classes")
    return _BUILDERS[name](tuple(input_shape), int(num_classes), **kwargs)


def is_model_path(spec: str) -> bool:
    """True when `spec` names a file or directory rather than a zoo model."""
    return (os.sep in spec or "/" in spec or spec.endswith((".keras", ".h5"))
            or os.path.exists(spec))


def load_model_file(path, compile=False):
    """Loads a model from a .keras/.h5 file or a SavedModel directory, in the Keras that saved it.

    A .keras file written by Keras 3 loads as a Keras 3 model (tfaccel's schedules
    registered for its optimizer); anything else as a tf_keras model.
    """
    if not os.path.exists(path):
        raise ModelError(f"model file {path!r} does not exist: give {MODEL_FILE_HINT}, "
                         f"or one of {', '.join(MODELS)}")

    flavour, version = saved_flavour(path)
    if flavour == "keras3":
        keras3_schedule_class()  # registers it: a saved Keras 3 optimizer may hold one
        saved_by = f"Keras {version}"
    else:
        saved_by = "tf_keras"
    loader = keras_for(flavour)
    try:
        model = loader.models.load_model(path, compile=compile)
    except Exception as e:  # loaders raise many types for a bad file
        raise ModelError(f"cannot load model {path!r} ({first_line(e)}): give {MODEL_FILE_HINT} "
                         f"saved by {saved_by}") from None
    if not isinstance(model, loader.Model):
        raise ModelError(f"{path!r} holds a {type(model).__name__}, not a Keras model: save it "
                         "with model.save()")
    return model


def as_flavour(model, flavour, what="model"):
    """`model` in Keras `flavour` ('tf_keras', 'keras3'; None: as it is), translated if need be.

    The translation is `tfaccel.keras.bridge`'s, verified on sample inputs; a
    model it cannot translate (custom layers, subclassed) is refused with one
    error naming the layers.
    """
    if flavour is None or flavour_of(model) == flavour:
        return model
    try:
        return bridge.to_flavour(model, flavour)
    except (ModelError, WrongKerasError) as e:
        raise ModelError(f"{what} {model.name!r} is a {flavour_of(model)} model and cannot "
                         f"become a {flavour} one: {e}") from None


def model_from_fn(spec, input_shape, num_classes):
    """Calls a user function 'package.module:function'(input_shape, num_classes)."""
    return call_model_fn(spec, input_shape=tuple(input_shape), num_classes=int(num_classes))


def call_model_fn(spec, **kwargs):
    """The Keras model (either Keras) a user function 'package.module:function'(**kwargs)
    returns; every way it can fail (no such module or function, the wrong signature, an
    exception in the user's code, not a model) is one ModelError line naming the fix.

    Example:

        call_model_fn("my_models:tiny_lm", vocabulary_size=104, sequence_length=64)
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ModelError(f"--model_fn={spec!r} must look like package.module:function")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):  # the module itself is not on the path
            raise ModelError(f"--model_fn={spec!r}: cannot import {module_name!r} (no module "
                             f"named {e.name!r}): put the folder holding it on PYTHONPATH, e.g. "
                             "PYTHONPATH=/path/to/folder (the current folder is not searched)"
                             ) from None
        raise ModelError(f"--model_fn={spec!r}: cannot import {module_name!r}: importing it "
                         f"raised {first_line(e, with_type=True)}: install what it needs"
                         ) from None
    except Exception as e:  # the user's module failed while importing
        raise ModelError(f"--model_fn={spec!r}: cannot import {module_name!r}: importing it "
                         f"raised {first_line(e, with_type=True)}"
                         f"{_where_in_module(e, module_name)}: fix that module") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ModelError(f"--model_fn={spec!r}: module {module_name!r} has no function {attr!r}")
    names = ", ".join(kwargs)
    call = ", ".join(f"{k}={v}" for k, v in kwargs.items())
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as e:
        raise ModelError(f"--model_fn={spec!r}: your function cannot be called as "
                         f"{attr}({', '.join(f'{k}=...' for k in kwargs)}) ({e}): define it as "
                         f"def {attr}({names})") from None
    except ValueError:  # no signature to inspect (a builtin): let the call decide
        pass
    try:
        model = fn(**kwargs)
    except Exception as e:  # the user's code: any exception, reported as theirs
        raise ModelError(f"--model_fn={spec!r}: your function {attr}({call}) raised "
                         f"{first_line(e, with_type=True)}{_where(e, fn)}: fix that function "
                         "(the error is in your code, not in tfaccel)") from None
    if not hasattr(model, "fit"):
        raise ModelError(f"--model_fn={spec!r} returned {type(model).__name__}, not a Keras model")
    flavour_of(model)  # a Keras model of either Keras
    return model


def _where(error, fn):
    """' (file.py:12)', the last frame of the user's module in `error`'s traceback."""
    source = inspect.getsourcefile(fn) if inspect.isfunction(fn) else None
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == source]
    return f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""


def _where_in_module(error, module_name):
    """' (file.py:12)' of the last frame in a file named like `module_name`'s last part."""
    leaf = module_name.rpartition(".")[2]
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if os.path.splitext(os.path.basename(f.filename))[0] in (leaf, "__init__")]
    return f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""


def check_model_fits(model, input_shape, num_classes):
    """Raises ModelError when `model`'s input or output does not fit the dataset.

    A subclassed model has no input shape until called, so it is called once on a batch of
    zeros of the dataset's shape: a model that cannot take them fails here, in one line.
    """
    flavour_of(model)
    if not _compat.is_graph_network(model):
        return _check_subclassed_fits(model, input_shape, num_classes)
    got_in = tuple(model.input_shape[1:]) if not isinstance(model.input_shape, list) else None
    if got_in is not None and any(a is not None and a != b for a, b in zip(got_in, input_shape)) \
            or (got_in is not None and len(got_in) != len(input_shape)):
        raise ModelError(f"model {model.name!r} takes inputs of shape {got_in} but the dataset "
                         f"gives {tuple(input_shape)}: pick a matching dataset or model")
    out = model.output_shape[-1] if not isinstance(model.output_shape, list) else None
    if out is not None and out != num_classes:
        raise ModelError(f"model {model.name!r} outputs {out} classes but the dataset has "
                         f"{num_classes}: pick a matching dataset or model")
    return model


def _check_subclassed_fits(model, input_shape, num_classes):
    try:
        out = model(np.zeros((1, *input_shape), np.float32))
    except Exception as e:  # the user's call(): any exception
        raise ModelError(f"model {model.name!r} (a subclassed {type(model).__name__}) fails on "
                         f"a batch of inputs of the dataset's shape {tuple(input_shape)}: "
                         f"{first_line(e, with_type=True)}: pick a matching dataset or model"
                         ) from None
    classes = out.shape[-1] if hasattr(out, "shape") and len(out.shape) else None
    if classes is not None and classes != num_classes:
        raise ModelError(f"model {model.name!r} outputs {classes} classes but the dataset has "
                         f"{num_classes}: pick a matching dataset or model")
    return model


def resolve_model(model, input_shape, num_classes, model_fn=None, keras=None):
    """The model a recipe trains: a zoo name, a saved model path, or `model_fn`.

    `keras` ('tf_keras', 'keras3') is the Keras to train in: zoo models are built in
    it (tf_keras when None); a loaded or `model_fn` model keeps its own Keras when
    `keras` is None, else is translated (`as_flavour`). A zoo model for Keras 3 is
    built in float32 and translated, verified: apply the precision after.
    """
    if model_fn:
        built = as_flavour(model_from_fn(model_fn, input_shape, num_classes), keras)
    elif is_model_path(model):
        built = as_flavour(load_model_file(model), keras)
    elif keras == "keras3":
        with precision_scope("float32"):
            built = as_flavour(build_model(model, input_shape, num_classes), keras)
    else:
        built = build_model(model, input_shape, num_classes)
    return check_model_fits(built, input_shape, num_classes)
