"""tfaccel.performance.memory_graph: the activations a traced training step keeps."""

import hub_models
import pytest
import tf_keras as keras

from tfaccel.errors import ConfigError
from tfaccel.performance import memory_graph, memory_profile, plan


def _mlp():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(4)])


def test_dense_model_keeps_exactly_what_its_gradients_read():
    # counted by hand: the input x (8 floats, for the first kernel's gradient), the ReLU's
    # output (16: ReluGrad and the second kernel's gradient), the output (4: the squared
    # loss's gradient); the weights are model states, not activations
    profile = memory_graph.traced_profile(_mlp())
    assert profile.layers[0].activation_bytes == 4 * (8 + 16 + 4)
    assert profile.fixed_activation_bytes == 0
    assert profile.method.startswith("graph")
    result = plan.plan_memory(profile, batch_size=32)
    assert result.breakdown["activations"] == 32 * 4 * (8 + 16 + 4)
    assert result.method == profile.method


def test_kept_bytes_scale_linearly_with_the_batch():
    model = _mlp()
    kept = [memory_graph.saved_bytes(model, b)[0] for b in (2, 4, 8)]
    assert kept[2] - kept[1] == 2 * (kept[1] - kept[0]) > 0
    assert kept[0] == 2 * 4 * (8 + 16 + 4)


def test_gpt_tiny_traced_matches_its_closed_form_within_2_percent():
    from tfaccel.train import gpt

    model = gpt.build_gpt(gpt.GPTConfig(vocab_size=104, context=64, layers=4, heads=4,
                                        d_model=128))
    traced = memory_graph.traced_profile(model, sequence_length=64).activation_bytes()
    closed = memory_profile.profile_transformer(4, 128, 4, 104, 64, tied=False,
                                                half=False).activation_bytes()
    assert traced == pytest.approx(closed, rel=0.02)  # measured: 1.0013


def _keras_hub_models():
    return hub_models.gpt2_and_bert(vocabulary_size=1000, layers=2, heads=4, hidden=64,
                                    intermediate=256, max_length=64, num_classes=3)


def test_keras_hub_models_are_plannable_at_a_sequence_length():
    gpt2, bert = _keras_hub_models()
    for model in (gpt2, bert):
        result = plan.plan_memory(model, batch_size=16, sequence_length=32)
        assert result.method.startswith("graph")
        assert result.breakdown["weights (float32)"] == 4 * model.count_params()
        assert result.breakdown["activations"] > 0
    # the causal LM keeps its float32 logits (vocabulary 1000 per token), the classifier not
    lm = plan.plan_memory(gpt2, batch_size=16, sequence_length=32).breakdown["activations"]
    cls = plan.plan_memory(bert, batch_size=16, sequence_length=32).breakdown["activations"]
    assert lm > cls + 16 * 32 * 1000 * 4 * 0.9
    with pytest.raises(ConfigError, match="sequence_length="):
        plan.plan_memory(bert, batch_size=16)


def test_dropout_keeps_its_mask_a_byte_per_value():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16),
                              keras.layers.Dropout(0.5), keras.layers.Dense(4)])
    # the input (8 floats), the dropped-out values the last kernel's gradient reads (16),
    # the output (4), and the boolean mask (16 bytes) made from random numbers, not the input
    assert memory_graph.traced_profile(model).layers[0].activation_bytes == \
        4 * (8 + 16 + 4) + 16
