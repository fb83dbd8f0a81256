"""TFLite export: a tf_keras model to a `.tflite` file, with post-training quantization.

`convert_to_tflite` turns a tf_keras model (plain, pruned or quantization-aware
trained) into a `.tflite` file in one of the converter's modes: `float` (no
quantization), `dynamic` (int8 weights, float activations), `int8` (full
integer, int8 inputs and outputs; needs representative data unless the model
was trained with QAT), `float16` (half-size weights) and `int16x8` (int16
activations, int8 weights). `optimize_sparsity=True` asks the converter to
store pruned weights in its sparse encoding. `tfaccel.compress.tflite_eval`
runs and measures the files.

A Keras 3 model (KerasHub models and custom layers included) is converted from
itself, not through the tf_keras bridge: its inference call is exported
(`keras.export.ExportArchive`, the route Keras 3's own LiteRT export takes) with
a fixed signature (`sequence_length=` fixes a variable-length input such as
token ids) and converted with TFLite's builtin ops only, so that LiteRT runs the
file without the select-TF-ops delegate. A mixed-precision model is converted
from its float32 copy (TFLite has no bfloat16 kernels).

Example:

    from tfaccel import data
    from tfaccel.compress import tflite

    splits = data.load_dataset("digits")
    path = tflite.convert_to_tflite(model, "out/model_int8.tflite", mode="int8",
                                    representative_data=splits.train)
"""

import contextlib
import tempfile

import numpy as np
import tensorflow as tf

from tfaccel import _compat
from tfaccel.errors import ConfigError, DataError, ModelError, first_line
from tfaccel.io import write_bytes
from tfaccel.keras import input_specs, is_keras3_object, keras3, tfmot
from tfaccel.train.precision import apply_precision

MODES = ("float", "dynamic", "int8", "float16", "int16x8")
"""Conversion modes of `convert_to_tflite`."""

_NEEDS_DATA = ("int8", "int16x8")


def is_quantization_aware(model):
    """True when `model` holds TF-MOT quantization wrappers (it went through QAT)."""
    if is_keras3_object(model):
        return False  # TF-MOT wraps tf_keras models only
    quantization = tfmot().quantization.keras
    wrappers = (quantization.QuantizeWrapper, quantization.QuantizeWrapperV2)
    layers = model.submodules if hasattr(model, "submodules") else model.layers
    return any(isinstance(layer, wrappers) for layer in layers)


def representative_dataset(data, num_samples=200, inputs=None):
    """A converter `representative_dataset` generator of `num_samples` single examples.

    A model of several inputs (KerasHub BERT's token_ids, segment_ids, padding_mask) is fed
    dicts keyed by its signature's input names, which are its Keras input names: the
    converter orders a list by its graph's input tensors, not the model's inputs, so a list
    would calibrate one input's ranges on another's values.

    Example:

        ids = {"token_ids": tokens, "segment_ids": segments, "padding_mask": mask}
        generator = representative_dataset(ids, 100, inputs=tfaccel.keras.input_specs(
            model, sequence_length=128))

    Args:
      data: examples, each array with a leading example axis: a NumPy array (one input); a
        dict {input name: array}; a tuple/list of arrays, one per input in the model's input
        order (needs `inputs`: with one input, a list is the examples themselves); a
        `tf.data.Dataset` (batched or not) of `x` or `(x, label)`, `x` any of these; or an
        already-made generator function (returned as it is).
      num_samples: how many examples calibrate the activation ranges.
      inputs: the model's inputs as `tf.TensorSpec`s in its input order (only the names
        and dtypes are read; `tfaccel.keras.input_specs(model)`): a dict's keys and a tuple's
        length are checked against them, and each input is cast to its dtype (int token ids
        stay int). Without them: float32 arrays, a dict's keys as given.

    Returns:
      A function yielding per example `[x]` (one input) or `{name: x}` (several), each
      array of shape (1, *example_shape).

    Raises:
      ConfigError: a key that is not an input of the model, an input missing, a tuple of the
        wrong length, or inputs with different numbers of examples (one line: the fix).
      DataError: no examples.
    """
    if callable(data) and not isinstance(data, tf.data.Dataset):
        return data
    if num_samples < 1:
        raise ConfigError(f"num_samples={num_samples}: calibration needs at least 1 example")
    if isinstance(data, tf.data.Dataset):
        data = _first_examples(data, num_samples)
    if data is None:
        raise DataError("representative data is empty: give training examples to calibrate on")
    columns = _calibration_columns(data, inputs)
    counts = {name: len(x) for name, x in columns.items()}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{name}: {n}" for name, n in counts.items())
        raise ConfigError(f"calibration inputs hold different numbers of examples ({listed}): "
                          "give every input the same examples along its first axis")
    if min(counts.values()) == 0:
        raise DataError("representative data is empty: give training examples to calibrate on")
    count = min(num_samples, *counts.values())

    def generator():
        for i in range(count):
            if None in columns:  # one input: the converter's list form
                yield [columns[None][i:i + 1]]
            else:
                yield {name: x[i:i + 1] for name, x in columns.items()}

    return generator


