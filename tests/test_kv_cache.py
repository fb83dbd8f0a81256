"""train.kv_cache and generate's cached path: the prefill and decode steps give the model's own
logits at every position; cached and uncached generation give the same tokens (200 greedy and
sampled, a prompt longer than the context, runs past the context with any slide) for the plain,
recomputing, tied, reloaded and mixed-precision GPT; the steps trace once; models without a
cache fall back to the window; KerasHub causal LMs use their own cache with tfaccel's sampling."""

import numpy as np
import pytest
import tensorflow as tf

from tfaccel import doctor, errors
from tfaccel.data import text
from tfaccel.keras import keras
from tfaccel.train import generate as gen, gpt, kv_cache, precision

CORPUS, _ = text.read_text()
CHARS = text.build_vocabulary(CORPUS, "char")
BYTES = text.build_vocabulary(CORPUS, "byte")
LONG_PROMPT = CORPUS[1000:1150]  # 150 characters, more than the tiny context of 64


def tiny(vocab=CHARS, **overrides):
    keras.utils.set_random_seed(0)
    return gpt.build_gpt(gpt.gpt_config("tiny", vocab_size=vocab.size, **overrides))


@pytest.fixture(scope="module")
def model():
    return tiny()


def both(model, prompt, n, **kwargs):
    """(cached, uncached) continuations."""
    return tuple(gen.generate(model, CHARS, prompt, n, use_cache=c, **kwargs)
                 for c in (True, False))


def check_logits_along(model, context, tolerance=1e-5):
    """Prefill n tokens, then decode to the end of the window: each step's logits are the
    model's own at that position."""
    decoder = kv_cache.decoder_for(model, context)
    ids = np.asarray(CHARS.encode(CORPUS[500:500 + context]), np.int32)
    for n in (1, 9, context - 1):
        window = np.zeros((1, context), np.int32)
        window[0, :n] = ids[:n]
        logits, cache = decoder.prefill(tf.constant(window), tf.constant(n))
        expected = model(ids[None], training=False).numpy()[0]
        np.testing.assert_allclose(logits.numpy(), expected[n - 1], atol=tolerance)
        for p in range(n, context):
            logits, cache = decoder.decode(tf.constant(int(ids[p])), tf.constant(p), cache)
            np.testing.assert_allclose(logits.numpy(), expected[p], atol=tolerance,
                                       err_msg=f"prefill {n}, decode at {p}")


# ------------------------------------------------------------------ the steps


@pytest.mark.parametrize("variant", ["plain", "recompute", "tied"])
def test_prefill_and_decode_give_the_models_logits_at_every_position(model, variant):
    subject = {"plain": lambda: model, "recompute": lambda: gpt.with_recompute(model),
               "tied": lambda: tiny(tie_embeddings=True)}[variant]()
    assert isinstance(kv_cache.decoder_for(subject, 64), kv_cache.GPTDecoder)
    check_logits_along(subject, 64)


def test_a_shorter_window_and_the_steps_trace_once(model):
    check_logits_along(model, 24)  # a window below the model's context
    decoder = kv_cache.decoder_for(model, 64)
    for prompt, slide in (("a", 1), ("The quick ", 32), (LONG_PROMPT, 7)):
        gen.generate(model, CHARS, prompt, 90, seed=1, slide=slide)
    assert kv_cache.decoder_for(model, 64) is decoder
    assert decoder.prefill.experimental_get_tracing_count() == 1
    assert decoder.decode.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("slide,calls", [(1, {"prefill": 1, "decode": 60, "window": 39}),
                                         (32, {"prefill": 3, "decode": 97, "window": 0})])
def test_the_cache_is_used_until_the_window_slides(model, monkeypatch, slide, calls):
    """"The " (4 tokens) + 100 tokens in a 64-token window: one prefill, decode steps until
    the window is full; then, with slide 1, the whole window for every token (every position
    moved), with slide 32 a prefill of the 33 tokens left and decode steps again."""
    decoder, step = kv_cache.decoder_for(model, 64), gen._step_function(model, 64)
    counted = dict.fromkeys(calls, 0)

    def counting(name, function):
        def call(*args):
            counted[name] += 1
            return function(*args)
        return call

    monkeypatch.setattr(decoder, "prefill", counting("prefill", decoder.prefill))
    monkeypatch.setattr(decoder, "decode", counting("decode", decoder.decode))
    monkeypatch.setitem(gen._STEP_FUNCTIONS[model], 64, counting("window", step))
    gen.generate(model, CHARS, "The ", 100, seed=0, slide=slide)
    assert counted == calls


