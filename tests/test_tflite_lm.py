"""compress.tflite_lm: a GPT converted for a fixed [1, L] window (float and dynamic-range
int8; mixed precision and recomputing models too), its next-token loss in LiteRT against
Keras's, sizes, and the inputs it refuses."""

import math

import numpy as np
import pytest

from tfaccel import errors
from tfaccel.compress import tflite_eval, tflite_lm
from tfaccel.data import text
from tfaccel.keras import keras
from tfaccel.train import gpt, precision

CORPUS, _ = text.read_text()
VOCAB = text.build_vocabulary(CORPUS, "char")
TRAIN = VOCAB.encode(CORPUS[:150_000])
VALIDATION = VOCAB.encode(CORPUS[-20_000:])
L = 64


def keras_loss(model, tokens, length, max_windows=None):
    x, y = tflite_lm.lm_windows(tokens, length, max_windows)
    return tflite_lm.cross_entropy(model.predict(x, batch_size=32, verbose=0), y)


@pytest.fixture(scope="module")
def trained():
    """The tiny GPT after 60 steps of batch 12 (loss about 3.3 nats/char, untrained 4.6)."""
    keras.utils.set_random_seed(0)
    model = gpt.build_gpt(gpt.gpt_config("tiny", vocab_size=VOCAB.size))
    model.compile(keras.optimizers.AdamW(2e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    starts = np.random.default_rng(0).integers(0, len(TRAIN) - L - 1, size=60 * 12)
    window = starts[:, None] + np.arange(L)
    model.fit(TRAIN[window], TRAIN[window + 1], batch_size=12, epochs=1, verbose=0)
    return model


@pytest.fixture(scope="module")
def files(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("lm")
    return {"float": tflite_lm.language_model_tflite(trained, str(out / "float.tflite")),
            "dynamic_range": tflite_lm.language_model_tflite(
                trained, str(out / "dynamic_range.tflite"), "dynamic_range", sequence_length=L)}


def test_float_file_loss_equals_keras(trained, files):
    result = tflite_lm.evaluate_language_model_tflite(files["float"], VALIDATION, L,
                                                      max_windows=60)
    expected = keras_loss(trained, VALIDATION, L, max_windows=60)
    assert result["num_windows"] == 60
    assert result["loss"] == pytest.approx(expected, rel=1e-4)
    assert result["bits_per_token"] == pytest.approx(result["loss"] / math.log(2))
    assert result["perplexity"] == pytest.approx(math.exp(result["loss"]))
    assert result["loss"] < math.log(VOCAB.size) - 1.0  # it learned something


def test_dynamic_range_is_smaller_and_close(trained, files):
    sizes = {mode: tflite_eval.tflite_sizes(path)["bytes"] for mode, path in files.items()}
    weight_bytes = 4 * trained.count_params()
    assert sizes["float"] >= weight_bytes
    assert sizes["dynamic_range"] < weight_bytes / 3
    losses = {mode: tflite_lm.evaluate_language_model_tflite(path, VALIDATION, L)["loss"]
              for mode, path in files.items()}
    print(f"sizes {sizes}, losses {losses}, weights {weight_bytes} bytes")
    assert losses["dynamic_range"] == pytest.approx(losses["float"], rel=0.03)


def test_the_file_takes_one_fixed_int32_window(files):
    for path in files.values():
        detail = tflite_eval.make_interpreter(path).get_input_details()[0]
        assert list(detail["shape"]) == [1, L] and detail["dtype"] == np.int32
        out = tflite_eval.make_interpreter(path).get_output_details()[0]
        assert list(out["shape"]) == [1, L, VOCAB.size] and out["dtype"] == np.float32


def test_a_mixed_precision_model_converts_in_float32_for_a_shorter_window(trained, tmp_path):
    with precision.precision_scope("mixed_bfloat16"):
        half = gpt.build_gpt(gpt.gpt_config_of(trained))
    half.set_weights(trained.get_weights())
    path = tflite_lm.language_model_tflite(half, str(tmp_path / "short.tflite"),
                                           sequence_length=16)
    detail = tflite_eval.make_interpreter(path).get_input_details()[0]
    assert list(detail["shape"]) == [1, 16]
    result = tflite_lm.evaluate_language_model_tflite(path, VALIDATION, 16, max_windows=20)
    assert result["num_windows"] == 20
    assert result["loss"] == pytest.approx(keras_loss(trained, VALIDATION, 16, 20), rel=1e-4)


@pytest.mark.slow
def test_a_recomputing_model_converts(trained, tmp_path):
    lean = gpt.with_recompute(trained)
    path = tflite_lm.language_model_tflite(lean, str(tmp_path / "lean.tflite"), "dynamic_range")
    result = tflite_lm.evaluate_language_model_tflite(path, VALIDATION, L, max_windows=20)
    assert result["loss"] == pytest.approx(keras_loss(trained, VALIDATION, L, 20), rel=0.03)


def test_windows_do_not_overlap_and_targets_shift():
    tokens = np.arange(23)
    x, y = tflite_lm.lm_windows(tokens, 5)
    assert x.shape == y.shape == (4, 5)  # (23 - 1) // 5 windows: the last target is token 20
    np.testing.assert_array_equal(x[:, 0], [0, 5, 10, 15])
    np.testing.assert_array_equal(y, x + 1)
    assert tflite_lm.lm_windows(tokens, 5, max_windows=2)[0].shape == (2, 5)


def test_cross_entropy_of_known_logits():
    logits = np.log([[[0.5, 0.25, 0.25], [0.1, 0.8, 0.1]]])
    assert tflite_lm.cross_entropy(logits, [[0, 1]]) == pytest.approx(
        -(math.log(0.5) + math.log(0.8)) / 2)


def test_bad_inputs_get_one_line(trained, files, tmp_path):
    cases = [
        (errors.ConfigError, "use float or dynamic_range",
         lambda: tflite_lm.language_model_tflite(trained, str(tmp_path / "x.tflite"), "int4")),
        (errors.ModelError, "65",
         lambda: tflite_lm.language_model_tflite(trained, str(tmp_path / "x.tflite"),
                                                 sequence_length=65)),
        (errors.ModelError, "sequence_length=64",
         lambda: tflite_lm.evaluate_language_model_tflite(files["float"], VALIDATION, 32)),
        (errors.DataError, "at least 65",
         lambda: tflite_lm.evaluate_language_model_tflite(files["float"], VALIDATION[:64], L)),
        (errors.DataError, "vocabulary",
         lambda: tflite_lm.evaluate_language_model_tflite(
             files["float"], np.full(200, VOCAB.size), L)),
    ]
    for error, words, call in cases:
        with pytest.raises(error, match=words) as info:
            call()
        assert "\n" not in str(info.value)
    assert not (tmp_path / "x.tflite").exists()


@pytest.mark.slow
def test_a_keras_hub_gpt2_converts_without_the_bridge(tmp_path):
    from hub_models import gpt2_and_bert

    from tfaccel.keras import keras3

    lm, _ = gpt2_and_bert(vocabulary_size=VOCAB.size, max_length=16)
    x, _ = tflite_lm.lm_windows(VALIDATION, 16, max_windows=6)
    logits = np.asarray(lm({"token_ids": x, "padding_mask": np.ones_like(x, bool)}))
    expected = tflite_lm.cross_entropy(logits, tflite_lm.lm_windows(VALIDATION, 16, 6)[1])
    path = tflite_lm.language_model_tflite(lm, str(tmp_path / "gpt2.tflite"))  # its 16 tokens
    dynamic = tflite_lm.language_model_tflite(lm, str(tmp_path / "gpt2_int8.tflite"),
                                              "dynamic_range", sequence_length=16)
    result = tflite_lm.evaluate_language_model_tflite(path, VALIDATION, 16, max_windows=6)
    assert result["loss"] == pytest.approx(expected, abs=1e-5)
    small = tflite_lm.evaluate_language_model_tflite(dynamic, VALIDATION, 16, max_windows=6)
    assert abs(small["loss"] - expected) < 0.01
    assert tflite_eval.tflite_sizes(dynamic)["bytes"] < tflite_eval.tflite_sizes(path)["bytes"]
    with pytest.raises(errors.ModelError, match="max_sequence_length 16"):
        tflite_lm.language_model_tflite(lm, str(tmp_path / "x.tflite"), sequence_length=17)
    keras3().mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        half, _ = gpt2_and_bert(vocabulary_size=VOCAB.size, max_length=16)
    finally:
        keras3().mixed_precision.set_global_policy("float32")
    with pytest.raises(errors.ModelError, match="computes in bfloat16"):
        tflite_lm.language_model_tflite(half, str(tmp_path / "x.tflite"))
    assert not (tmp_path / "x.tflite").exists()
