"""Bring your own model: models nobody here wrote, through every technique (issue #27's matrix).

Rows: tf_keras and Keras 3 `keras.applications` MobileNetV2 (alpha 0.35, 96x96), ResNet50
and EfficientNetB0 (64x64), a KerasHub GPT2 causal LM (2 layers, 4 heads, hidden 128) and
a KerasHub BERT classifier (2 layers), none from downloaded weights (weights=None, configs
only): the image models briefly trained on images whose class is their colour (see
`trained`: a random-init deep image model is too chaotic for any quantized file to match it).
Columns: bf16 training steps, pruning to 50%, QAT to int8 TFLite, PTQ dynamic and int8
TFLite (the file run, logits against Keras), Keras 3 int8/int4, the memory plan, the
pipeline. A cell either works (its values asserted) or is in `REFUSED` with whose limit it
is and what works instead: a refusal that starts working, or a crash, fails the test.
The image models are the slow tier; the KerasHub cells that take seconds are the fast one.
"""

import fcntl
import functools
import os
import tempfile

import numpy as np
import pytest

import tfaccel
from tfaccel.compress import keras3_quantize, sparsity, tflite_eval
from tfaccel.compress.pruning_plan import PruneConfig
from tfaccel.errors import TfaccelError
from tfaccel.keras import keras, keras3, keras_of

IMAGES = {"mobilenet_v2": ((96, 96, 3), "MobileNetV2", {"alpha": 0.35}),
          "resnet50": ((64, 64, 3), "ResNet50", {}),
          "efficientnet_b0": ((64, 64, 3), "EfficientNetB0", {})}
HUB = ("gpt2", "bert")
MODELS = [f"{flavour}_{name}" for name in IMAGES for flavour in ("tf_keras", "keras3")] + list(HUB)
TECHNIQUES = ("bf16", "prune", "qat", "tflite_dynamic", "tflite_int8", "keras3_int8",
              "keras3_int4", "plan", "pipeline")
VOCABULARY, LENGTH, CLASSES, BATCH = 100, 16, 10, 4
TRAINING = {"mobilenet_v2": (60, 1e-2), "resnet50": (30, 1e-3), "efficientnet_b0": (60, 1e-2)}
"""Each image row's training before any cell (see `trained`): (Adam steps, learning rate)."""
TRAINING_BATCH = 16
TOLERANCE = {"tflite_dynamic": 0.05, "tflite_int8": 0.15, "qat": 0.15, "keras3_int8": 0.05,
             "keras3_int4": 0.35}
"""Largest |TFLite or quantized - Keras| of the outputs, as a share of the largest |Keras|."""

_KERAS3_ONLY = ("Keras 3 quantization needs a Keras 3 model", "to_keras3")
_HUB_QAT = ("TF-MOT's limit", "tfaccel.keras3_quantized(model, 'int8')")
_HUB_PIPELINE = ("tfaccel's stages", "--strategy=mirrored")
REFUSED = {
    **{(f"tf_keras_{name}", mode): _KERAS3_ONLY for name in IMAGES
       for mode in ("keras3_int8", "keras3_int4")},
    ("gpt2", "qat"): _HUB_QAT, ("bert", "qat"): _HUB_QAT,
    ("tf_keras_efficientnet_b0", "qat"): ("TF-MOT default 8-bit scheme", "skip_layers=[...]"),
    ("gpt2", "pipeline"): _HUB_PIPELINE, ("bert", "pipeline"): _HUB_PIPELINE,
    # Its translation crosses the bridge (float32 rounding, 0 apart in float64): then TF-MOT's
    # default scheme refuses its Rescaling, Normalization and squeeze-excite Multiply layers.
    ("keras3_efficientnet_b0", "qat"): ("TF-MOT default 8-bit scheme", "skip_layers=[...]"),
}
"""(model, technique): (whose limit, as the message says it; what works, as it names it)."""
OPEN = {}
"""Cells that neither work nor refuse per item 8 yet, as measured (strict: a fix fails them).
None since the image rows train as `TRAINING` says: the 7 cells of MobileNetV2 and
EfficientNetB0 that missed after 30 Adam steps at 1e-3 (tf_keras MobileNetV2 QAT 0.33; Keras 3
MobileNetV2 QAT 0.38, dynamic 0.068, int8 0.41; tf_keras EfficientNetB0 dynamic 0.055, int8
0.21; Keras 3 EfficientNetB0 int8 0.17) are within their tolerances (docs/keras3.md)."""
BORDERLINE = {}
"""Cells that passed in one run and missed in another (not strict: either outcome is seen).
None now: tf_keras MobileNetV2's dynamic and int8 files were at 0.039-0.10 and 0.13-0.25 in
runs trained 30 steps at 1e-3 (not bit-reproducible), its int8 file 0.150 after 30 steps at
1e-2 in three runs; after 60 steps at 1e-2 they are at 0.0096 and 0.028 (tolerances 0.05 and
0.15)."""
FAST = {(m, t) for m in HUB for t in ("qat", "pipeline")}
"""The cells of the fast tier (about a second each); the others take 10 s to minutes."""


