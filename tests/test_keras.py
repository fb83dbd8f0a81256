"""tfaccel.keras: one Keras, and a clear error for Keras 3 objects."""

import os
import re

import keras as keras3
import pytest

import tfaccel
from tfaccel.keras import ensure_tf_keras, is_keras3_object, keras

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


def test_helpers_reject_keras3_models():
    with pytest.raises(tfaccel.WrongKerasError):
        tfaccel.compile_classifier(_keras3_model(), tfaccel.make_optimizer("sgd", 0.1))
    with pytest.raises(tfaccel.WrongKerasError):
        tfaccel.train.models.check_model_fits(_keras3_model(), (4,), 2)


def test_no_module_imports_keras_directly():
    pattern = re.compile(r"^\s*(import keras\b|from keras\b|import tf_keras|from tf_keras"
                         r"|.*\btf\.keras\b)")
    offenders = []
    for root, _, files in os.walk(PACKAGE):
        for name in files:
            path = os.path.join(root, name)
            if not name.endswith(".py") or path == os.path.join(PACKAGE, "keras.py"):
                continue
            with open(path, encoding="utf-8") as f:
                for number, line in enumerate(f, 1):
                    if pattern.match(line) and "noqa: keras" not in line:
                        offenders.append(
                            f"{os.path.relpath(path, PACKAGE)}:{number}: {line.strip()}")
    assert not offenders, "import Keras only through tfaccel.keras:\n" + "\n".join(offenders)
