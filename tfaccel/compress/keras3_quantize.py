"""Keras 3's own post-training quantization (`model.quantize`) as variants measured like others.

`keras3_quantized` returns a quantized copy of a Keras 3 model (never the model
itself) in one of `KERAS3_MODES`: `int8` (per-channel int8 kernels, activations
quantized on the fly, an int8 x int8 matmul), `int4` (Keras' default: weights
only, a scale and zero point per block of 128 inputs, two values a byte),
`int4_per_channel` (a scale per output channel) or `gptq` (4-bit, rounding
corrected by the Hessian of each layer's inputs). Keras 3.15 quantizes Dense,
EinsumDense and Embedding layers only, inside custom layers too (a KerasHub Transformer's
attention and feed-forward kernels, its token embedding); the rest stays float
(`quantized_weights`). KerasHub task models (`GPT2CausalLM`, `BertTextClassifier`) are
copied by their config and stay their class, with `generate()`.

`keras3_variant` also converts the copy to a `.tflite` file when TFLite can, so
that `tfaccel.compress.tflite_eval` measures it as every other variant. With
TF 2.21 the int4 modes convert (the values unpacked to int8 constants and
dequantized at run time; blocks' scales and zero points stored expanded to the
kernel's shape, larger than float raw, small gzipped); int8 does not (TFLite
has no int8 x int8 -> int32 matmul on raw int8 tensors, nor do the select TF
ops), so it is measured in Keras: `keras_weight_sizes`, `compare_keras_latency`.

Keras' GPTQ is written for language models (token ids, a tokenizer); here the
tokens index calibration examples, looked up before the model (GPTQ's one
block): no download. But Keras 3.15.1's GPTQ never sees the layers' inputs and
is plain rounding, so `gptq` is refused where `gptq_calibrates` finds that.

Example:

    from tfaccel.compress import keras3_quantize
    from tfaccel.keras import keras3

    k = keras3()
    model = k.Sequential([k.Input((8, 8, 1)), k.layers.Flatten(),
                          k.layers.Dense(32, "relu"), k.layers.Dense(10)])
    small = keras3_quantize.keras3_quantized(model, "int8")
    keras3_quantize.quantized_weights(small, model)["share"]    # 0.98: the Dense kernels
    variant = keras3_quantize.keras3_variant(model, "int4", "/tmp/keras3_int4.tflite")
    variant.runtime, variant.path                                # ('tflite', '/tmp/...')
"""

import dataclasses
import functools
import gzip
import warnings

import numpy as np
import tensorflow as tf

from tfaccel import _compat
from tfaccel.compress import latency, tflite
from tfaccel.errors import ConfigError, ModelError, first_line
from tfaccel.io import atomic_path
from tfaccel.keras import copy_model, flavour_of, keras3

KERAS3_MODES = ("int8", "int4", "int4_per_channel", "gptq")
"""Quantization modes of `keras3_quantized`."""


def _check(model, mode):
    if mode not in KERAS3_MODES:
        raise ConfigError(f"unknown Keras 3 quantization mode {mode!r}: use one of "
                          f"{', '.join(KERAS3_MODES)}")
    if flavour_of(model) != "keras3":
        raise ModelError(f"model {model.name!r} is a tf_keras model: Keras 3 quantization needs "
                         "a Keras 3 model; translate it with tfaccel.keras.bridge.to_keras3")


def _copy(model):
    """A new model holding the same weights, nothing shared, of the model's own class."""
    return copy_model(model, "quantize a copy of")


def _calibration_examples(calibration, num_samples):
    """The first `num_samples` inputs of `calibration`, stacked (the generator yields [x[None]])."""
    if calibration is None:
        raise ConfigError("mode 'gptq' calibrates on examples: pass calibration= (e.g. the "
                          "training split or an array of inputs)")
    generator = tflite.representative_dataset(calibration, num_samples)
    return np.concatenate([batch[0] for batch in generator()])


def _gptq_config(model, examples):
    """A GPTQ config whose 'tokens' are indices into `examples`: see the module docstring."""
    k3 = keras3()
    if len(model.inputs) != 1 or len(model.inputs[0].shape) < 3:
        raise ModelError(f"model {model.name!r}: GPTQ here calibrates models of one input of "
                         "rank >= 2 per example (Keras adds an axis to rank-2 batches); use "
                         "mode 'int4' instead")
    table = k3.ops.convert_to_tensor(examples.astype(model.inputs[0].dtype))

    def examples_of(indices):  # int32 (1, n) windows of indices -> a batch of n examples
        return k3.ops.take(table, k3.ops.reshape(indices, (-1,)), axis=0)

    # One window of every index: Keras offsets windows by Python's per-process string hash
    # unless one spans the whole dataset; and one forward pass sees every example.
    return k3.quantizers.GPTQConfig(
        dataset=[np.arange(len(examples), dtype=np.int32)], tokenizer="unused (numeric ids)",
        weight_bits=4, num_samples=1, sequence_length=len(examples),
        quantization_layer_structure={"pre_block_layers": [examples_of],
                                      "sequential_blocks": [model]})


