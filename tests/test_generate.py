"""train.generate: seeded sampling (temperature, top_k, greedy), the model's context and the
padded window, prompts a vocabulary cannot spell, export/load with the vocabulary, and text
that holds corpus words after brief training."""

import os
import re
import time

import numpy as np
import pytest
import tensorflow as tf

from tfaccel import errors
from tfaccel.data import text
from tfaccel.keras import keras
from tfaccel.train import generate as gen, gpt

CORPUS, _ = text.read_text()
WORDS = set(re.findall(r"[A-Za-z]{4,}", CORPUS))
CHARS = text.build_vocabulary(CORPUS, "char")
BYTES = text.build_vocabulary(CORPUS, "byte")


def tiny(vocab, **overrides):
    keras.utils.set_random_seed(0)
    return gpt.build_gpt(gpt.gpt_config("tiny", vocab_size=vocab.size, **overrides))


@pytest.fixture(scope="module")
def model():
    return tiny(CHARS)


def corpus_words(sample):
    return [w for w in re.findall(r"[A-Za-z]{4,}", sample) if w in WORDS]


def naive_greedy(model, ids, steps, context):
    """Greedy decoding the slow, obvious way: the whole (cropped) text, no padding."""
    ids = list(ids)
    for _ in range(steps):
        logits = model(np.asarray([ids[-context:]], np.int32), training=False).numpy()
        ids.append(int(np.argmax(logits[0, -1])))
    return ids


# ------------------------------------------------------------------ sampling


def test_same_seed_same_text_and_other_seeds_differ(model):
    a = gen.generate(model, CHARS, "The ", 40, seed=3)
    assert a == gen.generate(model, CHARS, "The ", 40, seed=3)
    assert a != gen.generate(model, CHARS, "The ", 40, seed=4)
    assert len(a) == 40 and not a.startswith("The ")  # one char per token, prompt left out
    assert gen.generate(model, CHARS, "The ", 0) == ""


def test_top_k_1_and_temperature_0_are_greedy(model):
    greedy = gen.generate(model, CHARS, "def ", 30, temperature=0)
    assert greedy == gen.generate(model, CHARS, "def ", 30, temperature=0, seed=9)
    assert greedy == gen.generate(model, CHARS, "def ", 30, temperature=1.5, top_k=1, seed=5)
    assert greedy != gen.generate(model, CHARS, "def ", 30, temperature=1.5, seed=5)


def test_the_padded_window_gives_the_unpadded_logits(model):
    """Right-padding the window is safe: the causal mask keeps it from the position read."""
    context = gpt.gpt_config_of(model).context
    step = gen._step_function(model, context)
    ids = np.asarray(CHARS.encode(CORPUS[500:500 + context]), np.int32)
    for n in (1, 7, context - 1, context):
        window = np.zeros((1, context), np.int32)
        window[0, :n] = ids[:n]
        expected = model(ids[None, :n], training=False).numpy()[0, -1]
        np.testing.assert_allclose(step(window, n - 1).numpy(), expected, atol=1e-5)


def test_cropping_and_sliding_follow_the_context():
    """A causal model whose next token is the sum of (id + 1) over its window, mod V:
    any token wrongly kept, dropped or shifted changes the text."""
    size = CHARS.size
    tokens = keras.Input((None,), dtype="int32")
    summing = keras.Model(tokens, keras.layers.Lambda(lambda x: 10.0 * tf.one_hot(
        tf.math.floormod(tf.cumsum(x + 1, axis=1), size), size))(tokens), name="summing")
    context = 8
    for prompt, steps in (("a", 12), ("abcdef", 5), ("the quick brown fox", 9)):
        ids = [int(i) for i in CHARS.encode(prompt)]
        for _ in range(steps):
            ids.append(sum(i + 1 for i in ids[-context:]) % size)
        expected = CHARS.decode(np.asarray(ids[-steps:], np.int32))
        assert gen.generate(summing, CHARS, prompt, steps, temperature=0,
                            context=context) == expected


