"""Language models you bring: a KerasHub GPT-2 built from a config, or your own Keras 3 model.

tfaccel's own decoder is `tfaccel.train.gpt.build_gpt` (tf_keras). The same training
(`compile_language_model`, the recipe's callbacks, `generate`) takes a Keras 3 causal LM
too, which is what people who train language models in Keras bring:

- `keras_hub_gpt2` builds KerasHub's `GPT2CausalLM` from sizes alone (no preset, nothing
  downloaded), without a preprocessor: it takes `{"token_ids", "padding_mask"}` and
  returns logits `[batch, T, vocabulary]`. GPT-2's config fixes its initialization (a flat
  normal of 0.02, 0.01 for the token embedding) and its dropout defaults to 0.1; here the
  dropout is an argument (0 by default, as tfaccel's GPT), and `init="scaled"` re-draws the
  weights as `build_gpt` draws its own (0.02 x sqrt(768 / d_model), residual output
  projections divided by sqrt(2 layers)), so that the two architectures are compared and
  not their initializations (docs/language-models.md has both measured).
- `language_model_from_fn` calls your `package.module:function(vocabulary_size,
  sequence_length)` (`tfaccel.train.models.call_model_fn`, the classifiers' `--model_fn`
  mechanism) and checks what it returns maps `[batch, sequence_length]` ids (or KerasHub's
  dict) to `[batch, sequence_length, vocabulary_size]` logits, in one line if not; a model
  taking any length is given a `sequence_length` input (the same weights), so that
  generation knows its window.
- `with_model_inputs` maps a dataset of `(ids, next ids)` windows to what the model takes,
  and `token_ids_model` wraps a dict-taking model as one taking the ids alone (a `.tflite`
  file with one input, like tfaccel's GPT's).

Example:

    from tfaccel.train import causal_lm, language_model, training

    model = causal_lm.keras_hub_gpt2(104, layers=4, heads=4, d_model=128, context=64)
    language_model.compile_language_model(
        model, training.make_optimizer("adamw", 3e-3, flavour="keras3"))
    model.fit(causal_lm.with_model_inputs(train, model), epochs=1, steps_per_epoch=100)
"""

import math

import numpy as np
import tensorflow as tf

from tfaccel.errors import ConfigError, ModelError, first_line
from tfaccel.keras import is_keras3_object, keras3
from tfaccel.train.gpt_layers import init_stddev
from tfaccel.train.kv_cache import keras_hub_context, model_inputs, takes_token_dict
from tfaccel.train.models import call_model_fn

INITS = ("scaled", "keras_hub")
"""`keras_hub_gpt2`'s initializations: tfaccel GPT's scaled normal, or GPT-2's own."""

HUB_INSTALL = "pip install -e '.[hub]' (keras-hub 0.32)"


def keras_hub():
    """The `keras_hub` package, imported on first call.

    Raises:
      ConfigError: KerasHub is not installed (one line with the command that installs it).
    """
    keras3()  # KerasHub runs on Keras 3: the same checks first
    try:
        import keras_hub as hub  # deferred: keras_hub (an optional extra, heavy)
    except ImportError as e:
        raise ConfigError(f"KerasHub is not installed ({first_line(e)}): {HUB_INSTALL}, or "
                          "train tfaccel's GPT (--model=gpt)") from None
    return hub


def keras_hub_gpt2(vocabulary_size, layers, heads, d_model, context, dropout=0.0,
                   init="scaled", seed=0):
    """KerasHub's `GPT2CausalLM` of that size (MLP 4 x `d_model`), without a preprocessor.

    Built under the global dtype policy of Keras 3 (`tfaccel.train.precision.set_precision`
    sets it). `init`: "scaled" re-draws every kernel and embedding from a normal of
    `init_stddev(d_model)` (the output projection of each MLP divided by sqrt(2 layers)),
    seeded by `seed`, as `build_gpt` initializes its own; "keras_hub" keeps GPT-2's.

    Raises:
      ConfigError: KerasHub is missing, an unknown `init`, or `heads` does not divide
        `d_model`.
    """
    if init not in INITS:
        raise ConfigError(f"unknown init={init!r}: use one of {', '.join(INITS)}")
    if d_model % heads:
        raise ConfigError(f"heads={heads} does not divide d_model={d_model}: pick heads that "
                          "divide it")
    hub = keras_hub()
    backbone = hub.models.GPT2Backbone(
        vocabulary_size=int(vocabulary_size), num_layers=int(layers), num_heads=int(heads),
        hidden_dim=int(d_model), intermediate_dim=4 * int(d_model), dropout=float(dropout),
        max_sequence_length=int(context))
    model = hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    if init == "scaled":
        _redraw_scaled(model, int(d_model), int(layers), seed)
    return model