def _calibration_columns(data, specs):
    """{input name: examples array} of `data` checked against `specs` ({None: array} for a
    one-input model or array data)."""
    names = [spec.name for spec in specs] if specs else None
    dtypes = {spec.name: tf.as_dtype(spec.dtype).as_numpy_dtype for spec in specs or ()}
    if isinstance(data, (tuple, list)) and names and len(names) > 1:
        if len(data) != len(names):
            raise ConfigError(f"calibration data has {len(data)} arrays for a model of "
                              f"{len(names)} inputs ({', '.join(names)}): give one array per "
                              "input in that order, or a dict keyed by those names")
        data = dict(zip(names, data))
    if not isinstance(data, dict):
        if names and len(names) > 1:
            raise ConfigError(f"calibration data is one array for a model of {len(names)} "
                              f"inputs ({', '.join(names)}): give a dict keyed by those names, "
                              "or a tuple of one array per input in that order")
        return {None: np.asarray(data, dtypes[names[0]] if names else np.float32)}
    if names:
        unknown = [key for key in data if key not in names]
        if unknown:
            raise ConfigError(f"calibration input {unknown[0]!r} is not an input of the model "
                              f"(its inputs: {', '.join(names)}): key the arrays by those names")
        missing = [name for name in names if name not in data]
        if missing:
            raise ConfigError(f"calibration data has no {missing[0]!r}, an input of the model: "
                              f"give an array for each of {', '.join(names)}")
        if len(names) == 1:
            return {None: np.asarray(data[names[0]], dtypes[names[0]])}
        return {name: np.asarray(data[name], dtypes[name]) for name in names}
    return {name: _as_input_array(x) for name, x in data.items()}


def _as_input_array(x):
    """`x` as float32, or int32 when integer (token ids): the usual Keras input dtypes."""
    x = np.asarray(x)
    return x.astype(np.int32 if np.issubdtype(x.dtype, np.integer) else np.float32)


def _first_examples(dataset, num_samples):
    """The first `num_samples` examples' `x` (an array, dict or tuple of arrays), stacked;
    None when the dataset is empty."""
    spec = dataset.element_spec
    if isinstance(spec, tuple):
        dataset = dataset.map(lambda x, *_: x)
        spec = spec[0]
    if is_batched(tf.nest.flatten(spec)[0]):
        dataset = dataset.unbatch()
    examples = list(dataset.take(num_samples).as_numpy_iterator())
    if not examples:
        return None
    return tf.nest.map_structure(lambda *xs: np.stack(xs), *examples)


def is_batched(spec):
    """True for a batched dataset's element spec (leading dimension unknown)."""
    return spec.shape.rank is not None and spec.shape.rank >= 1 and spec.shape[0] is None


@contextlib.contextmanager
def _keras3_converter(model, sequence_length):
    """A converter of a Keras 3 model's inference call, exported with a fixed signature
    (batch left open); the export lives until the block ends."""
    specs = input_specs(model, None, sequence_length)
    structure = model.input if len(specs) > 1 else None

    def serve(*inputs):
        x = tf.nest.pack_sequence_as(structure, list(inputs)) if structure else inputs[0]
        return model(x, training=False)

    with tempfile.TemporaryDirectory() as directory:
        archive = keras3().export.ExportArchive()
        archive.track(model)
        archive.add_endpoint("serve", serve, input_signature=specs)
        archive.write_out(directory, verbose=False)
        converter = tf.lite.TFLiteConverter.from_saved_model(directory)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        converter.experimental_enable_resource_variables = True
        yield converter


@contextlib.contextmanager
def _base_converter(model, sequence_length):
    if is_keras3_object(model):
        with _keras3_converter(model, sequence_length) as converter:
            yield converter
    else:
        yield tf.lite.TFLiteConverter.from_keras_model(model)


