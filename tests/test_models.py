"""tfaccel.train.models: the zoo fits any shape, user models load, mismatches are caught."""

import sys
import textwrap

import numpy as np
import pytest
from user_models import TinySubclassed

import tfaccel
from tfaccel import _compat
from tfaccel.keras import keras
from tfaccel.train import models


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
    with pytest.raises(tfaccel.ModelError,
                       match=r"unknown model 'vgg'.*mlp, cnn, resnet, mobilenet_v2"):
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


@pytest.mark.parametrize("recompute", [False, True])
def test_a_saved_gpt_loads_in_a_process_that_never_built_one(tmp_path, recompute):
    # the memory calibration's children load the model a plan was asked for from a file;
    # tfaccel's own layers must be known there without importing the GPT first
    import subprocess

    from tfaccel.train import gpt

    model = gpt.build_gpt(gpt.GPTConfig(vocab_size=20, context=8, layers=1, heads=2,
                                        d_model=8), recompute=recompute)
    path = str(tmp_path / "gpt.keras")
    model.save(path)
    code = ("import sys; from tfaccel.train import models; "
            "m = models.load_model_file(sys.argv[1]); "
            "print(len(m.weights), m.count_params())")
    out = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[:2] == [str(len(model.weights)), str(model.count_params())]


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


def test_model_fn_failures_are_the_users_function_in_one_line(tmp_path, monkeypatch):
    (tmp_path / "broken_models.py").write_text(textwrap.dedent("""
        def raises(input_shape, num_classes):
            raise RuntimeError("layer sizes do not add up\\nsecond line")

        def wrong_signature(shape):
            return None
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(tfaccel.ModelError) as raised:
        models.resolve_model("cnn", (8, 8, 1), 10, model_fn="broken_models:raises")
    message = str(raised.value)
    assert "your function raises(input_shape=(8, 8, 1), num_classes=10) raised RuntimeError: " \
           "layer sizes do not add up (broken_models.py:3)" in message
    assert "\n" not in message and "second line" not in message
    with pytest.raises(tfaccel.ModelError, match=r"cannot be called as wrong_signature\("
                       r"input_shape=\.\.\., num_classes=\.\.\.\).*define it as "
                       r"def wrong_signature\(input_shape, num_classes\)"):
        models.resolve_model("cnn", (8, 8, 1), 10, model_fn="broken_models:wrong_signature")
    sys.modules.pop("broken_models", None)


def test_subclassed_model_is_checked_by_calling_it():
    model = TinySubclassed(10)
    assert not _compat.is_graph_network(model) and _compat.is_graph_network(models.build_model(
        "mlp", (8, 8, 1), 10))
    assert models.check_model_fits(model, (8, 8, 1), 10) is model  # no AttributeError
    assert model.built
    with pytest.raises(tfaccel.ModelError, match="outputs 3 classes but the dataset has 10"):
        models.check_model_fits(TinySubclassed(3), (8, 8, 1), 10)

    class TakesVectors(TinySubclassed):
        def call(self, x):
            if len(x.shape) != 2:
                raise ValueError(f"expected vectors, got rank {len(x.shape)}")
            return self.out(x)

    with pytest.raises(tfaccel.ModelError, match=r"fails on a batch of inputs of the dataset's "
                       r"shape \(8, 8, 1\): ValueError: expected vectors, got rank 4"):
        models.check_model_fits(TakesVectors(10), (8, 8, 1), 10)


def test_choices_have_one_home_without_tensorflow():
    import subprocess

    from tfaccel import choices, data, distribute
    from tfaccel.performance import memory
    from tfaccel.train import precision, schedules, training

    assert models.MODELS is choices.MODELS and data.DATASETS is choices.DATASETS
    assert training.OPTIMIZERS is choices.OPTIMIZERS and schedules.SCHEDULES is choices.SCHEDULES
    assert distribute.STRATEGIES is choices.STRATEGIES
    assert precision.PRECISIONS is choices.PRECISIONS
    assert memory.HOST_ALLOCATORS is choices.HOST_ALLOCATORS and tfaccel.MODELS is choices.MODELS
    proc = subprocess.run([sys.executable, "-c", "import sys, tfaccel.choices; "
                           "print(sorted(m for m in ('tensorflow', 'tf_keras', 'numpy') "
                           "if m in sys.modules))"], capture_output=True, text=True, check=True)
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("name", models.MODELS)
def test_zoo_models_build_in_keras3_with_the_same_outputs(name):
    # A zoo model for --keras=keras3: built once, translated (verified inside), float32.
    from tfaccel.keras import flavour_of, keras3

    keras.utils.set_random_seed(0)
    model3 = models.resolve_model(name, (8, 8, 1), 10, keras="keras3")
    assert flavour_of(model3) == "keras3" and isinstance(model3, keras3().Model)
    keras.utils.set_random_seed(0)
    model2 = models.build_model(name, (8, 8, 1), 10)
    assert model3.count_params() == model2.count_params()
    assert {w.dtype for w in model3.get_weights()} == {np.dtype("float32")}
