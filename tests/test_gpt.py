"""tfaccel.train.gpt: the decoder's shape and sizes, mixed precision, .keras files, clear errors,
and recomputation (gradients, training and dropout equal to the plain model's; memory measured
by benchmarks/bench_recompute.py)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import ROOT, mirrored_strategy

from tfaccel.errors import ModelError
from tfaccel.keras import keras
from tfaccel.train import gpt, gpt_layers, precision

SMALL = dict(vocab_size=23, context=16, layers=2, heads=2, d_model=16)  # fast to build and run


def _batch(config, batch=3, length=None, seed=0):
    rng = np.random.default_rng(seed)
    shape = (batch, length or config.context)
    return (rng.integers(0, config.vocab_size, shape).astype(np.int32),
            rng.integers(0, config.vocab_size, shape).astype(np.int32))


def _expected_parameters(c):
    """Counted from the architecture: embeddings, per block (LN, q/k/v/out, LN, MLP), final LN,
    and an output kernel unless tied."""
    d, hidden = c.d_model, c.mlp_ratio * c.d_model
    block = 2 * d + (4 * d * d + 4 * d) + 2 * d + (d * hidden + hidden) + (hidden * d + d)
    output = 0 if c.tie_embeddings else d * c.vocab_size
    return c.vocab_size * d + c.context * d + c.layers * block + 2 * d + output


@pytest.mark.parametrize("vocab", [104, 256])
@pytest.mark.parametrize("tie", [False, True])
def test_tiny_has_about_0_8m_parameters_as_counted(vocab, tie):
    config = gpt.gpt_config("tiny", vocab_size=vocab, tie_embeddings=tie)
    model = gpt.build_gpt(config)
    assert model.count_params() == _expected_parameters(config)
    assert 0.75e6 < model.count_params() < 0.9e6
    names = [w.name for w in model.weights]
    assert tie == ("logits/kernel:0" not in names) and len(names) == len(set(names))


def test_small_has_about_10m_parameters():
    config = gpt.gpt_config("small", vocab_size=104)
    assert (config.layers, config.heads, config.d_model, config.context) == (6, 6, 384, 256)
    assert 10e6 < _expected_parameters(config) < 11e6


def test_gpt_config_overrides_and_errors():
    config = gpt.gpt_config("tiny", vocab_size=50, layers=None, heads=8, dropout=0.1)
    assert (config.layers, config.heads, config.dropout) == (4, 8, 0.1)
    assert gpt.GPTConfig(**config.to_json()) == config
    from_numpy = gpt.GPTConfig(vocab_size=np.int64(50), dropout=np.float32(0.5))
    assert json.loads(json.dumps(from_numpy.to_json()))["vocab_size"] == 50
    for kwargs, match in [(dict(size="huge"), r"unknown GPT size 'huge': use one of tiny, small"),
                          (dict(vocab_size=None), "needs vocab_size"),
                          (dict(depth=3), "unknown GPT setting depth"),
                          (dict(layers=0), "layers=0: give a positive whole number"),
                          (dict(dropout=1.0), r"dropout=1.0: give a rate in \[0, 1\)")]:
        with pytest.raises(ModelError, match=match):
            gpt.gpt_config(**{"size": "tiny", "vocab_size": 50, **kwargs})


def test_heads_that_do_not_divide_d_model_are_one_line_naming_both_and_the_fix():
    with pytest.raises(ModelError) as e:
        gpt.GPTConfig(vocab_size=50, heads=5, d_model=128)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("GPT heads=5 does not divide d_model=128")
    assert "use heads in 1, 2, 4, 8, 16, 32, 64" in message
    assert "or a d_model that is a multiple of 5 (e.g. 130)" in message


def test_logits_are_causal_float32_and_shorter_sequences_work():
    config = gpt.GPTConfig(**SMALL)
    model = gpt.build_gpt(config)
    x, _ = _batch(config, length=10)  # shorter than the context
    logits = model(x).numpy()
    assert logits.shape == (3, 10, config.vocab_size) and model.output.dtype == tf.float32
    changed = x.copy()
    changed[:, 6] = (changed[:, 6] + 1) % config.vocab_size
    after = model(changed).numpy()
    np.testing.assert_array_equal(after[:, :6], logits[:, :6])  # earlier positions cannot see it
    assert np.abs(after[:, 6:] - logits[:, 6:]).max() > 1e-4


def test_a_sequence_longer_than_the_context_is_one_line():
    config = gpt.GPTConfig(**dict(SMALL, context=64))
    model = gpt.build_gpt(config)
    expected = ("sequence length 128 is larger than the model's context 64: pass "
                "--sequence_length<=64 or a model with a longer context")
    for given in (config, model, gpt.with_recompute(model)):
        assert gpt.check_sequence_length(given, 64) == 64
        with pytest.raises(ModelError) as e:
            gpt.check_sequence_length(given, 128)
        assert str(e.value) == expected
    with pytest.raises(ModelError, match="larger than the model's context 64"):
        model(np.zeros((1, 128), np.int32))
    with pytest.raises(ModelError, match="not a GPT made by"):
        gpt.check_sequence_length(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]), 4)


@pytest.mark.parametrize("policy,low", [("mixed_bfloat16", tf.bfloat16),
                                        ("mixed_float16", tf.float16)])
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_mixed_precision_blocks_compute_low_and_logits_stay_float32(policy, low, tie, recompute):
    config = gpt.GPTConfig(**dict(SMALL, tie_embeddings=tie))
    with precision.precision_scope(policy):
        model = gpt.build_gpt(config, recompute=recompute)
    assert model.output.dtype == tf.float32
    block_output = model.get_layer("block_0" if recompute else "block_0_mlp_add").output
    assert block_output.dtype == tf.float32  # the residual stream
    block = model.get_layer("block_1").block_layers if recompute else {
        part: model.get_layer(f"block_1_{part}") for part in ("attn", "mlp_fc")}
    assert block["attn"].compute_dtype == block["mlp_fc"].compute_dtype == low.name
    if not recompute:
        assert model.get_layer("block_1_mlp_fc").output.dtype == low  # the products stay 16-bit
    assert precision.apply_precision(model, policy) is model  # as the precision module wants
    x, y = _batch(config)
    with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
    assert logits.dtype == tf.float32 and np.isfinite(logits.numpy()).all()
    grads = tape.gradient(loss, model.trainable_weights)
    assert all(g is not None and np.isfinite(tf.convert_to_tensor(g).numpy()).all() for g in grads)


@pytest.mark.parametrize("recompute", [False, True])
def test_bfloat16_model_keeps_the_residual_stream_and_layernorms_in_float32(recompute):
    config = gpt.GPTConfig(**SMALL)
    with precision.precision_scope("mixed_bfloat16"):
        model = gpt.build_gpt(config, recompute=recompute)
        plain = gpt.with_recompute(model, False)
    dtypes = {layer.name: layer.output.dtype for layer in plain.layers[1:]}
    stream = {"position_embedding", "logits"} | {
        f"block_{i}_{part}" for i in range(config.layers) for part in ("attn_add", "mlp_add")}
    assert {name for name, dtype in dtypes.items() if dtype == tf.float32} == stream
    assert {dtypes[n] for n in ("token_embedding", "block_0_ln_1", "block_0_attn",
                                "block_0_mlp_fc", "final_ln")} == {tf.bfloat16}
    # the LayerNorm's statistics come from the float32 stream, not from its 16-bit rounding
    x = 100 * tf.constant([[[1.0, 1.0 + 2.0 ** -9, 1.0 - 2.0 ** -9, 1.0] * 4]])  # bf16: all 100
    assert len(set(tf.cast(x, tf.bfloat16).numpy().ravel().tolist())) == 1
    normalized = plain.get_layer("block_0_ln_1")(x)
    assert normalized.dtype == tf.bfloat16
    np.testing.assert_allclose(normalized.numpy().astype(np.float32)[0, 0],
                               [0, 2 ** 0.5, -(2 ** 0.5), 0] * 4, atol=0.01)  # 16-bit: all 0
    assert model.get_layer("block_0" if recompute else "block_0_mlp_add").output.dtype == \
        tf.float32
    # every layer keeps the model's policy, so precision and recompute see one policy
    assert precision.apply_precision(model, "mixed_bfloat16") is model


_PLAIN_LAYERS = {gpt_layers.ResidualAdd: keras.layers.Add,
                 gpt_layers.Float32LayerNorm: keras.layers.LayerNormalization}


@pytest.mark.parametrize("seed", [0, 1])
def test_bfloat16_logits_agree_with_float32_closer_than_with_tf_keras_layers(seed):
    keras.utils.set_random_seed(seed)
    config = gpt.GPTConfig(**dict(SMALL, d_model=32))
    reference = gpt.build_gpt(config)  # float32; matrices x3, nearer trained weights' size
    reference.set_weights([w * 3 if w.ndim == 2 else w for w in reference.get_weights()])
    with precision.precision_scope("mixed_bfloat16"):
        mixed = precision.apply_precision(reference, "mixed_bfloat16", copy=True)
        plain = keras.models.clone_model(mixed, clone_function=lambda layer: _PLAIN_LAYERS.get(
            type(layer), type(layer)).from_config(layer.get_config()))  # bf16 LN and sums
    plain.set_weights(mixed.get_weights())
    x, _ = _batch(config, batch=8, seed=seed)
    expected = reference(x).numpy()
    error, plain_error = (np.abs(m(x).numpy() - expected).mean() for m in (mixed, plain))
    # measured: 0.76-0.83 of the tf_keras layers' error (d_model 16 and 32, 3 seeds each)
    assert error < 0.9 * plain_error
    assert 0 < error < 0.02  # bfloat16's matrix products still round: not float32's logits


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("recompute", [False, True])
def test_saves_and_loads_as_keras_with_its_config(tmp_path, tie, recompute):
    config = gpt.GPTConfig(**dict(SMALL, tie_embeddings=tie, dropout=0.1))
    model = gpt.build_gpt(config, recompute=recompute)
    path = str(tmp_path / "gpt.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    x, _ = _batch(config, length=7)
    np.testing.assert_allclose(loaded(x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)
    assert gpt.gpt_config_of(loaded) == config
    assert any(isinstance(layer, gpt.RecomputeBlock) for layer in loaded.layers) == recompute


def test_gpt_config_of_reads_every_variant_and_none_for_other_models():
    config = gpt.GPTConfig(**dict(SMALL, mlp_ratio=2, dropout=0.2, tie_embeddings=True))
    model = gpt.build_gpt(config)
    assert gpt.gpt_config_of(model) == config
    assert gpt.gpt_config_of(gpt.with_recompute(model)) == config
    assert gpt.gpt_config_of(precision.apply_precision(model, "mixed_bfloat16")) == config
    assert gpt.gpt_config_of(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])) is None
    with pytest.raises(ModelError, match="with_recompute: model 'sequential.*' is not a GPT"):
        gpt.with_recompute(keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)]))


def test_with_recompute_keeps_weight_names_order_and_values():
    model = gpt.build_gpt(gpt.GPTConfig(**SMALL))
    lean = gpt.with_recompute(model)
    plain = gpt.with_recompute(lean, False)
    assert [type(layer) for layer in plain.layers] == [type(layer) for layer in model.layers]
    assert sum(isinstance(layer, gpt.RecomputeBlock) for layer in lean.layers) == 2
    for other in (lean, plain):
        assert [w.name for w in other.weights] == [w.name for w in model.weights]
        for a, b in zip(other.get_weights(), model.get_weights()):
            np.testing.assert_array_equal(a, b)


def _loss_and_grads(model, x, y, training=True):
    with tf.GradientTape() as tape:
        logits = model(x, training=training)
        loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, logits,
                                                                           from_logits=True))
    return loss, [tf.convert_to_tensor(g) for g in tape.gradient(loss, model.trainable_weights)]


def _assert_same(got, want, rtol=1e-5):
    loss_a, grads_a = got
    loss_b, grads_b = want
    np.testing.assert_allclose(loss_a.numpy(), loss_b.numpy(), rtol=rtol)
    assert len(grads_a) == len(grads_b)
    for a, b in zip(grads_a, grads_b):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=rtol, atol=1e-7)


@pytest.mark.parametrize("in_function", [False, True])
@pytest.mark.parametrize("tie", [False, True])
def test_recompute_gradients_equal_the_plain_models(in_function, tie):
    config = gpt.GPTConfig(**dict(SMALL, tie_embeddings=tie))
    plain = gpt.build_gpt(config)
    lean = gpt.with_recompute(plain)
    x, y = _batch(config)
    step = tf.function(_loss_and_grads) if in_function else _loss_and_grads
    _assert_same(step(lean, x, y), step(plain, x, y))
    assert np.abs(step(plain, x, y)[1][2].numpy()).max() > 0  # a real gradient was compared


def test_recompute_trains_with_fit_like_the_plain_model():
    config = gpt.GPTConfig(**SMALL)
    x, y = _batch(config, batch=8)
    models = []
    for recompute in (False, True):
        keras.utils.set_random_seed(1)
        model = gpt.build_gpt(config, recompute=recompute)
        model.compile(optimizer=keras.optimizers.SGD(0.5),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(x, y, batch_size=4, epochs=2, shuffle=False, verbose=0)
        models.append((model, history.history["loss"]))
    (plain, plain_loss), (lean, lean_loss) = models
    assert lean_loss[-1] < lean_loss[0]
    np.testing.assert_allclose(lean_loss, plain_loss, rtol=1e-5)
    for a, b in zip(lean.get_weights(), plain.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


@pytest.mark.slow
def test_recompute_under_mirrored_strategy_matches_the_plain_model():
    config = gpt.GPTConfig(**SMALL)
    x, y = _batch(config, batch=8)
    strategy = mirrored_strategy()
    weights = []
    for recompute in (False, True):
        keras.utils.set_random_seed(2)
        with strategy.scope():
            model = gpt.build_gpt(config, recompute=recompute)
            model.compile(optimizer=keras.optimizers.SGD(0.5),
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        model.fit(x, y, batch_size=4, epochs=1, shuffle=False, verbose=0)
        weights.append(model.get_weights())
    for a, b in zip(*weights):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


# ---- dropout under recomputation


def test_a_stateful_dropout_under_recompute_grad_gets_gradients_of_another_mask():
    """Why RecomputeBlock draws its seeds outside tf.recompute_grad: Keras's own Dropout
    draws a new mask when the forward pass is recomputed, in eager code and in graphs."""
    drop, w, x = keras.layers.Dropout(0.5), tf.Variable(1.0), tf.ones((2000,))

    def f(t):
        return drop(t, training=True) * w

    def loss_and_grad(fn):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(fn(x))  # d loss / d w is the same sum, with the same mask
        return loss, tape.gradient(loss, w)

    loss, grad = loss_and_grad(f)
    assert loss.numpy() == grad.numpy()
    for run in (lambda: loss_and_grad(tf.recompute_grad(f)),
                tf.function(lambda: loss_and_grad(tf.recompute_grad(f)))):
        loss, grad = run()
        assert loss.numpy() != grad.numpy()


def _without_recompute(monkeypatch):
    monkeypatch.setattr(tf, "recompute_grad", lambda f: f)


def test_recompute_dropout_gradients_match_the_same_masks_without_recompute(monkeypatch):
    config = gpt.GPTConfig(**dict(SMALL, dropout=0.5))
    lean = gpt.build_gpt(config, recompute=True)
    x, y = _batch(config)
    tf.random.set_seed(3)  # eager: the same stateful draws of seeds after each reset
    got = _loss_and_grads(lean, x, y)
    tf.random.set_seed(3)
    again = _loss_and_grads(lean, x, y)
    with monkeypatch.context() as patch:
        _without_recompute(patch)
        tf.random.set_seed(3)
        want = _loss_and_grads(lean, x, y)
    _assert_same(got, want)
    _assert_same(again, want)
    tf.random.set_seed(4)
    other = _loss_and_grads(lean, x, y)  # other seeds, other masks: dropout is really on
    assert abs(float(other[0]) - float(got[0])) > 1e-4
    inference = [lean(x, training=False).numpy() for _ in range(2)]
    np.testing.assert_array_equal(*inference)


def test_recompute_dropout_in_a_graph_reuses_the_forward_masks(monkeypatch):
    """In a tf.function, with the seeds fixed, recomputed and not recomputed agree."""
    config = gpt.GPTConfig(**dict(SMALL, dropout=0.5))
    lean = gpt.build_gpt(config, recompute=True)
    x, y = _batch(config)
    monkeypatch.setattr(gpt_layers, "dropout_seeds", lambda: tf.constant([[1, 2], [3, 4]],
                                                                         tf.int64))
    got = tf.function(_loss_and_grads)(lean, x, y)
    with monkeypatch.context() as patch:
        _without_recompute(patch)
        want = tf.function(_loss_and_grads)(lean, x, y)
    _assert_same(got, want)
    plain = gpt.with_recompute(lean, False)
    no_dropout = _loss_and_grads(plain, x, y, training=False)
    assert abs(float(got[0]) - float(no_dropout[0])) > 1e-4  # the masks were applied


def test_recompute_with_dropout_trains_with_fit():
    config = gpt.GPTConfig(**dict(SMALL, dropout=0.1))
    x, y = _batch(config, batch=8)
    keras.utils.set_random_seed(5)
    lean = gpt.build_gpt(config, recompute=True)
    lean.compile(optimizer=keras.optimizers.Adam(1e-2),
                 loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    loss = lean.fit(x, y, batch_size=8, epochs=6, verbose=0).history["loss"]
    assert loss[-1] < loss[0] - 0.1


# ---- the memory saved, measured


@pytest.mark.slow
def test_bench_recompute_measures_a_lower_peak_with_recompute(tmp_path):
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmarks", "bench_recompute.py"),
         "--configs=fit_f32", "--layers=2", "--d_model=64", "--context=128", "--batch_size=8",
         "--repeats=1", "--steps=2", f"--output_dir={tmp_path}"],
        capture_output=True, text=True, timeout=900, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "bench_recompute.json").read_text())
    (row,) = report["rows"]
    assert len(row["plain_peaks"]) == len(row["recompute_peaks"]) == 1
    assert row["recompute_peak"] < row["plain_peak"] and row["ratio"] < 1
    np.testing.assert_allclose(row["recompute_loss"], row["plain_loss"], rtol=1e-4)
    assert (tmp_path / "bench_recompute.png").stat().st_size > 0
    assert "plain" in proc.stdout and "recompute" in proc.stdout