def _signature_specs(model):
    """Specs of `model`'s inputs naming the converted file's signature inputs (names and
    dtypes only: a variable length need not be fixed for them), or None (no inputs yet)."""
    inputs = getattr(model, "inputs", None)
    return [tf.TensorSpec(None, tf.as_dtype(t.dtype), name=t.name)
            for t in inputs] if inputs else None


def _configure(converter, model, mode, calibration, optimize_sparsity):
    optimizations = []
    if mode != "float":
        optimizations.append(tf.lite.Optimize.DEFAULT)
    if optimize_sparsity:
        optimizations.append(tf.lite.Optimize.EXPERIMENTAL_SPARSITY)
    converter.optimizations = optimizations
    if calibration is not None:
        converter.representative_dataset = calibration
    if mode == "int8":
        # A QAT graph is integer already; asking for INT8-only ops on it trips the
        # converter's "representative_dataset must be specified" check (TF 2.21).
        if not is_quantization_aware(model):
            converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        if all(tf.as_dtype(t.dtype).is_floating for t in model.inputs):  # token ids stay int
            converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    elif mode == "float16":
        converter.target_spec.supported_types = [tf.float16]
    elif mode == "int16x8":
        converter.target_spec.supported_ops = [
            tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]


def convert_to_tflite(model, path, mode="float", representative_data=None,
                      num_calibration_samples=200, optimize_sparsity=False,
                      sequence_length=None):
    """Converts a tf_keras or Keras 3 model to a `.tflite` file, quantizing as `mode` says.

    A QAT model (from `tfaccel.compress.quantize`) already carries its quantization
    ranges, so `mode="int8"` needs no representative data for it; a plain
    model in `int8` or `int16x8` mode is calibrated on `representative_data`.
    The file is written atomically.

    Example:

        convert_to_tflite(model, "model_dyn.tflite", mode="dynamic")

    Args:
      model: a tf_keras model (plain, pruned after `strip_pruning`, or QAT), or
        a Keras 3 one (any layers: converted from itself, see the module's doc).
      path: where the `.tflite` file goes.
      mode: one of `MODES`.
      representative_data: calibration examples for `int8`/`int16x8`, e.g. `splits.train`;
        a model of several inputs takes a dict {input name: array} or a tuple of arrays in
        its input order (see `representative_dataset` for every form accepted).
      num_calibration_samples: how many examples calibrate.
      optimize_sparsity: store pruned (mostly zero) weights sparsely.
      sequence_length: the length a Keras 3 model's variable-length inputs (token ids)
        are fixed at in the file.

    Returns:
      `path`.

    Raises:
      ConfigError: unknown `mode`, calibration data missing, or not matching the model's
        inputs (checked before the conversion starts).
      ModelError: the converter rejects the model.
    """
    if mode not in MODES:
        raise ConfigError(f"unknown TFLite mode {mode!r}: use one of {', '.join(MODES)}")
    if mode in _NEEDS_DATA and representative_data is None and not is_quantization_aware(model):
        raise ConfigError(f"mode={mode!r} calibrates activation ranges: pass representative_data "
                          "(e.g. the training split), or quantize-aware train the model first")
    if is_keras3_object(model):
        input_specs(model, None, sequence_length)  # a variable length fails before any work
    calibration = representative_dataset(  # checked against the inputs before any work
        representative_data, num_calibration_samples, _signature_specs(model)) if (
        representative_data is not None and mode in _NEEDS_DATA) else None
    if is_keras3_object(model):
        model = apply_precision(model, "float32")
    with _base_converter(model, sequence_length) as converter:
        _configure(converter, model, mode, calibration, optimize_sparsity)
        return write_converted(converter, path, f"{model.name!r} in mode {mode!r}",
                               "try mode='float' or 'dynamic', or replace the unsupported op")


def write_converted(converter, path, what, advice):
    """Runs a TFLite `converter` and writes its flatbuffer to `path` atomically; returns `path`.

    Raises:
      ModelError: the converter rejects the model: one line, "TFLite conversion of
        `what` failed: <the converter's first line>; `advice`".
    """
    try:
        flatbuffer = converter.convert()
    except _compat.tflite_converter_errors() as e:  # keep one readable line
        raise ModelError(f"TFLite conversion of {what} failed: {first_line(e)}; {advice}") \
            from None
    return write_bytes(path, flatbuffer)