# ------------------------------------------------------------------ the same tokens


@pytest.mark.parametrize("slide", [1, 32])
def test_cached_and_uncached_give_the_same_200_tokens(model, slide):
    cached, uncached = both(model, "The ", 200, temperature=0, slide=slide)
    assert cached == uncached and len(cached) == 200
    assert len(set(cached)) >= 10  # not a degenerate loop: the comparison means something
    for kwargs in (dict(temperature=0.8, seed=3), dict(temperature=1.0, top_k=20, seed=4)):
        cached, uncached = both(model, "The ", 200, slide=slide, **kwargs)
        assert cached == uncached
    assert cached != both(model, "The ", 200, slide=slide, temperature=1.0, top_k=20, seed=5)[0]


def test_200_tokens_inside_a_context_of_256():
    model = tiny(context=256)
    cached, uncached = both(model, "def ", 200, temperature=0)
    assert cached == uncached and len(set(cached)) >= 3
    assert both(model, "def ", 200, seed=2)[0] == both(model, "def ", 200, seed=2)[1]


@pytest.mark.parametrize("slide", [1, 20, 64])
def test_a_prompt_longer_than_the_context(model, slide):
    cached, uncached = both(model, LONG_PROMPT, 80, temperature=0, slide=slide)
    assert cached == uncached
    assert both(model, LONG_PROMPT, 80, seed=7, slide=slide)[0] == \
        both(model, LONG_PROMPT, 80, seed=7, slide=slide)[1]
    # Only the last 64 prompt tokens count.
    assert cached == gen.generate(model, CHARS, "x" + LONG_PROMPT, 80, temperature=0,
                                  slide=slide)


def test_recomputing_and_reloaded_models_generate_what_the_plain_model_does(model, tmp_path):
    expected = gen.generate(model, CHARS, "The ", 120, seed=1, use_cache=False)
    assert gen.generate(gpt.with_recompute(model), CHARS, "The ", 120, seed=1) == expected
    gen.export_language_model(model, CHARS, tmp_path / "lm")
    loaded, vocab = gen.load_language_model(tmp_path / "lm")
    assert gen.generate(loaded, vocab, "The ", 120, seed=1) == expected


@pytest.mark.parametrize("policy,low", [("mixed_bfloat16", tf.bfloat16),
                                        ("mixed_float16", tf.float16)])
def test_mixed_precision_caches_in_the_compute_dtype_within_its_rounding(model, policy, low):
    """16-bit logits agree to 16-bit rounding (measured 0.0044 at most, logits of size ~1.7:
    as far as the uncached path's own padded and unpadded windows, 0.0034; with oneDNN off,
    TensorFlow's own bfloat16 kernels as on AVX2-only CPUs, 0.031), so a choice within that
    of a tie may differ; float32 (above) gives the same tokens."""
    with precision.precision_scope(policy):
        half = tiny()
    half.set_weights(model.get_weights())
    decoder = kv_cache.decoder_for(half, 64)
    window = np.zeros((1, 64), np.int32)
    _, (keys_values, weights) = decoder.prefill(tf.constant(window), tf.constant(3))
    assert {t.dtype for t in keys_values + weights} == {low}
    check_logits_along(half, 64, tolerance=0.02 if doctor.onednn_enabled() else 0.05)
    sample = gen.generate(half, CHARS, "The ", 100, seed=2, slide=32)
    assert len(sample) == 100 and sample == gen.generate(half, CHARS, "The ", 100, seed=2,
                                                         slide=32)


# ------------------------------------------------------------------ windows, ids, errors


def summing_model(size):
    """A causal model whose next token is the sum of (id + 1) over its window, mod size."""
    tokens = keras.Input((None,), dtype="int32")
    return keras.Model(tokens, keras.layers.Lambda(lambda x: 10.0 * tf.one_hot(
        tf.math.floormod(tf.cumsum(x + 1, axis=1), size), size))(tokens), name="summing")


@pytest.mark.parametrize("slide", [1, 3, 8])
def test_a_model_without_a_cache_slides_its_window_as_documented(slide):
    size, context = CHARS.size, 8
    summing = summing_model(size)
    assert kv_cache.decoder_for(summing, context) is None  # falls back to the window
    ids = [int(i) for i in CHARS.encode("the quick brown")][-context:]
    new = []
    for _ in range(20):
        new.append(sum(i + 1 for i in ids) % size)
        ids = ids + [new[-1]] if len(ids) < context else ids[slide:] + [new[-1]]
    got = gen.generate_tokens(summing, CHARS.encode("the quick brown"), 20, temperature=0,
                              context=context, slide=slide)
    assert got == new


