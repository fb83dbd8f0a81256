"""compress.lm_variants and compress.lm_report: a small KerasHub GPT2 (Keras 3) and a small
tfaccel GPT (tf_keras), each trained a few steps on the default text, through every kind of
variant: losses beside float's, sizes, pruned zeros counted from the weights, refusals as
rows, generation timed; the report's files; loading a trained model's folder."""

import json

import numpy as np
import pytest
from hub_models import gpt2_and_bert

from tfaccel import errors, summaries
from tfaccel.compress import lm_report, lm_variants, prunable
from tfaccel.data import text
from tfaccel.keras import keras, keras3
from tfaccel.train import generate, gpt

L = 16
SPLITS = text.load_text_dataset(None, "char", sequence_length=L)
TRAIN, VALIDATION = SPLITS.train[:40_000], SPLITS.validation[:4_000]
PROMPT = SPLITS.vocab.encode("The ")
INT8_LOSS_TOLERANCE = 0.02  # nats/char: int8 weights (and Keras 3's int8 activations)
INT4_LOSS_TOLERANCE = 0.1


def windows(tokens, count, seed=0):
    starts = np.random.default_rng(seed).integers(0, len(tokens) - L - 1, count)
    index = starts[:, None] + np.arange(L)
    return tokens[index], tokens[index + 1]