def _redraw_scaled(model, d_model, layers, seed):
    """Every kernel and embedding of `model` from N(0, init_stddev(d_model)); the MLP's output
    kernels (KerasHub's `feedforward_output_dense`) with that over sqrt(2 layers)."""
    rng = np.random.default_rng(seed)
    std = init_stddev(d_model)
    for weight in model.weights:
        name = weight.path.rsplit("/", 1)[-1]
        if name not in ("kernel", "embeddings"):
            continue  # biases, LayerNorm gamma/beta keep their constants
        scale = std / math.sqrt(2 * layers) if "feedforward_output" in weight.path else std
        weight.assign(rng.normal(0.0, scale, tuple(weight.shape)).astype(weight.dtype))


def language_model_from_fn(spec, vocabulary_size, sequence_length):
    """Your `package.module:function(vocabulary_size, sequence_length)`'s Keras 3 causal LM.

    Checked on one window of zeros: it must take `[1, sequence_length]` int32 ids (or
    KerasHub's `{"token_ids", "padding_mask"}`) and return logits `[1, sequence_length,
    vocabulary_size]`.

    Raises:
      ModelError: the function cannot be imported or called, returns no Keras model, a
        tf_keras one, or one whose output has another shape (one line each).
    """
    model = call_model_fn(spec, vocabulary_size=int(vocabulary_size),
                          sequence_length=int(sequence_length))
    if not is_keras3_object(model):
        raise ModelError(f"--model_fn={spec!r} returned a tf_keras model: return a Keras 3 "
                         "model (`import keras`), or train it with --model=gpt")
    window = tf.zeros([1, int(sequence_length)], tf.int32)
    try:
        logits = model(model_inputs(model, window), training=False)
    except Exception as e:  # the user's model: any exception, reported as theirs
        raise ModelError(f"--model_fn={spec!r}: the model fails on token ids of shape "
                         f"[1, {sequence_length}] (int32): {first_line(e, with_type=True)}: "
                         "make it take token ids (or KerasHub's token_ids/padding_mask dict)"
                         ) from None
    want = (1, int(sequence_length), int(vocabulary_size))
    got = tuple(getattr(logits, "shape", ()))
    if got != want:
        raise ModelError(f"--model_fn={spec!r}: the model maps token ids [1, {sequence_length}]"
                         f" to outputs of shape {got}, not logits {want}: "
                         "return a causal LM whose last layer gives one logit per vocabulary "
                         "entry at every position")
    if keras_hub_context(model) is not None:  # a KerasHub causal LM: its class, its cache
        return model
    return token_ids_model(model, sequence_length)  # generation needs the window's length


def with_model_inputs(dataset, model):
    """`dataset` of `(ids, targets)` with the ids as `model` takes them: KerasHub's dict (all
    positions real; the mask int32 as GPT-2's backbone declares it, which a
    `MirroredStrategy` can split where a bool one fails), or the ids unchanged."""
    if not takes_token_dict(model):
        return dataset
    return dataset.map(lambda x, y: ({"token_ids": x, "padding_mask": tf.ones_like(x)}, y),
                       num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)


def token_ids_model(model, sequence_length):
    """`model` itself if it takes `[batch, sequence_length]` token ids, else a Keras 3 model of
    the same weights that does (KerasHub's padding mask all ones): a window of known length
    for `generate` and a `.tflite` file with one input."""
    takes_dict = takes_token_dict(model)
    if not takes_dict and _input_length(model) == int(sequence_length):
        return model
    k3 = keras3()
    ids = k3.Input((int(sequence_length),), dtype="int32", name="token_ids")
    inputs = ({"token_ids": ids, "padding_mask": k3.ops.ones_like(ids, dtype="bool")}
              if takes_dict else ids)
    return k3.Model(ids, model(inputs), name=model.name)


def _input_length(model):
    """The fixed length of `model`'s one input `[batch, length]`, else None."""
    inputs = getattr(model, "inputs", None) or ()
    if len(inputs) != 1 or len(inputs[0].shape) != 2:
        return None
    return inputs[0].shape[1]