def test_the_step_function_is_traced_once_per_model(model):
    gen.generate(model, CHARS, "a", 3, seed=0)
    step = gen._step_function(model, 64)
    traced = step.experimental_get_tracing_count()
    gen.generate(model, CHARS, "another prompt", 20, temperature=0.5, top_k=5, seed=1)
    assert gen._step_function(model, 64) is step
    assert step.experimental_get_tracing_count() == traced == 1


def test_sample_token_follows_temperature_and_top_k():
    rng = np.random.default_rng(0)
    logits = np.log([0.1, 0.2, 0.3, 0.4])
    draws = np.array([gen.sample_token(logits, rng) for _ in range(4000)])
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / 4000, [0.1, 0.2, 0.3, 0.4],
                               atol=0.03)
    top2 = np.array([gen.sample_token(logits, rng, top_k=2) for _ in range(2000)])
    assert set(top2) == {2, 3}
    np.testing.assert_allclose(np.mean(top2 == 3), 0.4 / 0.7, atol=0.03)
    cold = np.array([gen.sample_token(logits, rng, temperature=0.1) for _ in range(500)])
    assert np.mean(cold == 3) > 0.9
    assert gen.sample_token([1.0, 5.0, 5.0], rng, temperature=0) == 1
    assert gen.sample_token([1.0, 5.0, 5.0], rng, top_k=1) == 1


def test_bad_arguments_get_one_line(model):
    for kwargs, word in ((dict(temperature=-1), "temperature"), (dict(top_k=0), "top_k"),
                         (dict(max_new_tokens=-2), "max_new_tokens")):
        with pytest.raises(errors.ConfigError, match=word) as info:
            gen.generate(model, CHARS, "a", **{"max_new_tokens": 5, **kwargs})
        assert "\n" not in str(info.value)


# ------------------------------------------------------------------ vocabularies and prompts


def test_char_vocabulary_refuses_unknown_prompt_characters(model):
    with pytest.raises(errors.DataError) as info:
        gen.generate(model, CHARS, "naïve ✓ prompt", 5)
    message = str(info.value)
    assert "\n" not in message and "✓" in message and "ï" in message


def test_byte_vocabulary_takes_any_prompt():
    model = tiny(BYTES)
    prompt = "naïve ✓ 日本語 prompt"
    ids = [int(i) for i in BYTES.encode(prompt)]
    assert len(ids) > len(prompt)  # multi-byte characters
    expected = naive_greedy(model, ids, 12, 64)[len(ids):]
    out = gen.generate(model, BYTES, prompt, 12, temperature=0)
    assert out == bytes(expected).decode("utf-8", errors="replace")
    assert isinstance(gen.generate(model, BYTES, prompt, 12, seed=2), str)


def test_empty_prompt_starts_from_a_newline(model):
    out = gen.generate(model, CHARS, "", 10, temperature=0)
    assert len(out) == 10 and out == gen.generate(model, CHARS, "\n", 10, temperature=0)


def test_a_vocabulary_of_another_size_is_refused(model):
    with pytest.raises(errors.ModelError, match=f"predicts {CHARS.size} tokens"):
        gen.generate(model, BYTES, "a", 5)


def test_a_model_of_any_length_without_config_needs_a_context():
    tokens = keras.Input((None,), dtype="int32")
    bare = keras.Model(tokens, keras.layers.Dense(CHARS.size)(
        keras.layers.Embedding(CHARS.size, 8)(tokens)), name="bare")
    with pytest.raises(errors.ModelError, match="pass context="):
        gen.generate(bare, CHARS, "a", 5)
    assert len(gen.generate(bare, CHARS, "a", 5, context=16)) == 5


def test_mirrored_and_mixed_precision_models_generate(model):
    from conftest import mirrored_strategy

    from tfaccel.train import precision

    expected = gen.generate(model, CHARS, "The ", 12, temperature=0)
    with mirrored_strategy().scope():
        mirrored = tiny(CHARS)
        mirrored.set_weights(model.get_weights())
        assert gen.generate(mirrored, CHARS, "The ", 12, temperature=0) == expected
    assert gen.generate(mirrored, CHARS, "The ", 12, temperature=0) == expected
    with precision.precision_scope("mixed_bfloat16"):
        half = tiny(CHARS)
    assert half.get_layer("block_0_mlp_fc").compute_dtype == "bfloat16"
    sample = gen.generate(half, CHARS, "The ", 12, seed=1)
    assert len(sample) == 12 and sample == gen.generate(half, CHARS, "The ", 12, seed=1)