@pytest.fixture(scope="module")
def gpt2():
    """A 1-layer KerasHub GPT2 (hidden 32) trained 40 steps of 16 windows on the text."""
    k3 = keras3()
    k3.utils.set_random_seed(0)
    lm, _ = gpt2_and_bert(vocabulary_size=SPLITS.vocab.size, max_length=L)
    lm.compile(k3.optimizers.Adam(3e-3),
               loss=k3.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = windows(TRAIN, 640)
    lm.fit({"token_ids": x, "padding_mask": np.ones_like(x, bool)}, y, batch_size=16,
           verbose=0)
    return lm


@pytest.fixture(scope="module")
def tiny_gpt():
    """tfaccel's GPT (tf_keras), 1 layer x 2 heads x d_model 32, trained 40 steps."""
    keras.utils.set_random_seed(0)
    model = gpt.build_gpt(gpt.gpt_config("tiny", vocab_size=SPLITS.vocab.size, layers=1,
                                         heads=2, d_model=32, context=L))
    model.compile(keras.optimizers.Adam(3e-3),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x, y = windows(TRAIN, 640)
    model.fit(x, y, batch_size=16, verbose=0)
    return model


def test_a_variant_a_model_cannot_have_is_a_row_with_its_reason(tmp_path):
    keras.utils.set_random_seed(0)
    model = gpt.build_gpt(gpt.gpt_config("tiny", vocab_size=SPLITS.vocab.size, layers=1,
                                         heads=2, d_model=16, context=L))
    rows = lm_report.measure_lm_variants(model, TRAIN, VALIDATION, L, ["keras3_int4"],
                                         directory=str(tmp_path), unit="char", new_tokens=3,
                                         timing_rounds=1, max_windows=4, prompt_ids=PROMPT)
    assert [r["variant"] for r in rows] == ["float", "keras3_int4"]
    assert rows[1]["refused"].startswith("'gpt' is a tf_keras model and Keras 3's quantize")
    assert rows[0]["loss"] == pytest.approx(lm_report.keras_language_model_loss(
        model, VALIDATION, L, 4), abs=1e-6)
    assert rows[0]["bits_per_char"] == pytest.approx(rows[0]["loss"] / np.log(2))
    assert rows[0]["same_greedy_prefix"] == 3 and rows[0]["size_ratio"] == 1.0


def measure(model, names, tmp_path, **kwargs):
    settings = dict(directory=str(tmp_path), unit="char", finetune_steps=12, batch_size=8,
                    prompt_ids=PROMPT, new_tokens=6, timing_rounds=1, max_windows=40)
    return {r["variant"]: r for r in lm_report.measure_lm_variants(
        model, TRAIN, VALIDATION, L, names, **{**settings, **kwargs})}


def test_variant_names_parse_with_float_first_and_bad_ones_get_one_line():
    parsed = lm_variants.parse_lm_variants(["pruned_50_int8", "keras3_int4", "pruned_75"])
    assert [(v.name, v.base, v.sparsity) for v in parsed] == [
        ("float", "float", None), ("pruned_50_int8", "int8", 0.5),
        ("keras3_int4", "keras3_int4", None), ("pruned_75", "float", 0.75)]
    for bad in ("int5", "pruned_0", "pruned_100", "pruned_50_float", "pruned_50_bogus"):
        with pytest.raises(errors.ConfigError, match=f"variant '{bad}'") as caught:
            lm_variants.parse_lm_variant(bad)
        assert "\n" not in str(caught.value) and "pruned_<NN>" in str(caught.value)


@pytest.mark.slow
def test_keras_hub_gpt2_int8_int4_and_tflite_keep_the_loss_and_shrink(gpt2, tmp_path):
    before = [w.copy() for w in gpt2.get_weights()]
    rows = measure(gpt2, ["keras3_int8", "keras3_int4", "tflite_float", "tflite_dynamic"],
                   tmp_path)
    base = rows["float"]
    assert list(rows) == ["float", "keras3_int8", "keras3_int4", "tflite_float",
                          "tflite_dynamic"]
    assert base["loss"] < np.log(SPLITS.vocab.size) - 0.5  # trained: below a uniform guess
    assert base["perplexity"] == pytest.approx(np.exp(base["loss"]))
    assert [rows[v]["runtime"] for v in rows] == ["keras"] * 3 + ["tflite"] * 2
    assert abs(rows["tflite_float"]["loss"] - base["loss"]) < 1e-4
    for name in ("keras3_int8", "tflite_dynamic"):
        assert abs(rows[name]["loss"] - base["loss"]) < INT8_LOSS_TOLERANCE, name
    assert abs(rows["keras3_int4"]["loss"] - base["loss"]) < INT4_LOSS_TOLERANCE
    assert rows["keras3_int8"]["bytes"] < 0.5 * base["bytes"]
    assert rows["keras3_int4"]["bytes"] < rows["keras3_int8"]["bytes"]
    assert rows["tflite_dynamic"]["bytes"] < 0.7 * rows["tflite_float"]["bytes"]  # tiny: overhead
    assert base["decode"] == "kv cache" and rows["tflite_float"]["decode"] == "full window"
    assert base["same_greedy_prefix"] == 6
    assert rows["tflite_float"]["same_greedy_prefix"] == 6  # the same logits, greedy
    assert all(min(r["tokens_per_sec"], r["tokens_per_cpu_sec"], r["window_tokens_per_sec"]) > 0
               for r in rows.values())
    assert all(np.array_equal(a, b) for a, b in zip(before, gpt2.get_weights()))


@pytest.mark.slow
def test_pruning_a_keras_hub_gpt2_leaves_half_of_each_kernel_zero(gpt2):
    pruned, kernels = lm_report.pruned_copy(gpt2, 0.5, TRAIN, L, steps=9, batch_size=8)
    assert type(pruned).__name__ == "GPT2CausalLM" and pruned is not gpt2
    found = prunable.find_kernels(pruned)[0]
    assert {k.key for k in kernels} == {k.key for k in found}
    for k in found:  # counted from the stripped model's own weights
        values = np.asarray(k.variable.numpy())
        assert np.mean(values == 0) == pytest.approx(0.5, abs=1 / values.size + 1e-9), k.key
    assert lm_report.kernel_sparsity(kernels) == pytest.approx(0.5, abs=1e-3)
    assert not any(np.mean(np.asarray(k.variable.numpy()) == 0) > 0.01
                   for k in prunable.find_kernels(gpt2)[0])  # the original stays dense
    with pytest.raises(errors.ConfigError, match="at least 1 training step"):
        lm_report.pruned_copy(gpt2, 0.5, TRAIN, L, steps=0)


@pytest.mark.slow
def test_tf_keras_gpt_refuses_keras3_quantize_in_a_row_and_int8_means_tflite(tiny_gpt,
                                                                            tmp_path):
    rows = measure(tiny_gpt, ["keras3_int8", "tflite_dynamic", "pruned_50", "pruned_50_int8"],
                   tmp_path)
    refused = rows["keras3_int8"]
    assert set(refused) == {"variant", "description", "refused"}
    assert "tf_keras model" in refused["refused"] and "tflite_dynamic" in refused["refused"]
    assert "\n" not in refused["refused"]
    assert abs(rows["tflite_dynamic"]["loss"] - rows["float"]["loss"]) < INT8_LOSS_TOLERANCE
    assert rows["tflite_dynamic"]["bytes"] < 0.6 * rows["float"]["bytes"]  # file overhead: tiny
    for name in ("pruned_50", "pruned_50_int8"):
        assert rows[name]["pruned_sparsity"] == pytest.approx(0.5, abs=1e-3)
    assert rows["pruned_50"]["runtime"] == "keras"
    assert rows["pruned_50_int8"]["runtime"] == "tflite"  # tf_keras's int8: dynamic range
    assert rows["pruned_50"]["gzip_bytes"] < rows["float"]["gzip_bytes"]  # zeros compress
    assert abs(rows["pruned_50_int8"]["loss"] - rows["pruned_50"]["loss"]) < INT8_LOSS_TOLERANCE


@pytest.mark.slow
def test_the_report_files_hold_the_table_and_plots(tiny_gpt, tmp_path):
    rows = list(measure(tiny_gpt, ["keras3_int8", "tflite_dynamic"], tmp_path).values())
    paths = lm_report.write_lm_report(str(tmp_path / "out"), str(tmp_path / "logs"), rows,
                                      {"model": "gpt", "steps": 40}, title="tiny")
    saved = json.loads(open(paths["json"]).read())
    assert [r["variant"] for r in saved["variants"]] == ["float", "keras3_int8", "tflite_dynamic"]
    assert saved["model"] == "gpt"
    markdown = open(paths["markdown"]).read()
    assert "| float | keras |" in markdown and "bits_per_char" in markdown
    assert "Keras 3's quantize takes Keras 3 models only" in markdown
    for key in ("png", "speed_png"):
        assert open(paths[key], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    table = summaries.read_text_summaries(str(tmp_path / "logs"))["report/table"]
    assert table.startswith("# tiny")
    assert set(summaries.read_image_tags(str(tmp_path / "logs"))) == {
        "report/loss_vs_size", "report/tokens_per_sec"}


@pytest.mark.slow
def test_a_trained_keras_hub_folder_loads_in_keras3_with_its_vocabulary(gpt2, tmp_path):
    gpt2.save(str(tmp_path / generate.MODEL_FILE))
    SPLITS.vocab.save(str(tmp_path / generate.VOCABULARY_FILE))
    model, vocab = lm_report.load_causal_lm(str(tmp_path))
    assert type(model).__name__ == "GPT2CausalLM" and vocab.size == SPLITS.vocab.size
    x = VALIDATION[None, :L]
    assert lm_report.keras_language_model_loss(model, VALIDATION, L, 10) == pytest.approx(
        lm_report.keras_language_model_loss(gpt2, VALIDATION, L, 10), abs=1e-6)
    assert np.asarray(model.predict({"token_ids": x, "padding_mask": np.ones_like(x, bool)},
                                    verbose=0)).shape == (1, L, SPLITS.vocab.size)
    with pytest.raises(errors.ModelError, match="holds no trained language model"):
        lm_report.load_causal_lm(str(tmp_path / "missing"))
