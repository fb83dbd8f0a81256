"""Stage splits (tfaccel.parallel.stages): where the cuts fall, what crosses them."""

import pytest
from test_pipeline_parallel import residual_model

from tfaccel.errors import ConfigError, ModelError
from tfaccel.keras import keras
from tfaccel.parallel import stages
from tfaccel.performance import memory_profile, plan
from tfaccel.train.models import build_model

DEVICES = [f"/CPU:{i}" for i in range(8)]


def zoo(name):
    return build_model(name, (8, 8, 1), 10)


@pytest.mark.parametrize("name", ["cnn", "mlp", "resnet", "mobilenet_v2"])
@pytest.mark.parametrize("num_stages", [2, 3, 4])
def test_the_plan_prices_the_split_the_pipeline_makes(name, num_stages):
    model = build_model(name, (32, 32, 3), 10)
    pipeline = [list(s.layers) for s in
                stages.plan_stages(model, num_stages=num_stages, devices=DEVICES).stages]
    profile = memory_profile.profile_keras_model(model)
    order = stages.layer_order(model)
    planned = [[layer.name for layer in group if not layer.is_input]
               for group in plan.split_stages(profile.layers, num_stages)]
    assert all(n in order for group in planned for n in group)
    assert pipeline == planned


def test_one_balancing_rule_for_the_issue_example():
    # Kernel sizes [320, 9248, 0, 0, 102464, 1290] in 2 stages: 9,568 | 103,754 for both.
    assert plan.balanced_cuts([320, 9248, 0, 0, 102464, 1290], 2) == [2]
    assert stages.balanced_cuts is plan.balanced_cuts


def test_named_boundaries_split_exactly_there():
    model = zoo("cnn")
    plan = stages.plan_stages(model, boundaries=["conv_1", "dense"], devices=DEVICES)
    names = stages.layer_order(model)
    assert [s.layers for s in plan.stages] == [
        tuple(names[:1]), tuple(names[1:names.index("dense")]),
        tuple(names[names.index("dense"):])]
    assert [s.device for s in plan.stages] == DEVICES[:3]
    assert sum(s.parameters for s in plan.stages) == model.count_params()


@pytest.mark.parametrize("name", ["cnn", "mlp", "resnet", "residual"])
@pytest.mark.parametrize("num_stages", [2, 3, 4])
def test_balanced_stages_are_within_one_layer_of_equal(name, num_stages):
    model = residual_model() if name == "residual" else zoo(name)
    plan = stages.plan_stages(model, num_stages=num_stages, devices=DEVICES)
    largest = max(layer.count_params() for layer in model.layers)
    equal = model.count_params() / num_stages
    counts = [s.parameters for s in plan.stages]
    assert len(counts) == num_stages and all(s.layers for s in plan.stages)
    assert all(abs(c - equal) <= largest for c in counts), (counts, equal, largest)
    assert sum(counts) == model.count_params()
    # consecutive, in the order the model runs, every layer once
    assert [n for s in plan.stages for n in s.layers] == stages.layer_order(model)


def test_balanced_cuts_pick_the_cut_nearest_each_share():
    assert stages.balanced_cuts([1, 1, 1, 1], 2) == [2]
    assert stages.balanced_cuts([10, 1, 1, 10], 2) == [2]
    assert stages.balanced_cuts([100, 0, 0, 0], 4) == [1, 2, 3]  # each stage keeps a layer
    assert stages.balanced_cuts([1, 2, 3, 4, 5, 6], 3) == [3, 5]


def test_a_skip_connection_over_a_stage_is_passed_along_and_the_table_says_so():
    plan = stages.plan_stages(residual_model(), boundaries=["a0", "b0"], devices=DEVICES,
                              micro_batches=4)
    third = {name: along for name, _, along in plan.stages[2].receives}
    assert third == {"stem": True, "a0": False}  # stem's output skips stage 1 to reach add0
    assert plan.stages[1].receives == (("stem", (None, 8, 8, 8), False),)
    table = plan.table()
    assert "stem (None, 8, 8, 8) (passed along)" in table
    assert f"bubble (K-1)/(M+K-1) = {2 / 6:.3f}" in table
    assert plan.to_json()["stages"][2]["layers"][0] == "b0"


def test_memory_balance_evens_the_planner_estimate_per_stage():
    model = zoo("resnet")  # early layers: large activations; late ones: most parameters
    by_params = stages.plan_stages(model, num_stages=3, devices=DEVICES, batch_size=256)
    by_memory = stages.plan_stages(model, num_stages=3, devices=DEVICES, batch_size=256,
                                   balance="memory")
    assert all(s.memory_bytes > 4 * s.parameters for s in by_params.stages)
    params_spread = [s.memory_bytes for s in by_params.stages]
    memory_spread = [s.memory_bytes for s in by_memory.stages]
    assert max(memory_spread) < 0.6 * max(params_spread)
    assert max(memory_spread) < 1.5 * min(memory_spread)
    assert stages.plan_stages(model, num_stages=2, devices=DEVICES).stages[0].memory_bytes is None
    with pytest.raises(ConfigError, match="needs the batch size"):
        stages.plan_stages(model, num_stages=2, devices=DEVICES, balance="memory")


def test_a_sequential_model_splits():
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="d0"),
                              keras.layers.Dense(8, name="d1"), keras.layers.Dense(2, name="d2")])
    plan = stages.plan_stages(model, num_stages=3, devices=DEVICES)
    assert [s.layers for s in plan.stages] == [("d0",), ("d1",), ("d2",)]


def test_bad_splits_get_one_clear_line():
    model = zoo("cnn")
    with pytest.raises(ConfigError, match="not in the model's order"):
        stages.plan_stages(model, boundaries=["dense", "conv_1"], devices=DEVICES)
    with pytest.raises(ConfigError, match="is the first layer"):
        stages.plan_stages(model, boundaries=["conv_0"], devices=DEVICES)
    with pytest.raises(ConfigError, match="make 2 stages, not 3"):
        stages.plan_stages(model, num_stages=3, boundaries=["dense"], devices=DEVICES)
    with pytest.raises(ConfigError, match="balance='sideways'"):
        stages.plan_stages(model, num_stages=2, devices=DEVICES, balance="sideways")
    inner = keras.Sequential([keras.Input((4,)), keras.layers.Dense(4)], name="inner")
    inputs = keras.Input((4,))
    nested = keras.Model(inputs, keras.layers.Dense(2)(inner(inputs)))
    with pytest.raises(ModelError, match="nested models: flatten it first"):
        stages.plan_stages(nested, num_stages=2, devices=DEVICES)
    shared = keras.layers.Dense(4, name="shared")
    x = keras.Input((4,))
    twice = keras.Model(x, shared(shared(x)))
    with pytest.raises(ModelError, match="shared.*called more than once"):
        stages.plan_stages(twice, num_stages=2, devices=DEVICES)