# ------------------------------------------------------------------ export and load


def test_export_and_load_round_trip(model, tmp_path):
    paths = gen.export_language_model(model, CHARS, tmp_path / "lm")
    assert sorted(os.listdir(tmp_path / "lm")) == ["model.keras", "vocabulary.json"]
    assert paths == {"keras": str(tmp_path / "lm" / "model.keras"),
                     "vocabulary": str(tmp_path / "lm" / "vocabulary.json")}
    loaded, vocab = gen.load_language_model(tmp_path / "lm")
    assert vocab == CHARS and gpt.gpt_config_of(loaded) == gpt.gpt_config_of(model)
    assert (gen.generate(loaded, vocab, "The ", 30, seed=1)
            == gen.generate(model, CHARS, "The ", 30, seed=1))


def test_load_names_what_is_missing(model, tmp_path):
    with pytest.raises(errors.ModelError) as info:
        gen.load_language_model(tmp_path)
    message = str(info.value)
    assert str(tmp_path) in message and "model.keras" in message and "vocabulary.json" in message
    assert "\n" not in message
    CHARS.save(tmp_path / "vocabulary.json")
    with pytest.raises(errors.ModelError, match="model.keras missing"):
        gen.load_language_model(tmp_path)
    (tmp_path / "model.keras").write_bytes(b"not a model")
    with pytest.raises(errors.ModelError, match="cannot load .*model.keras") as info:
        gen.load_language_model(tmp_path)
    assert "\n" not in str(info.value)


def test_keras_hub_causal_lm_exports_loads_and_samples_cached_as_uncached(tmp_path):
    """A KerasHub GPT-2 (Keras 3) goes through the same export and load, in its own Keras
    and class; greedy text with KerasHub's cache equals the whole-window path's."""
    from tfaccel.train import causal_lm

    pytest.importorskip("keras_hub")
    model = causal_lm.keras_hub_gpt2(CHARS.size, layers=1, heads=2, d_model=32, context=24,
                                     seed=3)
    gen.export_language_model(model, CHARS, tmp_path / "lm")
    loaded, vocab = gen.load_language_model(tmp_path / "lm")
    assert type(loaded) is type(model) and vocab == CHARS
    assert gen.model_context(loaded) == 24
    window = {"token_ids": np.arange(24, dtype=np.int32)[None] % CHARS.size,
              "padding_mask": np.ones((1, 24), bool)}
    np.testing.assert_allclose(np.asarray(loaded(window)), np.asarray(model(window)), atol=1e-6)
    greedy = [gen.generate(loaded, vocab, "The ", 40, temperature=0, use_cache=cached)
              for cached in (True, False)]
    assert len(greedy[0]) == 40 and greedy[0] == greedy[1]
    assert (gen.generate(loaded, vocab, "The ", 30, seed=2, use_cache=True)
            == gen.generate(model, CHARS, "The ", 30, seed=2, use_cache=False))


# ------------------------------------------------------------------ after training


@pytest.mark.slow
def test_brief_training_writes_corpus_words():
    model = tiny(CHARS)
    untrained = [gen.generate(model, CHARS, "The ", 200, temperature=0.7, seed=s)
                 for s in range(3)]
    assert not any(corpus_words(s) for s in untrained)
    tokens = CHARS.encode(CORPUS[:200_000])
    model.compile(keras.optimizers.AdamW(1e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    rng = np.random.default_rng(0)
    starts = rng.integers(0, len(tokens) - 65, size=800 * 16)
    window = starts[:, None] + np.arange(64)
    model.fit(tokens[window], tokens[window + 1], batch_size=16, epochs=1, verbose=0)
    start = time.perf_counter()
    samples = [gen.generate(model, CHARS, "The ", 200, temperature=0.7, seed=s)
               for s in range(3)]
    rate = 600 / (time.perf_counter() - start)
    print(f"generation: {rate:.0f} tokens/s; sample: {samples[0]!r}")
    assert sum(len(corpus_words(s)) for s in samples) >= 2, samples