def _hub(name):
    keras_hub = pytest.importorskip("keras_hub")
    size = dict(vocabulary_size=VOCABULARY, num_layers=2, num_heads=4, hidden_dim=128,
                intermediate_dim=512, max_sequence_length=LENGTH)
    if name == "gpt2":
        return keras_hub.models.GPT2CausalLM(backbone=keras_hub.models.GPT2Backbone(**size),
                                             preprocessor=None)
    return keras_hub.models.BertTextClassifier(backbone=keras_hub.models.BertBackbone(**size),
                                               num_classes=2, preprocessor=None)


def build(name):
    """A new model of the row `name` (seeded: the same weights each run): KerasHub rows
    random init from their configs, image rows briefly trained (`trained`) once per run, their
    weights kept in the run's temporary folder for the other cells and workers."""
    keras3().utils.set_random_seed(0)
    if name in HUB:
        return _hub(name)
    shape, cls, extra = IMAGES[_image(name)]
    module = keras if name.startswith("tf_keras") else keras3()
    make = functools.partial(getattr(module.applications, cls), input_shape=shape,
                             weights=None, classes=CLASSES, classifier_activation=None, **extra)
    path = os.path.join(_WEIGHTS_CACHE or _weights_cache_fallback(), f"{name}.weights.h5")
    with open(path + ".lock", "w") as lock:  # one xdist worker trains, the other waits
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(path):
            partial = path.removesuffix(".weights.h5") + ".partial.weights.h5"
            trained(make(), name).save_weights(partial)
            os.replace(partial, path)
    keras3().utils.set_random_seed(0)
    model = make()
    model.load_weights(path)
    return model


_WEIGHTS_CACHE = None
"""Where the trained image rows' weights are kept for this run (shared by xdist's workers)."""


@pytest.fixture(scope="session", autouse=True)
def _trained_weights_folder(tmp_path_factory):
    """The run's folder for trained weights: the base temporary folder's parent under xdist
    (common to its workers, so each row trains once per run), else the base folder."""
    global _WEIGHTS_CACHE
    base = tmp_path_factory.getbasetemp()
    _WEIGHTS_CACHE = str(base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base)
    yield
    _WEIGHTS_CACHE = None


def _weights_cache_fallback():
    return tempfile.mkdtemp(prefix="tfaccel-own-models-")


