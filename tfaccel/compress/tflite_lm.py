"""A language model as a `.tflite` file, and its next-token loss measured in the interpreter.

`language_model_tflite` converts a causal language model (token ids in, float32 logits
out: `tfaccel.train.gpt.build_gpt`'s in tf_keras, or a Keras 3 one such as KerasHub's
`GPT2CausalLM` built without a preprocessor, without the tf_keras bridge) for one window
of `[1, sequence_length]` int32 tokens, in float or with dynamic-range int8 weights (the
modes "float" and "dynamic" of `tfaccel.compress.tflite.convert_to_tflite`, which
converts any classifier; this module converts a traced window instead of a Keras model,
3-5x faster, see `_window_converter`). A fixed window is what makes the conversion
clean: the causal mask becomes a constant and no op sees an unknown length. The files run with
`tfaccel.compress.tflite_eval` too (sizes, latency, weight sparsity).
`evaluate_language_model_tflite` runs a file over non-overlapping windows of a token array
in LiteRT and reports the mean next-token cross-entropy, so a quantized model's loss sits
beside the float one's.

Example:

    from tfaccel.compress import tflite_lm

    tflite_lm.language_model_tflite(model, "out/lm_int8.tflite", mode="dynamic_range")
    print(tflite_lm.evaluate_language_model_tflite("out/lm_int8.tflite", splits.validation,
                                                   sequence_length=64))
"""


import numpy as np
import tensorflow as tf

from tfaccel.compress.tflite import write_converted
from tfaccel.compress.tflite_eval import make_interpreter
from tfaccel.data.text import num_windows
from tfaccel.errors import ConfigError, DataError, ModelError
from tfaccel.keras import is_keras3_object
from tfaccel.train.generate import model_context
from tfaccel.train.gpt import check_sequence_length, gpt_config_of
from tfaccel.train.kv_cache import keras_hub_context, model_inputs
from tfaccel.train.language_model import language_model_metrics
from tfaccel.train.precision import apply_precision

LM_MODES = {"float": "float", "dynamic_range": "dynamic", "dynamic": "dynamic"}
"""Conversion modes of `language_model_tflite` -> the `tfaccel.compress.tflite.MODES` name
("dynamic", that module's name for dynamic range, is accepted too)."""


def _window_converter(model, sequence_length):
    """A converter for `model` called on one fixed `[1, sequence_length]` int32 window.

    It converts a concrete function of a `tf.Module` holding only the model's
    variables: `TFLiteConverter.from_keras_model` (what `convert_to_tflite` uses)
    first saves the model as a Keras SavedModel, tracing every layer's call
    functions, which made a tiny GPT's conversion take 12-15 s here instead of 2.5-5 s.
    A Keras 3 model's variables are tracked through the `tf.Variable`s they hold (`.value`):
    with Keras 3's own variable objects the converter froze none of the weights (a 1.7 MB
    GPT2 became a 49 KB file) and the dynamic-range pass failed.
    """
    module = tf.Module()
    module.model_variables = ([v.value for v in model.weights] if is_keras3_object(model)
                              else list(model.variables))
    module.window = tf.function(
        lambda tokens: model(model_inputs(model, tokens), training=False),
        input_signature=[tf.TensorSpec([1, sequence_length], tf.int32, name="tokens")])
    return tf.lite.TFLiteConverter.from_concrete_functions(
        [module.window.get_concrete_function()], module)


def language_model_tflite(model, path, mode="float", sequence_length=None):
    """Converts a language model to a `.tflite` file taking `[1, sequence_length]` int32 ids.

    Example:

        language_model_tflite(model, "lm.tflite", mode="dynamic_range", sequence_length=64)

    Args:
      model: a causal language model with float32 logits: tf_keras (a 16-bit policy is
        converted to float32 first), or Keras 3 in float32 (a KerasHub causal LM takes its
        ids as `token_ids` with an all-true `padding_mask`).
      path: where the file goes (written atomically).
      mode: "float", or "dynamic_range" (int8 weights, float activations; about a
        quarter of the weights' bytes).
      sequence_length: tokens per window (None: the model's context).

    Returns:
      `path`.

    Raises:
      ConfigError: unknown `mode`, or a non-positive `sequence_length`.
      ModelError: `sequence_length` exceeds the model's context, or conversion fails.
    """

    if mode not in LM_MODES:
        raise ConfigError(f"unknown language-model TFLite mode {mode!r}: use float or "
                          "dynamic_range")
    if sequence_length is None:
        sequence_length = model_context(model)
    elif int(sequence_length) < 1:
        raise ConfigError(f"sequence_length={sequence_length}: give a positive number of "
                          "tokens")
    else:
        _check_fits_context(model, int(sequence_length))
    model = _float32(model)  # TFLite has no bfloat16/float16 kernels
    converter = _window_converter(model, int(sequence_length))
    if LM_MODES[mode] == "dynamic":  # int8 weights, float activations: needs no data
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
    return write_converted(converter, path, f"language model {model.name!r} in mode {mode!r}",
                           "try mode='float', or replace the unsupported op")