def _quantize_in_place(model, mode, examples=None):
    k3 = keras3()
    with warnings.catch_warnings():  # one warning per layer without a quantized form
        warnings.simplefilter("ignore", UserWarning)
        if mode == "int4_per_channel":
            model.quantize(config=k3.quantizers.Int4QuantizationConfig(block_size=-1))
        elif mode == "gptq":  # quietly: its progress bar counts one step of one block
            shown = k3.config.is_interactive_logging_enabled()
            k3.config.disable_interactive_logging()
            try:
                model.quantize("gptq", config=_gptq_config(model, examples))
            finally:
                if shown:
                    k3.config.enable_interactive_logging()
        else:
            model.quantize(mode)


@functools.lru_cache(maxsize=None)
def gptq_calibrates():
    """True when Keras 3's GPTQ uses its calibration data; Keras 3.15.1's does not.

    Keras switches each layer to its quantized form, then hooks the layer's `call`
    to see its inputs, but a quantized layer runs `quantized_call`: the Hessians
    stay zero, GPTQ is plain rounding (keras-team/keras#23512, fixed after 3.15.1).
    Probed: calibrations stressing different inputs must give different weights.
    """
    k3, rng, results = keras3(), np.random.default_rng(0), []
    start = [rng.standard_normal((16, 4)).astype(np.float32), np.zeros(4, np.float32)]
    for stressed in (np.arange(16) < 8, np.arange(16) >= 8):
        probe = k3.Sequential([k3.Input((2, 16)), k3.layers.Dense(4)])
        probe.set_weights(start)
        x = (rng.standard_normal((32, 2, 16)) * np.where(stressed, 100.0, 1.0)).astype("float32")
        _quantize_in_place(probe, "gptq", x)
        results.append(probe.get_weights())
    return any(not np.array_equal(a, b) for a, b in zip(*results))


def keras3_quantized(model, mode, calibration=None, num_calibration_samples=128):
    """A copy of a Keras 3 model with its Dense/EinsumDense/Embedding weights quantized.

    Args:
      model: a built Keras 3 Sequential or functional model (left as it is).
      mode: one of `KERAS3_MODES`.
      calibration: gptq's examples: a `tf.data.Dataset` of `x` or `(x, label)`
        (batched or not) or an array of inputs; `num_calibration_samples` of them.

    Returns:
      The quantized Keras 3 copy, compiled anew if `model` was (as `clone_model` does).

    Raises:
      ConfigError: an unknown mode, or gptq without calibration data.
      ModelError: a tf_keras model, one Keras cannot copy or quantize, or gptq where
        Keras' GPTQ does not calibrate.
    """
    _check(model, mode)
    examples = None  # only gptq calibrates
    if mode == "gptq":
        examples = _calibration_examples(calibration, num_calibration_samples)
        if not gptq_calibrates():
            raise ModelError(
                f"Keras {keras3().__version__}'s GPTQ does not calibrate (its hooks never see "
                "the layers' inputs, keras-team/keras#23512), so 'gptq' would be plain int4 "
                "rounding under another name: use mode 'int4', or a Keras whose GPTQ calibrates")
    quantized = _copy(model)
    try:
        _quantize_in_place(quantized, mode, examples)
    except (ValueError, TypeError, NotImplementedError) as e:
        raise ModelError(f"Keras 3 cannot quantize {model.name!r} as {mode!r}: "
                         f"{first_line(e)}") from None
    return quantized


def _layers(model):
    """Every layer of `model` in order: nested models' layers, and the sublayers of custom
    layers (a KerasHub `TransformerDecoder`'s Dense and EinsumDense), which Keras quantizes."""
    for layer in model.layers:
        if isinstance(layer, keras3().Model):
            yield from _layers(layer)
        else:
            yield from _layer_and_sublayers(layer)


def _layer_and_sublayers(layer):
    yield layer
    for sub in _compat.sublayers(layer):
        yield from _layer_and_sublayers(sub)