def trained(model, name):
    """`model` after the row's Adam steps (`TRAINING`) on its images (`data`), its BatchNorms'
    moving statistics then set from a batch of them (`with_batch_statistics`).

    A model one quantizes is a trained one; a random-init deep image model is chaotic: int8
    rounding of its weights alone, in Keras, moves tf_keras MobileNetV2's logits by 0.27 of the
    largest, the error growing ~1.1x per BatchNorm layer from 0.7% at the first (statistics
    from 8 or 256 examples alike), so its quantized files missed every tolerance (dynamic
    0.14-0.48, int8 0.22-1.1, QAT 0.40-0.67 of the largest |logit|) however faithful the
    conversion. The rate matters more than the steps: after 30 steps at 1e-3 MobileNetV2's
    files still missed (tf_keras dynamic 0.10, int8 0.25, QAT 0.35), at 3e-3 its QAT file
    missed (0.16), at 1e-2 all were within a third of their tolerances (tf_keras dynamic 0.020,
    int8 0.033, QAT 0.043; Keras 3 0.010, 0.035, 0.041), at no extra cost, except tf_keras
    int8 on this row's own training images: 0.150 in three runs, so MobileNetV2 trains 60
    steps (its int8 file then 0.028, dynamic 0.0096 on the test's images). The 30-step
    probes above trained on the first 480 of 960 images drawn, so not the test's 480 (the
    Keras 3 ones excepted). EfficientNetB0 at
    1e-2 needs 60 steps: after 30 its int8 file was 0.034 with seed 0 but 0.18-0.19 (two runs)
    with seed 1; after 60, 0.036 and 0.039 (seeds 1 and 2). ResNet50's Keras int8-weight error
    falls from 0.52 to 0.005 after 30 steps at 1e-3."""
    steps, learning_rate = TRAINING[_image(name)]
    x, y = data(name, steps * TRAINING_BATCH, seed=1)
    k = keras_of(model)
    model.compile(optimizer=k.optimizers.Adam(learning_rate),
                  loss=k.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=TRAINING_BATCH, epochs=1, verbose=0)
    return with_batch_statistics(model, data(name, 64, seed=2)[0])


def with_batch_statistics(model, x):
    """`model` with its BatchNorms' moving statistics set to those of `x`: after a few steps
    they still hold much of their initial mean 0 and variance 1 (momentum 0.99), and a
    random-init application's inference-mode BatchNorms with those shrink its activations
    layer after layer to ~1e-11 (every output the same, every comparison empty)."""
    norms = [layer for layer in model._flatten_layers()
             if type(layer).__name__ == "BatchNormalization"]
    momenta = [layer.momentum for layer in norms]
    for layer in norms:
        layer.momentum = 0.0  # the moving statistics become the batch's
    model(x, training=True)
    for layer, momentum in zip(norms, momenta):
        layer.momentum = momentum
    assert float(np.std(np.asarray(model(x, training=False)))) > 0.01
    return model


def _image(name):
    return name.removeprefix("tf_keras_").removeprefix("keras3_")


@functools.lru_cache(maxsize=None)
def built(name):
    """The row's model, built once per session: for the cells that do not change it."""
    return build(name)


def data(name, count=BATCH, seed=0):
    """(inputs, labels) for the row's model: token ids, or images in [0, 1) whose class is
    their colour (0.7 of a class's colour plus 0.3 of uniform noise: learnt in a few steps)."""
    rng = np.random.default_rng(seed)
    if name in HUB:
        x = {"token_ids": rng.integers(0, VOCABULARY, (count, LENGTH)).astype("int32"),
             "padding_mask": np.ones((count, LENGTH), "int32")}
        if name == "bert":
            x["segment_ids"] = np.zeros((count, LENGTH), "int32")
            return x, rng.integers(0, 2, (count,))
        return x, np.roll(x["token_ids"], -1, axis=1)
    shape = IMAGES[_image(name)][0]
    labels = rng.integers(0, CLASSES, (count,))
    colours = np.random.default_rng(CLASSES).random((CLASSES, 3), dtype=np.float32)
    noise = rng.random((count, *shape), dtype=np.float32)
    return 0.7 * colours[labels][:, None, None, :] + 0.3 * noise, labels


def _copy(model):
    """A new model of `model`'s class and weights, for a cell that changes the model it is given
    (the cached one is shared with the later cells)."""
    copy = keras_of(model).models.clone_model(model)
    copy.set_weights(model.get_weights())
    return copy


def _compile(model, learning_rate=0.01):
    k = keras_of(model)  # every row's model outputs logits
    model.compile(optimizer=k.optimizers.SGD(learning_rate),
                  loss=k.losses.SparseCategoricalCrossentropy(from_logits=True))


def _logits(model, x):
    return np.asarray(model(x, training=False), np.float32)


def _within(got, expected, tolerance):
    """The largest |got - expected| as a share of the largest |expected|, checked."""
    assert got.shape == expected.shape
    error = float(np.abs(got - expected).max() / np.abs(expected).max())
    assert error <= tolerance, error
    return error