def _float32(model):
    if not is_keras3_object(model):
        return apply_precision(model, "float32")
    compute = getattr(getattr(model, "dtype_policy", None), "compute_dtype", "float32")
    if compute != "float32":
        raise ModelError(f"Keras 3 model {model.name!r} computes in {compute}: TFLite has no "
                         "16-bit kernels; build (or load) it under the float32 policy to "
                         "convert it")
    return model


def _check_fits_context(model, sequence_length):
    if gpt_config_of(model) is not None:
        check_sequence_length(model, sequence_length)
        return
    longest = keras_hub_context(model)
    if longest is not None and sequence_length > longest:
        raise ModelError(f"sequence_length={sequence_length} is longer than model "
                         f"{model.name!r}'s max_sequence_length {longest}: use at most {longest}")
    fixed = model.inputs[0].shape[1] if getattr(model, "inputs", None) else None
    if fixed is not None and sequence_length > fixed:
        raise ModelError(f"sequence_length={sequence_length} is longer than model "
                         f"{model.name!r}'s input of {fixed} tokens: use at most {fixed}")


def lm_windows(tokens, sequence_length, max_windows=None):
    """(inputs, targets), each int32 [num_windows, sequence_length]: the non-overlapping
    windows of `tokens` (stride `sequence_length`, as the validation pipeline cuts them),
    targets shifted by one token."""
    tokens = np.asarray(tokens, np.int32).reshape(-1)
    count = num_windows(tokens.size, sequence_length, training=False)
    if max_windows is not None:
        count = min(count, int(max_windows))
    if count < 1:
        raise DataError(f"{tokens.size} tokens make no window of {sequence_length} tokens "
                        f"and its next-token targets: give at least {sequence_length + 1}")
    starts = np.arange(count) * sequence_length
    index = starts[:, None] + np.arange(sequence_length)[None, :]
    return tokens[index], tokens[index + 1]


def cross_entropy(logits, targets):
    """Mean next-token cross-entropy in nats of float `logits` [..., vocab] at int `targets`."""
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_z = np.log(np.exp(shifted).sum(-1))
    picked = np.take_along_axis(shifted, np.asarray(targets)[..., None], -1)[..., 0]
    return float(np.mean(log_z - picked))


def evaluate_language_model_tflite(path, tokens, sequence_length, max_windows=None,
                                   num_threads=None):
    """Mean next-token cross-entropy of a `.tflite` language model over a token array.

    Runs the file in LiteRT (`tfaccel.compress.tflite_eval.make_interpreter`) on
    each non-overlapping window of `sequence_length` tokens of `tokens` (as the
    validation pipeline cuts them), averaging over every predicted token.

    Example:

        evaluate_language_model_tflite("lm.tflite", splits.validation, 64, max_windows=100)

    Args:
      path: a file from `language_model_tflite` (or its bytes).
      tokens: 1-D int token ids, e.g. `splits.validation`.
      sequence_length: tokens per window; must be the file's input length.
      max_windows: evaluate only the first windows (None: all).
      num_threads: interpreter threads (None: LiteRT's default).

    Returns:
      {'loss' (nats per token), 'bits_per_token', 'perplexity', 'num_windows'}.

    Raises:
      DataError: fewer than `sequence_length + 1` tokens, or an id out of the
        model's vocabulary.
      ModelError: the file takes another input shape.
    """
    x, y = lm_windows(tokens, int(sequence_length), max_windows)
    interpreter = make_interpreter(path, num_threads)
    inp = interpreter.get_input_details()[0]
    out = interpreter.get_output_details()[0]
    if tuple(inp["shape"]) != (1, int(sequence_length)):
        raise ModelError(f"the TFLite file takes input of shape {list(inp['shape'])}, not "
                         f"[1, {sequence_length}]: evaluate with sequence_length="
                         f"{inp['shape'][-1]}, or convert with "
                         f"sequence_length={sequence_length}")
    vocab_size = int(out["shape"][-1])
    if x.min() < 0 or max(x.max(), y.max()) >= vocab_size:
        raise DataError(f"token ids run from {min(x.min(), y.min())} to {max(x.max(), y.max())} "
                        f"but the model knows ids 0..{vocab_size - 1}: encode with the "
                        "model's vocabulary")
    total = 0.0
    for window, target in zip(x, y):
        interpreter.set_tensor(inp["index"], window[None].astype(inp["dtype"]))
        interpreter.invoke()
        logits = interpreter.get_tensor(out["index"])[0]
        total += cross_entropy(logits, target)
    loss = total / len(x)
    return {"loss": loss, **language_model_metrics(loss, unit="token"),
            "num_windows": int(len(x))}
