"""tfaccel.keras: one Keras driven, the flavour of any Keras object, Keras 3 loaded lazily, and
a clear error for Keras 3 objects where tf_keras is needed."""

import os
import re

import keras as keras3
import numpy as np
import pytest

import tfaccel
from tfaccel.errors import ConfigError, ModelError
from tfaccel.keras import (
    check_flavour,
    clone_with_weights,
    ensure_tf_keras,
    flavour_of,
    is_keras3_object,
    keras,
    keras3 as keras3_accessor,
    keras_for,
    saved_flavour,
    set_global_policy,
)

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tfaccel")


def _keras3_model():
    return keras3.Sequential([keras3.Input((4,)), keras3.layers.Dense(2)], name="k3")


def test_tf_keras_model_passes():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    assert ensure_tf_keras(model) is model
    assert not is_keras3_object(model)


@pytest.mark.parametrize("make", [_keras3_model, lambda: keras3.layers.Dense(3)],
                         ids=["model", "layer"])
def test_keras3_object_is_rejected_with_both_ways_out(make):
    obj = make()
    assert is_keras3_object(obj)
    with pytest.raises(tfaccel.WrongKerasError) as err:
        ensure_tf_keras(obj)
    message = str(err.value)
    assert "\n" not in message
    assert "Keras 3" in message and "tf_keras" in message
    assert "TF_USE_LEGACY_KERAS=1" in message


def test_flavour_of_each_keras_object():
    assert flavour_of(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])) == "tf_keras"
    assert flavour_of(keras.optimizers.Adam()) == "tf_keras"
    assert flavour_of(_keras3_model()) == "keras3"
    assert flavour_of(keras3.optimizers.SGD()) == "keras3"

    class Mine(keras3.layers.Dense):  # a user's subclass belongs to the Keras it extends
        pass

    assert flavour_of(Mine(2)) == "keras3"
    with pytest.raises(ModelError, match="neither tf_keras nor Keras 3"):
        flavour_of(object())


def test_keras3_accessor_is_keras_3():
    module = keras3_accessor()
    assert module is keras3 and module.__version__.startswith("3.")
    assert module is not keras


def test_ensure_tf_keras_names_the_bridge_for_a_model():
    with pytest.raises(tfaccel.WrongKerasError, match=r"bridge\.to_tf_keras\(model\)"):
        ensure_tf_keras(_keras3_model())


def test_helpers_serve_keras3_models_and_name_a_mixed_up_optimizer():
    model = _keras3_model()
    with pytest.raises(tfaccel.ConfigError, match="optimizer is a tf_keras one"):
        tfaccel.compile_classifier(model, tfaccel.make_optimizer("sgd", 0.1))
    tfaccel.compile_classifier(model, tfaccel.make_optimizer("sgd", 0.1, flavour="keras3"))
    assert model.optimizer.__class__.__module__.startswith("keras.")
    assert tfaccel.train.models.check_model_fits(model, (4,), 2) is model
    with pytest.raises(tfaccel.ModelError, match="takes inputs of shape"):
        tfaccel.train.models.check_model_fits(model, (5,), 2)


def _nested_model(k):
    inner = k.Sequential([k.Input((4,)), k.layers.Dense(3, name="inner_dense")], name="inner")
    inputs = k.Input((4,))
    x = k.layers.Dense(4, activation="relu", name="first")(inputs)
    outputs = k.layers.Dense(2, name="last")(inner(x))
    return k.Model(inputs, outputs, name="outer")


@pytest.mark.parametrize("flavour", ["tf_keras", "keras3"])
def test_clone_with_weights_copies_every_layer_and_its_weights(flavour):
    k = keras_for(flavour)
    k.utils.set_random_seed(0)
    model = _nested_model(k)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    seen, wrapped = [], []

    def clone_layer(layer):
        seen.append(layer.name)
        return type(layer).from_config(layer.get_config())

    def wrap(layer, new):
        wrapped.append((layer.name, new.name))
        return new

    copy = clone_with_weights(model, clone_layer, wrap=wrap)
    assert flavour_of(copy) == flavour and copy is not model
    assert sorted(seen) == ["first", "inner_dense", "last"]  # a nested model's layers too
    assert sorted(wrapped) == [("first", "first"), ("inner_dense", "inner_dense"),
                               ("last", "last")]
    np.testing.assert_array_equal(copy(x), model(x))
    assert not any(a is b for a, b in zip(copy.weights, model.weights))  # new variables

    whole = []
    copy = clone_with_weights(model, lambda layer: whole.append(layer.name) or
                              type(layer).from_config(layer.get_config()), nested=False)
    assert sorted(whole) == ["first", "inner", "last"]  # the nested model, whole
    np.testing.assert_array_equal(copy(x), model(x))


def test_clone_with_weights_keeps_values_across_a_new_dtype_policy():
    model = _nested_model(keras)
    copy = clone_with_weights(model, lambda layer: type(layer).from_config(
        {**layer.get_config(), "dtype": "mixed_bfloat16"}))
    assert {layer.compute_dtype for layer in copy.layers[1:]} >= {"bfloat16"}
    for a, b in zip(copy.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_flavours_policies_and_saved_files(tmp_path):
    assert check_flavour("keras3") == "keras3"
    with pytest.raises(ConfigError, match="flavour='keras2': use one of tf_keras, keras3"):
        check_flavour("keras2")
    with pytest.raises(ConfigError, match="flavour='keras2'"):
        keras_for("keras2")
    before = keras.mixed_precision.global_policy().name
    try:
        assert set_global_policy("mixed_bfloat16") == before
        assert keras3.config.dtype_policy().name == "mixed_bfloat16"  # Keras 3 is loaded here
    finally:
        set_global_policy(before)
    assert keras.mixed_precision.global_policy().name == before
    _keras3_model().save(tmp_path / "k3.keras")
    keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]).save(tmp_path / "k2.keras")
    assert saved_flavour(tmp_path / "k3.keras") == ("keras3", keras3.__version__)
    assert saved_flavour(tmp_path / "k2.keras")[0] == "tf_keras"
    assert saved_flavour(tmp_path / "missing.keras") == ("tf_keras", None)


def test_no_module_imports_keras_directly():
    pattern = re.compile(r"^\s*(import keras\b|from keras\b|import tf_keras|from tf_keras"
                         r"|.*\btf\.keras\b)")
    offenders = []
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(root, name)
            if not name.endswith(".py") or path == os.path.join(PACKAGE, "keras", "__init__.py"):
                continue
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if pattern.match(line) and "noqa: keras" not in line:
                        offenders.append(
                            f"{os.path.relpath(path, PACKAGE)}:{number}: {line.strip()}")
    assert not offenders, "import Keras only through tfaccel.keras:\n" + "\n".join(offenders)
