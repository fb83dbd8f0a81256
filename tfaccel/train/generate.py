"""Sampling text from a language model, and saving or loading a model with its vocabulary.

A language model is a model (either Keras) from token ids `[batch, T]` to float32 logits
`[batch, T, vocabulary]` whose position t sees only tokens 0..t (causal), such as
`tfaccel.train.gpt.build_gpt`'s, or a KerasHub causal LM. `generate` continues a prompt
one token at a time, on one fixed-shape window of `context` tokens (the text so far,
cropped to its last `context` tokens and padded on the right; the causal mask keeps the
padding from the position read). With a key/value cache (`tfaccel.train.kv_cache`: the
GPT's, or KerasHub's own) the window is run once and each further token is one decode
step; without one (`use_cache=False`, or another model) every token runs the whole
window. Each is a compiled `tf.function` kept per model and traced once. Sampling
happens on the host with a NumPy generator seeded by `seed`, so the same seed gives the
same text, cached or not.

Example:

    from tfaccel.train import generate

    generate.export_language_model(model, splits.vocab, "runs/lm/export")
    model, vocab = generate.load_language_model("runs/lm/export")
    print(generate.generate(model, vocab, "The ", max_new_tokens=200, temperature=0.8,
                            top_k=20, seed=1))
"""

import os
import warnings
import weakref

import numpy as np
import tensorflow as tf

from tfaccel.data.text import load_vocabulary
from tfaccel.errors import ConfigError, DataError, ModelError, first_line
from tfaccel.io import atomic_path
from tfaccel.keras import keras_for, saved_flavour
from tfaccel.train.gpt import gpt_config_of
from tfaccel.train.gpt_layers import check_context
from tfaccel.train.kv_cache import decoder_for, keras_hub_context, model_inputs

MODEL_FILE = "model.keras"
VOCABULARY_FILE = "vocabulary.json"

_START_CANDIDATES = ("\n", " ")  # what an empty prompt starts from, first spellable one

# model -> {window length: compiled next-token function}; the entry goes with the model.
_STEP_FUNCTIONS = weakref.WeakKeyDictionary()


def model_context(model, context=None):
    """How many tokens `model` sees at once: `context` if given, else its GPT configuration's
    (or a KerasHub model's `max_sequence_length`), else its input's fixed length.

    Raises:
      ConfigError: `context` below 1.
      ModelError: `context` beyond the model's own, or none of those says (a model taking
        any length, without a GPT configuration): pass `context`.
    """
    config = gpt_config_of(model)
    longest = int(config.context) if config is not None else keras_hub_context(model)
    if context is not None:
        if int(context) < 1:
            raise ConfigError(f"context={context}: give a positive number of tokens")
        if longest is not None:
            check_context(int(context), longest)
        return int(context)
    if longest is not None:
        return longest
    shape = model.inputs[0].shape if getattr(model, "inputs", None) else None
    if shape is not None and len(shape) == 2 and shape[1] is not None:  # either Keras
        return int(shape[1])
    raise ModelError(f"cannot tell how many tokens model {model.name!r} sees at once (it "
                     "takes any length and has no GPT configuration): pass context=")


def check_vocabulary(model, vocab):
    """Raises ModelError unless `model` predicts exactly `vocab.size` token classes."""
    classes = model.outputs[0].shape[-1] if getattr(model, "outputs", None) else None
    if classes is not None and int(classes) != vocab.size:
        raise ModelError(f"model {model.name!r} predicts {classes} tokens but the {vocab.kind} "
                         f"vocabulary has {vocab.size}: use the vocabulary the model was "
                         "trained with (load_language_model reads both)")


def _step_function(model, length):
    """A compiled function (window [1, length] int32, position) -> float32 logits there."""
    per_model = _STEP_FUNCTIONS.setdefault(model, {})
    if length not in per_model:
        ref = weakref.ref(model)  # the cache must not keep the model alive

        @tf.function(input_signature=[tf.TensorSpec([1, length], tf.int32),
                                      tf.TensorSpec([], tf.int32)])
        def next_logits(window, position):
            logits = ref()(model_inputs(ref(), window), training=False)
            return tf.cast(logits[0, position], tf.float32)

        per_model[length] = next_logits
    return per_model[length]


def _prompt_ids(vocab, prompt):
    if prompt:
        return [int(i) for i in vocab.encode(prompt, unknown="error")]
    for start in _START_CANDIDATES:
        try:
            return [int(i) for i in vocab.encode(start, unknown="error")]
        except DataError:
            continue
    return [0]


