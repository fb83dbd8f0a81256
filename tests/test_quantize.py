"""tfaccel.compress.quantize: the layer check, flattening, QAT under strategies and precisions,
prune-preserve."""

import logging

import numpy as np
import pytest
import tensorflow as tf
from conftest import mirrored_strategy

from tfaccel import data, errors
from tfaccel.compress import quantize, tflite, tflite_eval
from tfaccel.keras import keras
from tfaccel.train import models, training


@pytest.fixture(scope="module")
def digits():
    splits = data.load_dataset("digits")
    train = data.batch_dataset(splits.train, 64, training=True, seed=0)
    x, y = (np.concatenate(a) for a in zip(*data.batch_dataset(
        splits.test, 512, training=False).as_numpy_iterator()))
    return splits, train, x, y


@pytest.fixture(autouse=True)
def float32_policy():
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.fixture(scope="module")
def trained_weights(digits):
    """Weights of a digits CNN trained in float32, reused by the strategy x precision cases."""
    splits, train, *_ = digits
    keras.utils.set_random_seed(0)
    model = models.build_model("cnn", splits.info.input_shape, splits.info.num_classes)
    training.compile_classifier(model, training.make_optimizer("adam", 2e-3))
    model.fit(train, epochs=4, verbose=0)
    return model.get_weights()


def lambda_lstm_model():
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Lambda(lambda t: t * 2.0, name="double")(inputs)
    x = keras.layers.Reshape((8, 8), name="rows")(x)
    x = keras.layers.LSTM(4, name="rnn")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(x)
    return keras.Model(inputs, outputs)


def nested_model():
    inner = keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Conv2D(8, 3, name="inner_conv"),
                              keras.layers.Flatten(name="inner_flat")], name="features")
    inputs = keras.Input((8, 8, 1))
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(inner(inputs))
    return keras.Model(inputs, outputs, name="outer")


def test_unsupported_layers_are_all_listed_with_the_ways_out():
    model = lambda_lstm_model()
    assert quantize.unsupported_layers(model) == [("double", "Lambda"), ("rnn", "LSTM")]
    with pytest.raises(errors.UnsupportedLayerError) as info:
        quantize.quantize_aware(model)
    message = str(info.value)
    assert "\n" not in message
    for part in ("double (Lambda)", "rnn (LSTM)", "skip_layers", "only_layers",
                 "--qat_skip_layers=double,rnn"):
        assert part in message


def test_skipping_the_unsupported_layers_quantizes_the_rest():
    qat = quantize.quantize_aware(lambda_lstm_model(), skip_layers=["double", "rnn"])
    wrapped = {layer.layer.name for layer in qat.layers if hasattr(layer, "quantize_config")}
    assert "head" in wrapped and not wrapped & {"double", "rnn"}
    assert qat.predict(np.zeros((2, 8, 8, 1), np.float32), verbose=0).shape == (2, 10)


def test_bad_arguments():
    model = models.build_model("cnn", (8, 8, 1), 10)
    with pytest.raises(errors.ConfigError, match="skip_layers names unknown layers nope"):
        quantize.quantize_aware(model, skip_layers=["nope"])
    with pytest.raises(errors.ConfigError, match="unknown QAT scheme 'fancy'"):
        quantize.quantize_aware(model, scheme="fancy")

    class Subclassed(keras.Model):
        def call(self, x):
            return x

    with pytest.raises(errors.UnsupportedLayerError, match="subclassed"):
        quantize.check_quantizable(Subclassed())


def test_pruning_wrappers_must_be_stripped_first():
    import tensorflow_model_optimization as tfmot

    pruned = tfmot.sparsity.keras.prune_low_magnitude(models.build_model("mlp", (8, 8, 1), 10))
    with pytest.raises(errors.ModelError, match="strip_pruning"):
        quantize.quantize_aware(pruned)


