"""Sampling text from a language model, and saving or loading a model with its vocabulary.

A language model is a tf_keras model from token ids `[batch, T]` to float32 logits
`[batch, T, vocabulary]` whose position t sees only tokens 0..t (causal), such as
`tfaccel.train.gpt.build_gpt`'s. `generate` continues a prompt one token at a time. Each
step runs the model on one fixed-shape window of `context` tokens (the text so far,
cropped to its last `context` tokens and padded on the right), through one compiled
`tf.function` kept per model: no step retraces, and the causal mask keeps the padding
from reaching the position read. Sampling happens on the host with a NumPy generator
seeded by `seed`, so the same seed gives the same text.

Example:

    from tfaccel.train import generate

    generate.export_language_model(model, splits.vocab, "runs/lm/export")
    model, vocab = generate.load_language_model("runs/lm/export")
    print(generate.generate(model, vocab, "The ", max_new_tokens=200, temperature=0.8,
                            top_k=20, seed=1))
"""

import os
import weakref

import numpy as np
import tensorflow as tf

from tfaccel.data.text import load_vocabulary
from tfaccel.errors import ConfigError, DataError, ModelError, first_line
from tfaccel.io import atomic_path
from tfaccel.keras import keras
from tfaccel.train.gpt import gpt_config_of

MODEL_FILE = "model.keras"
VOCABULARY_FILE = "vocabulary.json"

_START_CANDIDATES = ("\n", " ")  # what an empty prompt starts from, first spellable one

# model -> {window length: compiled next-token function}; the entry goes with the model.
_STEP_FUNCTIONS = weakref.WeakKeyDictionary()


def model_context(model, context=None):
    """How many tokens `model` sees at once: `context` if given, else its GPT configuration's,
    else its input's fixed length.

    Raises:
      ModelError: none of those says (a model taking any length, without a GPT
        configuration): pass `context`.
    """
    if context is not None:
        if int(context) < 1:
            raise ConfigError(f"context={context}: give a positive number of tokens")
        return int(context)

    config = gpt_config_of(model)
    if config is not None:
        return int(config.context)
    shape = model.inputs[0].shape if getattr(model, "inputs", None) else None
    if shape is not None and shape.rank == 2 and shape[1] is not None:
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
            logits = ref()(window, training=False)
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
             context=None):
    """Continues `prompt` with `max_new_tokens` tokens sampled from `model`.

    Deterministic for a seed: the same model, prompt and seed give the same text.
    The model sees at most its context: a longer prompt (or text grown past it)
    is cropped to its last `context` tokens. An empty prompt starts from a
    newline (or a space, or id 0 when the vocabulary has neither), which is not
    part of the result. With a byte vocabulary a continuation may end inside a
    multi-byte character, which decodes as U+FFFD.

    Example:

        generate(model, vocab, "def ", max_new_tokens=100, temperature=0.8, top_k=20)

    Args:
      model: a causal language model (token ids in, float32 logits out).
      vocab: its `tfaccel.data.text.Vocabulary`.
      prompt: the text to continue.
      max_new_tokens: how many tokens to add.
      temperature: divides the logits; 0 picks the most likely token each step.
      top_k: sample among the `top_k` most likely tokens only (None: all).
      seed: seeds the sampling.
      context: tokens the model sees at once (None: from the model, see
        `model_context`).

    Returns:
      The continuation only, decoded (not the prompt).

    Raises:
      DataError: the prompt holds characters a char vocabulary does not know.
      ConfigError: a negative `max_new_tokens` or `temperature`, `top_k` < 1.
      ModelError: the model and vocabulary disagree on the number of tokens.
    """
    _check_arguments(max_new_tokens, temperature, top_k)
    top_k = None if top_k is None else int(top_k)
    model = getattr(model, "placed", model)  # a PipelineModel samples with its own layers
    check_vocabulary(model, vocab)
    length = model_context(model, context)
    ids = _prompt_ids(vocab, prompt)
    if not max_new_tokens:
        return ""
    step = _step_function(model, length)
    rng = np.random.default_rng(seed)
    window = np.zeros((1, length), np.int32)
    tokens = list(ids[-length:])
    window[0, :len(tokens)] = tokens
    new = []
    for _ in range(int(max_new_tokens)):
        filled = len(tokens)
        logits = step(tf.constant(window), tf.constant(filled - 1, tf.int32)).numpy()
        token = sample_token(logits, rng, temperature, top_k)
        new.append(token)
        if filled < length:
            tokens.append(token)
            window[0, filled] = token
        else:
            tokens = tokens[1:] + [token]
            window[0, :-1] = window[0, 1:]
            window[0, -1] = token
    return vocab.decode(np.asarray(new, np.int32))


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
    train on); tfaccel's GPT layers are registered first.

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
    try:
        model = keras.models.load_model(path, compile=False)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise ModelError(f"cannot load {path}: {first_line(e)}; export it again with "
                         "export_language_model") from None
    check_vocabulary(model, vocab)
    return model, vocab