def test_generate_tokens_is_generate_without_the_vocabulary(model):
    ids = CHARS.encode("The ")
    assert CHARS.decode(np.asarray(gen.generate_tokens(model, ids, 50, seed=4), np.int32)) == \
        gen.generate(model, CHARS, "The ", 50, seed=4)
    assert gen.generate_tokens(model, ids, 0) == []
    with pytest.raises(errors.ConfigError, match="token_ids is empty"):
        gen.generate_tokens(model, [], 5)


def test_bad_slides_and_contexts_are_one_line(model):
    for slide in (0, 65):
        with pytest.raises(errors.ConfigError, match=f"slide={slide}: give 1 to the context "
                                                     r"\(64\) tokens") as info:
            gen.generate(model, CHARS, "a", 5, slide=slide)
        assert "\n" not in str(info.value)
    for use_cache in (True, False):
        with pytest.raises(errors.ModelError, match="larger than the model's context 64"):
            gen.generate(model, CHARS, "a", 5, context=128, use_cache=use_cache)


# ------------------------------------------------------------------ KerasHub


@pytest.fixture(scope="module")
def gpt2():
    keras_hub = pytest.importorskip("keras_hub")
    from tfaccel.keras import keras3

    keras3().utils.set_random_seed(0)
    backbone = keras_hub.models.GPT2Backbone(vocabulary_size=BYTES.size, num_layers=2,
                                             num_heads=4, hidden_dim=128, intermediate_dim=512,
                                             max_sequence_length=64)
    return keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)


def test_keras_hub_causal_lm_uses_its_own_cache_with_tfaccels_sampling(gpt2):
    assert gen.model_context(gpt2) == 64
    decoder = kv_cache.decoder_for(gpt2, 64)
    assert isinstance(decoder, kv_cache.KerasHubDecoder)
    ids = BYTES.encode("The ")
    for kwargs in (dict(temperature=0), dict(temperature=0.8, seed=3),
                   dict(temperature=1.0, top_k=10, seed=4, slide=16)):
        cached, uncached = (gen.generate_tokens(gpt2, ids, 90, use_cache=c, **kwargs)
                            for c in (True, False))
        assert cached == uncached  # 90 tokens after 4: past the context of 64
    assert decoder.prefill.experimental_get_tracing_count() == 1
    assert decoder.decode.experimental_get_tracing_count() == 1
    # KerasHub's own greedy generate (its cache, its sampler) writes the same tokens.
    gpt2.compile(sampler="greedy")
    padded, mask = np.zeros((1, 64), np.int32), np.zeros((1, 64), bool)
    padded[0, :len(ids)], mask[0, :len(ids)] = ids, True
    theirs = gpt2.generate({"token_ids": padded, "padding_mask": mask}, stop_token_ids=None)
    ours = gen.generate_tokens(gpt2, ids, 64 - len(ids), temperature=0)
    assert [int(t) for t in np.asarray(theirs["token_ids"])[0, len(ids):]] == ours
    assert isinstance(gen.generate(gpt2, BYTES, "The ", 10, seed=1), str)
    with pytest.raises(errors.ModelError, match="larger than the model's context 64"):
        gen.generate(gpt2, BYTES, "a", 5, context=65)


# ------------------------------------------------------------------ the per-epoch sample


def test_sample_logger_samples_with_the_cache_sliding_by_half_the_context(model, tmp_path):
    from tfaccel import summaries
    from tfaccel.train import language_model

    logger = language_model.SampleLogger(tmp_path, CHARS, "The ", 100, seed=1, printer=None)
    logger.set_model(model)
    decoder = kv_cache.decoder_for(model, 64)
    decodes = decoder.decode.experimental_get_tracing_count()
    logger.on_epoch_end(0)
    expected = gen.generate(model, CHARS, "The ", 100, temperature=0.8, seed=1,
                            use_cache=False, slide=32)
    assert logger.samples == [{"epoch": 1, "text": expected}]
    assert expected != gen.generate(model, CHARS, "The ", 100, temperature=0.8, seed=1)
    assert decoder.decode.experimental_get_tracing_count() == max(decodes, 1)
    assert "The " in summaries.read_text(str(tmp_path))["samples/generated"]