def quantized_weights(quantized, original):
    """What Keras quantized in `quantized` (a copy of the float model `original`).

    Returns {'layers': paths of the quantized layers ('outer/inner' inside a custom layer),
    'quantized_weights': elements of their kernels (embeddings) in `original`, 'weights':
    elements of all of `original`'s weights, 'share': the first / the second}.
    """
    pairs = [(q, f) for q, f in zip(_layers(quantized), _layers(original))
             if getattr(q, "quantization_mode", None) is not None]
    kernels = [f.embeddings if hasattr(f, "embeddings") else f.kernel for _, f in pairs]
    count = sum(int(np.prod(k.shape)) for k in kernels)
    total = sum(int(np.prod(v.shape)) for v in original.weights)
    return {"layers": [getattr(q, "path", q.name) for q, _ in pairs], "quantized_weights": count,
            "weights": total, "share": count / total if total else 0.0}


def keras_weight_sizes(model):
    """{'bytes', 'gzip_bytes'}: a model's variables as stored (int8 1 byte a value, packed
    int4 half, float32 4), raw and gzip -9: a Keras variant's size beside a `.tflite` file's."""
    blob = b"".join(np.asarray(v.numpy()).tobytes() for v in model.weights)
    return {"bytes": len(blob), "gzip_bytes": len(gzip.compress(blob, 9, mtime=0))}


def _converter_reason(error):
    """The converter's own complaint, without MLIR's `loc(...)` prefix."""
    for line in str(error).splitlines():
        reason = line.rpartition("error: ")[2] if "error: " in line else ""
        reason = reason.rpartition("): ")[2] if reason.startswith("loc(") else reason
        if reason.strip() and not reason.startswith("failed while converting"):
            return first_line(reason)
    return first_line(error)


def keras3_to_tflite(model, path):
    """Writes a Keras 3 model as a `.tflite` file (atomically) and returns `path`.

    Keras 3's own LiteRT export, limited to TFLite's builtin ops so that LiteRT
    runs the file without the select-TF-ops delegate. Raises ModelError with
    the converter's reason when it rejects the model.
    """
    with atomic_path(path) as tmp:
        try:
            model.export(tmp, format="litert", verbose=False,
                         target_spec={"supported_ops": [tf.lite.OpsSet.TFLITE_BUILTINS]})
        except _compat.tflite_converter_errors() as e:
            raise ModelError(f"TFLite conversion of Keras 3 model {model.name!r} failed: "
                             f"{_converter_reason(e)}") from None
    return path


@dataclasses.dataclass(frozen=True)
class Keras3Variant:
    """A Keras 3 quantized copy and how it is measured: as a `.tflite` file or in Keras."""

    mode: str
    model: object  # the quantized Keras 3 copy
    runtime: str  # 'tflite' (measured as `path`) or 'keras' (no TFLite form: `reason`)
    path: str = None
    reason: str = None
    quantized: dict = dataclasses.field(default_factory=dict)  # `quantized_weights`


def keras3_variant(model, mode, tflite_path, calibration=None, num_calibration_samples=128):
    """A `Keras3Variant`: a quantized copy of `model`, converted to `tflite_path` if TFLite can.

    Runtime 'tflite' with the file's path, or 'keras' with the converter's
    reason. Arguments and errors as `keras3_quantized`.
    """
    quantized = keras3_quantized(model, mode, calibration, num_calibration_samples)
    stats = quantized_weights(quantized, model)
    try:
        path = keras3_to_tflite(quantized, tflite_path)
    except ModelError as e:
        return Keras3Variant(mode, quantized, "keras", reason=str(e), quantized=stats)
    return Keras3Variant(mode, quantized, "tflite", path=path, quantized=stats)


def _one_call(model, example):
    """A function running one single-sample inference call of a Keras model (traced here)."""
    shape = (1, *[int(d) for d in tuple(model.inputs[0].shape)[1:]])
    example = np.random.default_rng(0).random(shape) if example is None else example
    x = tf.constant(np.asarray(example, np.float32).reshape(shape))
    # Compiled once, as a deployed Keras model runs; eager calls would time Python instead.
    call = tf.function(lambda inputs: model(inputs, training=False), reduce_retracing=True)
    call(x)  # the trace, before any call is timed

    def run():
        call(x)

    return run


def compare_keras_latency(models, example=None, num_runs=200, warmup=20, rounds=5):
    """Single-sample latencies of Keras models, interleaved as `tflite_eval.compare_latency`.

    `models` is {name: single-input Keras model}; `example` one input (random if
    None); `num_runs` timed calls per model in `rounds` rounds after `warmup`
    (`tfaccel.compress.latency`, the harness of the TFLite files too).
    Returns {name: {'mean_us', 'p50_us', 'p90_us', 'num_runs'}}.
    """
    return latency.compare_latencies(models, lambda model: _one_call(model, example), num_runs,
                                     warmup, rounds)
