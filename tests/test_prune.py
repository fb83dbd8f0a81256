"""compress.prune and compress.sparsity: pruning under strategy x precision, 2:4, blocks,
nested models, resume, reloading a pruned model, and the sparsity measured in the weights."""

import os

import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored_strategy
from test_pruning_plan import small_cnn

from tfaccel import summaries
from tfaccel.compress import prune, pruning_plan, sparsity
from tfaccel.compress.pruning_plan import PruneConfig
from tfaccel.errors import ConfigError, ModelError
from tfaccel.keras import keras
from tfaccel.train.models import load_model_file
from tfaccel.train.training import compile_classifier, make_optimizer

BATCH, STEPS = 32, 5


def train_data():
    rng = np.random.default_rng(0)
    x = rng.random((BATCH * STEPS, 8, 8, 1), dtype=np.float32)
    y = (x.reshape(len(x), -1).mean(1) * 10).astype(np.int64) % 10
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)


@pytest.fixture
def policy():
    """Restores the global float32 policy after a test that changes it."""
    yield
    keras.mixed_precision.set_global_policy("float32")


def fit_pruned(model, target, epochs, config=None, strategy=None, **kwargs):
    config = config or PruneConfig(min_weights=100)
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        pruned, callbacks = prune.prune_to_sparsity(model, target, epochs, STEPS, config, **kwargs)
        compile_classifier(pruned, make_optimizer("adam", 1e-3))
    pruned.fit(train_data(), epochs=epochs, callbacks=callbacks, verbose=0)
    return pruned, callbacks


# ---------------------------------------------------------------- measuring


def test_m_by_n_violations_counts_groups_along_input_channels():
    kernel = np.ones((8, 2), np.float32)  # Dense: 8 inputs -> groups of 4 along axis 0
    kernel[[0, 1, 4, 5], 0] = 0
    kernel[[0, 2, 4, 6], 1] = 0
    assert sparsity.m_by_n_violations(kernel, (2, 4)) == (4, 0)
    kernel[5, 0] = 3.0
    assert sparsity.m_by_n_violations(kernel, (2, 4)) == (4, 1)


# ---------------------------------------------------------------- training: strategy x precision


@pytest.mark.parametrize("strategy_name",
                         ["default", pytest.param("mirrored", marks=pytest.mark.slow)])
