"""tfaccel.models: the zoo fits any shape, user models load, mismatches are caught."""

import sys
import textwrap

import numpy as np
import pytest

import tfaccel
from tfaccel import models
from tfaccel.keras import keras


@pytest.mark.parametrize("name", models.MODELS)
@pytest.mark.parametrize("shape,classes", [((8, 8, 1), 10), ((32, 32, 3), 3)])
def test_zoo_models_fit_shape_and_classes(name, shape, classes):
    model = models.build_model(name, shape, classes)
    out = model(np.zeros((2, *shape), np.float32), training=False).numpy()
    assert out.shape == (2, classes)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, rtol=1e-5)
    # Flat functional models: TF-MOT refuses nested ones.
    assert not any(isinstance(layer, keras.Model) for layer in model.layers)


def test_mlp_takes_vectors():
    model = models.build_model("mlp", (20,), 4)
    assert model.output_shape == (None, 4)


def test_outputs_stay_float32_under_mixed_precision():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = models.build_model("cnn", (8, 8, 1), 10)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert model.layers[1].compute_dtype == "float16"
    assert model.output.dtype == "float32"


def test_unknown_model_names_the_choices():
    with pytest.raises(tfaccel.ModelError, match=r"unknown model 'vgg'.*mlp, cnn, resnet, mobilenet_v2"):
        models.build_model("vgg", (8, 8, 1), 10)


def test_saved_model_round_trip_and_shape_checks(tmp_path):
    model = models.build_model("mlp", (8, 8, 1), 10)
    path = str(tmp_path / "m.keras")
    model.save(path)
    loaded = models.resolve_model(path, (8, 8, 1), 10)
    x = np.random.default_rng(0).random((3, 8, 8, 1)).astype(np.float32)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-6)
    with pytest.raises(tfaccel.ModelError, match="takes inputs of shape"):
        models.resolve_model(path, (16, 16, 1), 10)
    with pytest.raises(tfaccel.ModelError, match="outputs 10 classes but the dataset has 3"):
        models.resolve_model(path, (8, 8, 1), 3)


def test_missing_or_bad_model_file(tmp_path):
    with pytest.raises(tfaccel.ModelError, match="does not exist"):
        models.resolve_model(str(tmp_path / "nope.keras"), (8, 8, 1), 10)
    bad = tmp_path / "bad.keras"
    bad.write_text("not a model")
    with pytest.raises(tfaccel.ModelError, match="cannot load model"):
        models.resolve_model(str(bad), (8, 8, 1), 10)


def test_model_fn(tmp_path, monkeypatch):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        from tfaccel.keras import keras

        def tiny(input_shape, num_classes):
            inputs = keras.Input(input_shape)
            x = keras.layers.Flatten()(inputs)
            return keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(x))

        def not_a_model(input_shape, num_classes):
            return 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    model = models.resolve_model("cnn", (8, 8, 1), 10, model_fn="my_models:tiny")
    assert model.output_shape == (None, 10)
    with pytest.raises(tfaccel.ModelError, match="returned int, not a Keras model"):
        models.resolve_model("cnn", (8, 8, 1), 10, model_fn="my_models:not_a_model")
    with pytest.raises(tfaccel.ModelError, match="has no function 'missing'"):
        models.resolve_model("cnn", (8, 8, 1), 10, model_fn="my_models:missing")
    with pytest.raises(tfaccel.ModelError, match="cannot import 'no_such_pkg.mod'"):
        models.resolve_model("cnn", (8, 8, 1), 10, model_fn="no_such_pkg.mod:fn")
    sys.modules.pop("my_models", None)
