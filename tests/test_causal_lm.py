"""train.causal_lm: KerasHub's GPT-2 from sizes (initialized as tfaccel's GPT or as GPT-2),
a --model_fn language model checked for its shapes, and the adapters from token ids to what
a KerasHub model takes (datasets, a one-input model for TFLite)."""


import numpy as np
import pytest
import tensorflow as tf

from tfaccel import errors
from tfaccel.train import causal_lm, generate, gpt_layers, language_model, training

keras_hub = pytest.importorskip("keras_hub")


def _std(model, fragment):
    return [float(np.std(w.numpy())) for w in model.weights if fragment in w.path]


def test_gpt2_scaled_init_draws_like_tfaccels_gpt_and_keras_hub_keeps_its_own():
    scaled = causal_lm.keras_hub_gpt2(50, layers=2, heads=2, d_model=64, context=16, seed=1)
    own = causal_lm.keras_hub_gpt2(50, layers=2, heads=2, d_model=64, context=16,
                                   init="keras_hub")
    assert isinstance(scaled, keras_hub.models.GPT2CausalLM) and scaled.preprocessor is None
    assert scaled.backbone.dropout == 0.0 and scaled.backbone.intermediate_dim == 256
    std = gpt_layers.init_stddev(64)  # 0.069 at width 64
    for value in _std(scaled, "query/kernel") + _std(scaled, "token_embedding"):
        assert value == pytest.approx(std, rel=0.1)
    for value in _std(scaled, "feedforward_output_dense/kernel"):
        assert value == pytest.approx(std / 2, rel=0.1)  # / sqrt(2 layers)
    for value in _std(own, "query/kernel"):
        assert value == pytest.approx(0.02, rel=0.1)
    assert _std(scaled, "query/bias") == [0.0, 0.0]
    again = causal_lm.keras_hub_gpt2(50, layers=2, heads=2, d_model=64, context=16, seed=1)
    assert all(np.array_equal(a.numpy(), b.numpy()) for a, b in zip(scaled.weights, again.weights))


def test_gpt2_bad_sizes_and_init_are_one_line():
    with pytest.raises(errors.ConfigError, match="heads=3 does not divide d_model=32"):
        causal_lm.keras_hub_gpt2(50, layers=1, heads=3, d_model=32, context=16)
    with pytest.raises(errors.ConfigError, match="unknown init='xavier': use one of scaled, "):
        causal_lm.keras_hub_gpt2(50, layers=1, heads=2, d_model=32, context=16, init="xavier")


def test_a_gpt2_trains_on_token_id_windows_with_the_gpts_loss():
    model = causal_lm.keras_hub_gpt2(20, layers=1, heads=2, d_model=16, context=8)
    language_model.compile_language_model(
        model, training.make_optimizer("adamw", 1e-2, flavour="keras3"))
    ids = np.random.default_rng(0).integers(0, 20, size=(16, 9)).astype(np.int32)
    data = causal_lm.with_model_inputs(
        tf.data.Dataset.from_tensor_slices((ids[:, :-1], ids[:, 1:])).batch(8), model)
    x, _ = next(iter(data))
    assert set(x) == {"token_ids", "padding_mask"} and x["padding_mask"].dtype == tf.int32
    before = model.evaluate(data, verbose=0, return_dict=True)
    logits = model.predict(data, verbose=0)
    by_hand = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(
        ids[:, 1:], logits, from_logits=True))
    assert before["loss"] == pytest.approx(float(by_hand), rel=1e-5)  # mean nats per token
    model.fit(data, epochs=5, verbose=0)
    assert model.evaluate(data, verbose=0, return_dict=True)["loss"] < before["loss"]
    with pytest.raises(errors.ConfigError, match="make_optimizer"):
        language_model.compile_language_model(model, training.make_optimizer("adamw", 1e-2))


def test_token_ids_model_gives_the_dict_models_logits():
    model = causal_lm.keras_hub_gpt2(20, layers=1, heads=2, d_model=16, context=8)
    ids = np.arange(8, dtype=np.int32)[None]
    plain = causal_lm.token_ids_model(model, 8)
    assert len(plain.inputs) == 1 and tuple(plain.inputs[0].shape) == (None, 8)
    np.testing.assert_allclose(
        np.asarray(plain(ids)),
        np.asarray(model({"token_ids": ids, "padding_mask": np.ones_like(ids, bool)})),
        atol=1e-6)
    assert causal_lm.token_ids_model(plain, 8) is plain  # ids already


def test_model_fn_language_model_is_checked_in_one_line():  # specs: tests/user_lms.py
    model = causal_lm.language_model_from_fn("user_lms:bigram", 30, 12)
    assert tuple(model.outputs[0].shape) == (None, 12, 30)  # any length: given the window's
    assert generate.model_context(model) == 12 and len(generate.generate_tokens(
        model, [1, 2], 15, temperature=0)) == 15
    hub = causal_lm.language_model_from_fn("user_lms:hub", 30, 12)
    assert isinstance(hub, keras_hub.models.GPT2CausalLM)  # kept: its class and its cache
    cases = {
        "user_lms:pooled": "maps token ids [1, 12] to outputs of shape (1, 30), not logits "
                              "(1, 12, 30)",
        "user_lms:wrong_signature": "cannot be called as wrong_signature(vocabulary_size"
                                       "=..., sequence_length=...)",
        "user_lms:tf_keras_model": "returned a tf_keras model: return a Keras 3 model",
        "user_lms:missing": "module 'user_lms' has no function 'missing'",
    }
    for spec, fragment in cases.items():
        with pytest.raises(errors.ModelError) as info:
            causal_lm.language_model_from_fn(spec, 30, 12)
        assert fragment in str(info.value) and "\n" not in str(info.value), str(info.value)