def _run_tflite(path, x):
    """The file's outputs for `x` (one array, or token-id feeds by input name)."""
    if not isinstance(x, dict):
        return tflite_eval.predict_tflite(path, x)
    interpreter = tflite_eval.make_interpreter(path)
    outputs = []
    for i in range(len(next(iter(x.values())))):
        for detail in interpreter.get_input_details():
            key = next(k for k in x if k in detail["name"])
            interpreter.set_tensor(detail["index"], x[key][i:i + 1])
        interpreter.invoke()
        out = interpreter.get_output_details()[0]
        y = interpreter.get_tensor(out["index"]).astype(np.float32)
        if out["dtype"] == np.int8:
            scale, zero = out["quantization"]
            y = (y - zero) * scale
        outputs.append(y)
    return np.concatenate(outputs)


# ---------------------------------------------------------------- the cells


def cell_bf16(name, tmp_path):
    model = built(name)  # left as it is: a float32 model is rebuilt under the policy
    x, y = data(name)
    before = [np.array(w) for w in model.trainable_weights]
    with tfaccel.precision_scope("mixed_bfloat16"):
        trained = tfaccel.apply_precision(model, "mixed_bfloat16")
        _compile(trained)
        history = trained.fit(x, y, batch_size=BATCH // 2, epochs=1, verbose=0)
    assert type(trained) is type(model) and trained is not model
    assert any(getattr(layer, "compute_dtype", None) == "bfloat16" for layer in
               trained._flatten_layers())
    assert np.isfinite(history.history["loss"]).all()
    changed = sum(not np.array_equal(a, np.asarray(b))
                  for a, b in zip(before, trained.trainable_weights))
    assert changed > len(before) // 2
    return f"{history.history['loss'][-1]:.2f} loss"


def cell_prune(name, tmp_path):
    model = build(name) if name in HUB else _copy(built(name))  # native pruning masks in place
    x, y = data(name)
    pruned, callbacks = tfaccel.prune_to_sparsity(model, 0.5, 1, 2,
                                                  PruneConfig(schedule="constant"), method="auto")
    _compile(pruned)
    pruned.fit(x, y, batch_size=BATCH // 2, epochs=1, verbose=0, callbacks=callbacks)
    stripped = tfaccel.strip_pruning(pruned)
    report = sparsity.sparsity_report(stripped)
    kernels = [np.asarray(w) for w in stripped.weights if len(w.shape) >= 2]
    zeros = sum(int(np.count_nonzero(k == 0)) for k in kernels)
    assert report["pruned"]["sparsity"] == pytest.approx(0.5, abs=0.01)
    assert zeros >= report["pruned"]["zeros"] > 0  # counted from the weights themselves
    return f"{report['pruned']['sparsity']:.3f} zeros"


def cell_qat(name, tmp_path):
    x, y = data(name, 8)
    qat = tfaccel.quantize_aware(built(name))
    _compile(qat, learning_rate=0.0)
    qat.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # the ranges see data; weights kept
    path = tfaccel.convert_to_tflite(qat, str(tmp_path / "qat.tflite"), mode="int8")
    return f"{_within(_run_tflite(path, x[:2]), _logits(qat, x[:2]), TOLERANCE['qat']):.3g}"


def _ptq(name, tmp_path, mode):
    model = built(name)
    x, _ = data(name, 8)
    path = tfaccel.convert_to_tflite(model, str(tmp_path / f"{mode}.tflite"), mode=mode,
                                     representative_data=x,
                                     sequence_length=LENGTH if name in HUB else None)
    few = {k: v[:2] for k, v in x.items()} if name in HUB else x[:2]
    got = _run_tflite(path, few)
    return f"{_within(got, _logits(model, few), TOLERANCE[f'tflite_{mode}']):.3g}"


def cell_tflite_dynamic(name, tmp_path):
    return _ptq(name, tmp_path, "dynamic")


def cell_tflite_int8(name, tmp_path):
    return _ptq(name, tmp_path, "int8")


def _keras3(name, mode):
    model = built(name)
    x, _ = data(name, 2)
    small = tfaccel.keras3_quantized(model, mode)
    assert type(small) is type(model)
    assert keras3_quantize.quantized_weights(small, model)["share"] > 0
    return f"{_within(_logits(small, x), _logits(model, x), TOLERANCE[f'keras3_{mode}']):.3g}"


def cell_keras3_int8(name, tmp_path):
    return _keras3(name, "int8")


def cell_keras3_int4(name, tmp_path):
    return _keras3(name, "int4")


def cell_plan(name, tmp_path):
    model = built(name)
    length = LENGTH if name in HUB else None
    small, large = (tfaccel.plan_memory(model, batch_size=b, sequence_length=length)
                    for b in (8, 16))
    weights = sum(int(np.prod(w.shape)) * 4 for w in model.weights)
    for plan in (small, large):
        assert plan.total == sum(plan.breakdown.values())
        assert plan.parameters == model.count_params()
    assert weights <= small.total < large.total  # the activations grow with the batch
    return f"{small.total / 2**20:.1f} MiB"


def cell_pipeline(name, tmp_path):
    model = built(name)
    x, _ = data(name, 2)
    staged = tfaccel.pipeline_parallel(model, num_stages=2, devices=["/CPU:0", "/CPU:1"],
                                       micro_batches=2)
    assert len(staged.plan.stages) == 2
    # A Keras 3 model runs as its verified tf_keras translation (the bridge's rtol 1e-5) in
    # micro-batches: float32 rounding of a deep random-init net (measured 1.3e-5 MobileNetV2,
    # 3.9e-5 ResNet50, of the largest logit).
    tolerance = 1e-4 if keras_of(model) is not keras else 1e-5
    return f"{_within(_logits(staged, x), _logits(model, x), tolerance):.2g}"


CELLS = {t: globals()[f"cell_{t}"] for t in TECHNIQUES}


def _marks(model, technique):
    marks = [] if (model, technique) in FAST else [pytest.mark.slow]
    if (model, technique) in OPEN:
        reason, raises = OPEN[(model, technique)]
        marks.append(pytest.mark.xfail(strict=True, raises=raises, reason=reason))
    if (model, technique) in BORDERLINE:
        reason, raises = BORDERLINE[(model, technique)]
        marks.append(pytest.mark.xfail(strict=False, raises=raises, reason=reason))
    return marks


@pytest.mark.parametrize("model, technique", [
    pytest.param(m, t, marks=_marks(m, t), id=f"{m}-{t}") for m in MODELS for t in TECHNIQUES])
def test_cell(model, technique, tmp_path, record_property):
    if model not in HUB:
        pytest.importorskip("keras")  # Keras 3 beside tf_keras
    if (model, technique) not in REFUSED:
        record_property("measured", CELLS[technique](model, tmp_path))
        return
    owner, alternative = REFUSED[(model, technique)]
    with pytest.raises(TfaccelError) as raised:
        CELLS[technique](model, tmp_path)
    message = str(raised.value)
    assert "\n" not in message
    assert owner in message and alternative in message, message
    record_property("measured", f"refused: {message}")


def test_the_pipeline_splits_a_keras3_functional_model_at_a_named_block():
    """A Keras 3 functional model of standard layers is split as its verified tf_keras
    translation, at the boundary named, and gives the unsplit outputs (the fast-tier check
    of what the MobileNetV2 cells do)."""
    k3 = keras3()
    inputs = k3.Input((8, 8, 3))
    h = k3.layers.Conv2D(4, 3, padding="same", activation="relu", name="stem")(inputs)
    r = k3.layers.Conv2D(4, 3, padding="same", name="block_conv")(h)
    h = k3.layers.Add(name="block_add")([h, r])
    h = k3.layers.GlobalAveragePooling2D(name="pool")(h)
    model = k3.Model(inputs, k3.layers.Dense(3, name="head")(h))
    staged = tfaccel.pipeline_parallel(model, boundaries=["block_add"],
                                       devices=["/CPU:0", "/CPU:1"])
    assert [s.layers for s in staged.plan.stages] == [("stem", "block_conv"),
                                                      ("block_add", "pool", "head")]
    x = np.random.default_rng(1).random((3, 8, 8, 3), dtype=np.float32)
    np.testing.assert_allclose(_logits(staged, x), _logits(model, x), atol=1e-6)