def sample_token(logits, rng, temperature=1.0, top_k=None):
    """One token id from `logits` (1-D): argmax when `temperature` is 0, else a draw from
    softmax(logits / temperature) restricted to the `top_k` most likely tokens (ties
    broken toward the lower id, as argmax does, so top_k=1 is greedy)."""
    logits = np.asarray(logits, np.float64)
    if temperature == 0:
        return int(np.argmax(logits))
    if top_k is not None and top_k < logits.size:
        keep = np.argsort(-logits, kind="stable")[:top_k]
    else:
        keep = np.arange(logits.size)
    scaled = logits[keep] / temperature
    p = np.exp(scaled - scaled.max())
    cumulative = np.cumsum(p)
    choice = int(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"))
    return int(keep[min(choice, keep.size - 1)])


def _check_arguments(max_new_tokens, temperature, top_k):
    if int(max_new_tokens) < 0:
        raise ConfigError(f"max_new_tokens={max_new_tokens}: give 0 or more tokens")
    if not np.isfinite(temperature) or temperature < 0:
        raise ConfigError(f"temperature={temperature}: give 0 (greedy) or a positive number "
                          "(1 samples the model's own distribution)")
    if top_k is not None and int(top_k) < 1:
        raise ConfigError(f"top_k={top_k}: give a positive number of tokens (or None: all)")


def generate(model, vocab, prompt, max_new_tokens=200, temperature=1.0, top_k=None, seed=0,
             context=None, use_cache=True, slide=1):
    """Continues `prompt` with `max_new_tokens` tokens sampled from `model`.

    Deterministic for a seed: the same model, prompt and seed give the same text, with
    or without the key/value cache (see `generate_tokens`). The model sees at most
    `context` tokens: a longer prompt is cropped to its last `context` tokens, and
    once the text fills the window, the `slide` oldest tokens leave it before the next
    token is added (with the default `slide=1`, every token is predicted from the
    `context` tokens before it). An empty prompt starts from a newline (or a space, or
    id 0 when the vocabulary has neither), which is not part of the result. With a
    byte vocabulary a continuation may end inside a multi-byte character, which
    decodes as U+FFFD.

    Example:

        generate(model, vocab, "def ", max_new_tokens=100, temperature=0.8, top_k=20)

    Args:
      model: a causal language model (token ids in, float32 logits out), or a
        KerasHub causal LM built without a preprocessor.
      vocab: its `tfaccel.data.text.Vocabulary`.
      prompt: the text to continue.
      max_new_tokens, temperature, top_k, seed, context, use_cache, slide: as
        `generate_tokens`.

    Returns:
      The continuation only, decoded (not the prompt).

    Raises:
      DataError: the prompt holds characters a char vocabulary does not know.
      ConfigError: a negative `max_new_tokens` or `temperature`, `top_k` < 1, a
        `slide` outside 1..context.
      ModelError: the model and vocabulary disagree on the number of tokens.
    """
    model = getattr(model, "placed", model)  # a PipelineModel samples with its own layers
    _check_arguments(max_new_tokens, temperature, top_k)
    check_vocabulary(model, vocab)
    ids = _prompt_ids(vocab, prompt)
    new = generate_tokens(model, ids, max_new_tokens, temperature, top_k, seed, context,
                          use_cache, slide)
    return vocab.decode(np.asarray(new, np.int32)) if new else ""


def generate_tokens(model, token_ids, max_new_tokens=200, temperature=1.0, top_k=None, seed=0,
                    context=None, use_cache=True, slide=1):
    """The ids of `max_new_tokens` tokens sampled from `model` after `token_ids`.

    Sampling happens on the host, one token at a time, from a NumPy generator seeded
    by `seed`. With `use_cache` and a model that has a key/value cache (a `build_gpt`
    GPT, or a KerasHub causal LM: `tfaccel.train.kv_cache`), the window is run once
    (the prefill) and each further token costs one decode step over the cached keys
    and values; otherwise each token runs the model on the whole window. Both give the
    same logits up to float rounding (about 1e-6 in float32; under a 16-bit policy its
    rounding, and a choice that close to a tie may differ) and draw from the generator
    identically: in float32 the same tokens (tests/test_kv_cache.py checks 200 greedy
    and sampled ones).

    The window: the last `context` tokens of `token_ids`, padded on the right to a
    fixed `[1, context]`; when it is full, the `slide` oldest tokens leave it before
    the new token is added. Positions are absolute, so after a slide every position
    changes and the cache is rebuilt by a prefill: with `slide=1` every token past the
    context runs the whole window (with or without the cache), with a larger slide
    once per `slide` tokens (e.g. `context // 2`: the model then sees between
    `context - slide + 1` and `context` tokens).

    Args:
      model: a causal language model (token ids `[1, T]` in, logits `[1, T, vocab]`
        out), or a KerasHub causal LM built without a preprocessor.
      token_ids: the prompt's ids (at least one).
      max_new_tokens: how many tokens to add.
      temperature: divides the logits; 0 picks the most likely token each step.
      top_k: sample among the `top_k` most likely tokens only (None: all).
      seed: seeds the sampling.
      context: tokens the model sees at once (None: from the model, see
        `model_context`).
      use_cache: decode with the model's key/value cache when it has one.
      slide: tokens a full window drops at once (1 to `context`).

    Returns:
      A list of `max_new_tokens` ints.

    Raises:
      ConfigError: as `generate`, or no `token_ids`.
      ModelError: `context` is beyond what the model takes, or none is known.
    """
    model = getattr(model, "placed", model)
    _check_arguments(max_new_tokens, temperature, top_k)
    length = model_context(model, context)
    if not 1 <= int(slide) <= length:
        raise ConfigError(f"slide={slide}: give 1 to the context ({length}) tokens, e.g. 1 "
                          f"(always the last {length} tokens) or {max(length // 2, 1)}")
    top_k, slide = None if top_k is None else int(top_k), int(slide)
    tokens = [int(i) for i in np.asarray(token_ids).reshape(-1)][-length:]  # the text in view
    if not tokens:
        raise ConfigError("token_ids is empty: give at least one token to continue from")
    if not max_new_tokens:
        return []
    step = _step_function(model, length)
    decoder = decoder_for(model, length) if use_cache else None
    rng = np.random.default_rng(seed)
    window = np.zeros((1, length), np.int32)
    window[0, :len(tokens)] = tokens
    cache, new = None, []  # the cache holds the keys and values of all but the last token
    for _ in range(int(max_new_tokens)):
        filled = len(tokens)
        position = tf.constant(filled - 1, tf.int32)
        if cache is not None:
            logits, cache = decoder.decode(tf.constant(tokens[-1], tf.int32), position, cache)
        elif decoder is not None and filled < length:  # (a full window slides next: no cache)
            logits, cache = decoder.prefill(tf.constant(window), tf.constant(filled, tf.int32))
        else:
            logits = step(tf.constant(window), position)
        token = sample_token(logits.numpy(), rng, temperature, top_k)
        new.append(token)
        if filled < length:
            tokens.append(token)
            window[0, filled] = token
        else:  # every position changes: the next step runs the new window
            tokens, cache = tokens[slide:] + [token], None
            window[:] = 0
            window[0, :len(tokens)] = tokens
    return new


def export_language_model(model, vocab, directory):
    """Saves `model` as `model.keras` and `vocab` as `vocabulary.json` in `directory`.

    Each file is written atomically; the .keras file keeps the compiled
    optimizer's state, as Keras's native format always does. `load_language_model`
    reads the pair back.

    Returns:
      {'keras': path, 'vocabulary': path}.
    """
    check_vocabulary(model, vocab)
    os.makedirs(directory, exist_ok=True)
    keras_path = os.path.join(directory, MODEL_FILE)
    vocab_path = os.path.join(directory, VOCABULARY_FILE)
    vocab.save(vocab_path)
    with atomic_path(keras_path) as tmp:
        model.save(tmp)
    return {"keras": keras_path, "vocabulary": vocab_path}


def load_language_model(directory):
    """The (model, vocabulary) pair `export_language_model` wrote to `directory`.

    The model is loaded without its optimizer's compilation (compile it again to
    train on), in the Keras that wrote it: tfaccel's GPT in tf_keras (its layers are
    registered first), a Keras 3 model such as a KerasHub causal LM in Keras 3 (which
    imports KerasHub's classes itself).

    Raises:
      ModelError: a file is missing or unreadable, or the two do not match.
    """

    directory = os.fspath(directory)
    missing = [name for name in (MODEL_FILE, VOCABULARY_FILE)
               if not os.path.isfile(os.path.join(directory, name))]
    if missing:
        raise ModelError(f"{directory} holds no exported language model ({' and '.join(missing)} "
                         f"missing): expected {MODEL_FILE} and {VOCABULARY_FILE}, as "
                         "export_language_model (or recipes/train_lm.py) writes them")
    vocab = load_vocabulary(os.path.join(directory, VOCABULARY_FILE))
    path = os.path.join(directory, MODEL_FILE)
    flavour, _ = saved_flavour(path)  # a Keras 3 file (a KerasHub causal LM) loads in Keras 3
    try:
        with warnings.catch_warnings():  # a KerasHub task compiles itself in __init__
            warnings.filterwarnings("ignore", "Skipping variable loading for optimizer")
            model = keras_for(flavour).models.load_model(path, compile=False)
    except (OSError, ValueError, TypeError, KeyError, ImportError) as e:
        raise ModelError(f"cannot load {path}: {first_line(e)}; export it again with "
                         "export_language_model") from None
    check_vocabulary(model, vocab)
    return model, vocab