def test_nested_model_is_flattened_with_the_same_outputs():
    model = nested_model()
    assert quantize.is_nested(model)
    x = np.random.default_rng(0).random((4, 8, 8, 1), dtype=np.float32)
    flat = quantize.flatten_model(model)
    assert not quantize.is_nested(flat)
    assert [layer.name for layer in flat.layers][1:] == ["inner_conv", "inner_flat", "head"]
    np.testing.assert_allclose(flat.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    qat = quantize.quantize_aware(model)
    assert not quantize.is_nested(qat)
    assert {"quant_inner_conv", "quant_head"} <= {layer.name for layer in qat.layers}


def _distribution(name):
    if name == "mirrored":
        return mirrored_strategy()
    return tf.distribute.get_strategy()


@pytest.mark.parametrize("strategy_name,policy", [
    ("default", "mixed_float16"), ("mirrored", "float32"),
    pytest.param("default", "float32", marks=pytest.mark.slow),  # also run by the recipe test
    pytest.param("mirrored", "mixed_float16", marks=pytest.mark.slow)])
def test_qat_trains_and_converts(digits, trained_weights, strategy_name, policy, caplog,
                                 tmp_path):
    splits, train, x, y = digits
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy(policy)
    strategy = _distribution(strategy_name)
    with strategy.scope():
        model = models.build_model("cnn", splits.info.input_shape, splits.info.num_classes)
        model.set_weights(trained_weights)
    assert (model.get_layer("dense").compute_dtype == "float16") == (policy == "mixed_float16")
    with caplog.at_level(logging.WARNING), strategy.scope():
        qat = quantize.quantize_aware(model)
        training.compile_classifier(qat, training.make_optimizer("adam", 2e-4))
    said_float32 = any("QAT fine-tunes" in r.getMessage() and "float32" in r.getMessage()
                       for r in caplog.records)
    assert said_float32 == (policy == "mixed_float16")
    assert {layer.dtype_policy.compute_dtype for layer in qat.layers} == {"float32"}
    assert keras.mixed_precision.global_policy().name == policy  # restored after the build
    assert tflite.is_quantization_aware(qat)
    qat.fit(train.take(10), epochs=1, verbose=0)
    qat_pred = qat.predict(x, verbose=0).argmax(-1)
    assert np.mean(qat_pred == y) > 0.85
    path = tflite.convert_to_tflite(qat, str(tmp_path / "qat.tflite"), mode="int8")
    result = tflite_eval.evaluate_tflite(path, (x, y), progress=False)
    assert tflite_eval.make_interpreter(path).get_input_details()[0]["dtype"] == np.int8
    assert tflite_eval.prediction_agreement(result["predictions"], qat_pred) >= 0.98


@pytest.mark.slow
@pytest.mark.parametrize("scheme,keeps_zeros", [("prune_preserve", True), ("default", False)])
def test_prune_preserving_qat_keeps_zeros(digits, trained_weights, scheme, keeps_zeros):
    splits, train, *_ = digits
    keras.utils.set_random_seed(0)
    model = models.build_model("cnn", splits.info.input_shape, splits.info.num_classes)
    model.set_weights(trained_weights)
    kernel = model.get_layer("dense").kernel
    values = kernel.numpy()
    values[np.abs(values) < np.quantile(np.abs(values), 0.8)] = 0.0
    kernel.assign(values)
    qat = quantize.quantize_aware(model, scheme=scheme)
    training.compile_classifier(qat, training.make_optimizer("adam", 1e-3))
    qat.fit(train, epochs=1, verbose=0)
    kernel = next(w for w in qat.get_layer("quant_dense").weights if w.name.endswith("kernel:0"))
    sparsity = float(np.mean(kernel.numpy() == 0))
    if keeps_zeros:
        assert sparsity >= 0.79
    else:
        assert sparsity < 0.5


@pytest.mark.slow
def test_batchnorm_is_folded_into_the_convolutions(tmp_path):
    model = models.build_model("resnet", (8, 8, 1), 10, widths=(8, 16), blocks_per_stage=1)
    assert quantize.unsupported_layers(model) == []
    qat = quantize.quantize_aware(model)
    x = np.random.default_rng(0).random((32, 8, 8, 1), dtype=np.float32)
    for _ in range(3):  # set the quantizer ranges (training mode) without fitting
        qat(x, training=True)
    path = tflite.convert_to_tflite(qat, str(tmp_path / "resnet.tflite"), mode="int8")
    interpreter = tflite_eval.make_interpreter(path)
    ops = [op["op_name"] for op in interpreter._get_ops_details()]
    assert ops.count("CONV_2D") == 6 and "MUL" not in ops
    weights = [d for d in interpreter.get_tensor_details()
               if len(d["shape"]) == 4 and "Conv2D" in d["name"]]
    assert weights and all(d["dtype"] == np.int8 for d in weights)


# ---------------------------------------------------------------- prune -> strip -> QAT (#11)


def _pruned_and_stripped(model):
    from tfaccel.compress import prune

    pruned, _ = prune.prune_to_sparsity(model, 0.8, 2, 5)
    for layer in pruned.layers:  # masks as after fine-tuning, without the training time
        for weight, mask, _ in getattr(layer, "pruning_vars", ()):
            values = weight.numpy()
            keep = np.abs(values) >= np.quantile(np.abs(values), 0.8)
            mask.assign(keep.astype(mask.dtype.as_numpy_dtype))
    return prune.strip_pruning(pruned)


@pytest.mark.parametrize("name", ["resnet", "functional_resnet",
                                  pytest.param("mobilenet_v2", marks=pytest.mark.slow)])
def test_prune_strip_then_prune_preserving_qat_on_batchnorm_models(name):
    # TF-MOT's strip_pruning returns the pruned model's own layer objects, so each BatchNorm
    # is also called after a pruning wrapper in the pruned model: only the stripped model's
    # own calls may decide whether it folds into the convolution before it.
    from user_models import functional_resnet

    model = (functional_resnet((8, 8, 1), 10) if name == "functional_resnet"
             else models.build_model(name, (8, 8, 1), 10))
    stripped = _pruned_and_stripped(model)
    assert any(type(layer).__name__ == "BatchNormalization" for layer in
               quantize.flatten_model(stripped).layers)
    assert quantize.unsupported_layers(quantize.flatten_model(stripped)) == []
    qat = quantize.quantize_aware(stripped, scheme="prune_preserve")
    assert not quantize.is_nested(qat)
    kernels = {layer.layer.name: w.numpy() for layer in qat.layers if hasattr(layer, "layer")
               for w in layer.weights if w.name.endswith("kernel:0")}
    pruned = [k for k in kernels.values() if np.mean(k == 0) > 0.01]  # a random init has ~0
    assert pruned and all(np.mean(k == 0) >= 0.79 for k in pruned)


def test_batchnorm_folds_only_after_a_convolution_or_dense():
    inputs = keras.Input((8, 8, 1))
    conv = keras.layers.Conv2D(4, 3, name="conv")(inputs)
    folded = keras.layers.BatchNormalization(name="folded")(conv)
    loose = keras.layers.BatchNormalization(name="loose")(keras.layers.ReLU(name="relu")(folded))
    flat = keras.layers.Reshape((144,), name="flat")(loose)
    after_reshape = keras.layers.BatchNormalization(name="after_reshape")(flat)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(after_reshape)
    model = keras.Model(inputs, outputs)
    assert quantize.unsupported_layers(model) == [("loose", "BatchNormalization"),
                                                  ("after_reshape", "BatchNormalization")]
    with pytest.raises(errors.UnsupportedLayerError, match="folded into the Conv2D"):
        quantize.check_quantizable(model)


def test_a_layer_used_in_two_models_is_judged_in_each():
    conv = keras.layers.Conv2D(4, 3, name="conv")
    norm = keras.layers.BatchNormalization(name="norm")
    a_in = keras.Input((8, 8, 1))
    after_conv = keras.Model(a_in, norm(conv(a_in)))
    b_in = keras.Input((6, 6, 4))
    alone = keras.Model(b_in, norm(b_in))
    assert quantize.unsupported_layers(after_conv) == []
    assert quantize.unsupported_layers(alone) == [("norm", "BatchNormalization")]


def test_resizing_keeps_its_input_scale_in_qat(tmp_path):
    # The zoo's mobilenet_v2 upsamples 8x8 digits with a Resizing layer, which TF-MOT's
    # registry lacks.
    assert quantize.unsupported_layers(models.build_model("mobilenet_v2", (8, 8, 1), 10)) == []
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Resizing(16, 16, name="upsample")(inputs)
    x = keras.layers.Conv2D(4, 3, activation="relu", name="conv")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(x)
    qat = quantize.quantize_aware(keras.Model(inputs, outputs))
    assert qat.get_layer("quant_upsample").quantize_config.get_output_quantizers(None) == []
    x = np.random.default_rng(0).random((64, 8, 8, 1), dtype=np.float32)
    for _ in range(3):
        qat(x, training=True)
    path = tflite.convert_to_tflite(qat, str(tmp_path / "resize.tflite"), mode="int8")
    ops = [op["op_name"] for op in tflite_eval.make_interpreter(path)._get_ops_details()]
    assert "RESIZE_BILINEAR" in ops and "DEQUANTIZE" not in ops
    agreement = tflite_eval.prediction_agreement(tflite_eval.predict_tflite(path, x),
                                                 qat.predict(x, verbose=0))
    assert agreement >= 0.9


def test_check_quantize_aware_sees_what_pruning_and_qat_will_build():
    from tfaccel.compress.pruning_plan import PruneConfig

    model = models.build_model("resnet", (8, 8, 1), 10, widths=(8, 16), blocks_per_stage=1)
    before = [w.copy() for w in model.get_weights()]
    quantize.check_quantize_aware(model, "prune_preserve", prune_configs=[
        PruneConfig(block_size=(16, 1), min_weights=100),
        PruneConfig(schedule="constant", begin_epoch=3, min_weights=100)])
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    inputs = keras.Input((8, 8, 1))
    x = keras.layers.Reshape((64,), name="flat")(inputs)
    x = keras.layers.BatchNormalization(name="norm")(x)
    outputs = keras.layers.Dense(10, activation="softmax", name="head")(x)
    with pytest.raises(errors.UnsupportedLayerError, match="norm"):
        quantize.check_quantize_aware(keras.Model(inputs, outputs), "prune_preserve",
                                      prune_configs=[PruneConfig(min_weights=10)])