@pytest.mark.parametrize("precision", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_pruning_reaches_target(strategy_name, precision, policy, tmp_path):
    keras.mixed_precision.set_global_policy(precision)
    strategy = (mirrored_strategy() if strategy_name == "mirrored"
                else tf.distribute.get_strategy())
    with strategy.scope():
        model = small_cnn()
    epochs = 2
    pruned, _ = fit_pruned(model, 0.75, epochs, strategy=strategy, logdir=str(tmp_path / "logs"))
    assert pruning_plan.pruning_step(pruned) == epochs * STEPS
    stripped = prune.strip_pruning(pruned)
    report = sparsity.sparsity_report(stripped, ["conv_1", "dense"])
    assert abs(report["pruned"]["sparsity"] - 0.75) < 0.01
    assert {r["layer"]: r["sparsity"] for r in report["layers"]}["conv_0"] == 0.0
    if precision != "float32":
        assert (prune.strip_pruning(pruned, float32=True).get_layer("dense").compute_dtype
                == "float32")
    scalars = summaries.read_scalars(tmp_path / "logs")
    assert [step for step, _ in scalars["sparsity/dense"]] == list(range(epochs))
    assert scalars["sparsity/target"][-1][1] == pytest.approx(0.75)
    assert scalars["sparsity/dense"][-1][1] == pytest.approx(0.75, abs=0.01)


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
def test_masking_keeps_float32_master_weights(precision, policy):
    # TF-MOT masks the half-precision copy and writes it back: with a zero learning rate
    # the kept weights would come back rounded to float16/bfloat16.
    keras.mixed_precision.set_global_policy(precision)
    model = small_cnn()
    pruned, callbacks = prune.prune_to_sparsity(model, 0.5, 1, STEPS,
                                                PruneConfig(min_weights=100))
    compile_classifier(pruned, keras.optimizers.SGD(0.0))
    pruned.fit(train_data(), epochs=1, callbacks=callbacks, verbose=0)
    before = model.get_layer("dense").kernel.numpy()
    after = pruned.get_layer("prune_low_magnitude_dense").get_weights()[0]
    kept = after != 0
    assert 0.45 < 1 - kept.mean() < 0.55
    np.testing.assert_array_equal(after[kept], before[kept])


def test_two_four_pattern_holds_in_the_saved_weights(tmp_path):
    model = small_cnn()
    config = PruneConfig(m_by_n=(2, 4), min_weights=100)
    pruned, _ = fit_pruned(model, 0.5, 1, config)
    sizes = sparsity.model_sizes(prune.strip_pruning(pruned), str(tmp_path), tflite=False)
    saved = keras.models.load_model(sizes["h5"]["path"], compile=False)
    checks = sparsity.check_m_by_n(saved, (2, 4), ["conv_1", "dense", "logits"])
    assert set(checks) == {"conv_1", "dense", "logits"}
    assert all(c["ok"] and c["groups"] > 0 for c in checks.values())
    assert sparsity.sparsity_report(saved, ["conv_1", "dense"])["pruned"]["sparsity"] >= 0.5


def test_block_sparsity_zeroes_whole_blocks_of_dense_kernels_and_convs_element_wise():
    config = PruneConfig(block_size=(1, 4), min_weights=100)
    plan = pruning_plan.plan_pruning(small_cnn(), config)
    assert plan.pruned == ("conv_1", "dense", "logits")
    assert plan.element_wise == ("conv_1",)
    pruned, _ = fit_pruned(small_cnn(), 0.5, 1, config)
    stripped = prune.strip_pruning(pruned)
    kernel = stripped.get_layer("dense").kernel.numpy()
    blocks = (kernel.reshape(kernel.shape[0], -1, 4) == 0).sum(-1)
    assert set(np.unique(blocks)) == {0, 4}  # a block is all zeros or has none
    assert (blocks == 4).mean() == pytest.approx(0.5, abs=0.01)
    conv = stripped.get_layer("conv_1").kernel.numpy()
    assert np.mean(conv == 0) == pytest.approx(0.5, abs=0.01)
    blocks = (conv.reshape(-1, 4) == 0).sum(-1)
    assert len(set(np.unique(blocks))) > 2  # element-wise: blocks of 4 partly zero too


def test_report_of_a_stripped_model_marks_only_the_pruned_layers(tmp_path):
    plan = pruning_plan.plan_pruning(small_cnn())
    assert plan.pruned == ("dense",)
    pruned, _ = fit_pruned(small_cnn(), 0.75, 1, PruneConfig())
    stripped = prune.strip_pruning(pruned)
    path = str(tmp_path / "stripped.h5")
    sparsity.save_without_optimizer(stripped, path)
    for model in (stripped, load_model_file(path)):
        report = sparsity.sparsity_report(model)
        assert {r["layer"] for r in report["layers"] if r["pruned"]} == {"dense"}
        assert {r["layer"]: r["zeros"] for r in report["layers"]}["conv_0"] == 0
        assert report["pruned"] == sparsity.sparsity_report(model, plan.pruned)["pruned"]
        assert report["pruned"]["sparsity"] == pytest.approx(0.75, abs=1e-3)
        assert report["all_kernels"]["sparsity"] < report["pruned"]["sparsity"]


def test_a_keras_file_saved_without_optimizer_holds_the_weights_only(tmp_path):
    import json
    import zipfile

    model = small_cnn()
    compile_classifier(model, make_optimizer("adam", 1e-3))
    model.optimizer.build(model.trainable_variables)  # optimizer state that .keras would keep
    path = sparsity.save_without_optimizer(model, str(tmp_path / "m.keras"))
    with zipfile.ZipFile(path) as archive:
        assert "compile_config" not in json.loads(archive.read("config.json"))
    for a, b in zip(load_model_file(path).get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_nested_models_are_pruned_inside_and_stripped_back():
    from user_models import functional_resnet

    model = functional_resnet((8, 8, 1), 10)
    plan = pruning_plan.plan_pruning(model)
    assert {"res1_a_conv", "res2_a_conv", "res2_b_conv"} <= set(plan.pruned)
    pruned, _ = fit_pruned(model, 0.75, 1, PruneConfig())
    inner = pruned.get_layer("res2")
    assert any(hasattr(layer, "pruning_vars") for layer in inner.layers)
    stripped = prune.strip_pruning(pruned)
    assert isinstance(stripped.get_layer("res2"), keras.Model)
    report = sparsity.sparsity_report(stripped)
    assert {r["layer"] for r in report["layers"] if r["pruned"]} == set(plan.pruned)
    assert report["pruned"]["sparsity"] == pytest.approx(0.75, abs=1e-3)


def test_resume_after_interruption_keeps_the_pruning_step(tmp_path):
    base = small_cnn()
    backup = str(tmp_path / "backup")

    class Crash(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 2 * STEPS + 2:
                raise RuntimeError("crash")

    epochs = 4
    with pytest.raises(RuntimeError, match="crash"):
        with tf.distribute.get_strategy().scope():
            pruned, callbacks = prune.prune_to_sparsity(
                base, 0.75, epochs, STEPS, PruneConfig(min_weights=100), backup_dir=backup,
                logdir=str(tmp_path / "logs"))
            compile_classifier(pruned, make_optimizer("adam", 1e-3))
        pruned.fit(train_data(), epochs=epochs, callbacks=[*callbacks, Crash()], verbose=0)
    assert os.listdir(backup)
    resumed, callbacks = fit_pruned(base, 0.75, epochs, backup_dir=backup,
                                    logdir=str(tmp_path / "logs2"))
    assert callbacks[-1].start_step == 2 * STEPS  # the epoch-2 backup, not a fresh 0
    assert callbacks[1].resumed_at == (3, 0)
    assert pruning_plan.pruning_step(resumed) == epochs * STEPS
    report = sparsity.sparsity_report(prune.strip_pruning(resumed))
    assert abs(report["pruned"]["sparsity"] - 0.75) < 0.01


def test_models_loaded_from_keras_and_saved_model_can_be_pruned(tmp_path):
    model = small_cnn()
    keras_path, saved_path = str(tmp_path / "m.keras"), str(tmp_path / "saved")
    model.save(keras_path)
    model.save(saved_path, save_format="tf")
    for path in (keras_path, saved_path):
        loaded = load_model_file(path)
        pruned, _ = prune.prune_to_sparsity(loaded, 0.5, 2, STEPS,
                                            PruneConfig(min_weights=100))
        wrapped = [layer.layer.name for layer in pruned.layers if hasattr(layer, "pruning_vars")]
        assert wrapped == ["conv_1", "dense", "logits"]
        np.testing.assert_array_equal(pruned.get_layer("prune_low_magnitude_dense").get_weights()[0],
                                      model.get_layer("dense").kernel.numpy())


@pytest.mark.parametrize("name", ["logdir", "log_dir"])
def test_sparsity_goes_to_logdir_under_either_name(name, tmp_path):
    fit_pruned(small_cnn(), 0.5, 1, **{name: str(tmp_path / "logs")})
    scalars = summaries.read_scalars(tmp_path / "logs")
    assert [step for step, _ in scalars["sparsity/pruned_layers"]] == [0]
    assert scalars["sparsity/pruned_layers"][0][1] == pytest.approx(0.5, abs=0.01)


def test_logdir_and_its_former_name_together_are_one_clear_line(tmp_path):
    with pytest.raises(ConfigError, match="logdir='a' and log_dir='b' both given") as info:
        prune.prune_to_sparsity(small_cnn(), 0.5, 1, STEPS, PruneConfig(min_weights=100),
                                logdir="a", log_dir="b")
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- a pruned model saved and loaded


def _saved_mid_run(path, epochs):
    """A model pruned for `epochs`, trained for half of them, then saved with its wrappers."""
    pruned, callbacks = prune.prune_to_sparsity(small_cnn(), 0.75, epochs, STEPS,
                                                PruneConfig(min_weights=100))
    compile_classifier(pruned, make_optimizer("adam", 1e-3))
    pruned.fit(train_data(), epochs=epochs // 2, callbacks=callbacks, verbose=0)
    pruned.save(path)
    return pruned


def _kernels(model):
    """{wrapper name: (kernel, mask)} of each pruning wrapper, as arrays."""
    return {w.name: tuple(v.numpy() for v in w.pruning_vars[0][:2])
            for w in pruning_plan.pruning_wrappers(model)}


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_a_model_saved_mid_pruning_loads_back_with_its_wrappers_and_keeps_pruning(suffix,
                                                                                  tmp_path):
    epochs = 4
    path = str(tmp_path / f"mid_run{suffix}")
    pruned = _saved_mid_run(path, epochs)
    loaded = prune.load_pruned_model(path)
    assert list(_kernels(loaded)) == list(_kernels(pruned)) == [
        "prune_low_magnitude_conv_1", "prune_low_magnitude_dense", "prune_low_magnitude_logits"]
    assert len(loaded.weights) == len(pruned.weights)
    for mine, theirs in zip(loaded.weights, pruned.weights):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    assert pruning_plan.pruning_step(loaded) == epochs // 2 * STEPS
    halfway = _kernels(loaded)
    assert 0 < sparsity.sparsity_report(loaded)["pruned"]["sparsity"] < 0.75

    compile_classifier(loaded, make_optimizer("adam", 1e-3))
    loaded.fit(train_data(), initial_epoch=epochs // 2, epochs=epochs, verbose=0,
               callbacks=[pruning_plan.tfmot().sparsity.keras.UpdatePruningStep()])
    assert pruning_plan.pruning_step(loaded) == epochs * STEPS
    for name, (kernel, mask) in _kernels(loaded).items():
        assert not np.any(kernel[mask == 0])  # pruned weights are zero
        assert not np.any(mask[halfway[name][1] == 0])  # once pruned, stays pruned
        kept = mask != 0
        assert not np.array_equal(kernel[kept], halfway[name][0][kept])  # and it trained
    report = sparsity.sparsity_report(prune.strip_pruning(loaded))
    assert report["pruned"]["sparsity"] == pytest.approx(0.75, abs=0.01)


def test_a_reloaded_mixed_precision_model_masks_its_float32_weights(policy, tmp_path):
    # As test_masking_keeps_float32_master_weights, on the wrappers rebuilt from a file.
    keras.mixed_precision.set_global_policy("mixed_float16")
    path = str(tmp_path / "mid_run.keras")
    _saved_mid_run(path, 4)
    loaded = prune.load_pruned_model(path)
    before = _kernels(loaded)
    compile_classifier(loaded, keras.optimizers.SGD(0.0))
    loaded.fit(train_data(), initial_epoch=2, epochs=4, verbose=0,
               callbacks=[pruning_plan.tfmot().sparsity.keras.UpdatePruningStep()])
    for name, (kernel, mask) in _kernels(loaded).items():
        kept = mask != 0
        assert kept.mean() < before[name][1].mean()  # the masks moved on towards the target
        np.testing.assert_array_equal(kernel[kept], before[name][0][kept])


def test_loading_a_model_without_wrappers_as_pruned_is_one_clear_line(tmp_path):
    path = str(tmp_path / "plain.keras")
    small_cnn().save(path)
    with pytest.raises(ModelError, match="plain.keras' holds no pruning wrappers: load it with "
                                         "load_model_file"):
        prune.load_pruned_model(path)
