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


class _MaybeRecomputed(keras.layers.Layer):
    """relu(x @ w1) @ w2 (8 -> 16 -> 8), its forward run again in the backward pass when
    `recompute` (`tf.recompute_grad`, as the GPT's `RecomputeBlock`)."""

    def __init__(self, recompute, **kwargs):
        super().__init__(**kwargs)
        self.recompute = recompute

    def build(self, input_shape):
        self.w1 = self.add_weight(name="w1", shape=(8, 16))
        self.w2 = self.add_weight(name="w2", shape=(16, 8))

    def call(self, x):
        import tensorflow as tf

        def forward(x):
            return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1)), self.w2)
        return tf.recompute_grad(forward)(x) if self.recompute else forward(x)


@pytest.mark.parametrize("recompute", [False, True])
def test_a_recomputed_blocks_tensors_are_a_backward_transient_not_kept(recompute):
    from tfaccel.performance import utilization

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8),
                              _MaybeRecomputed(recompute), keras.layers.Dense(2)])
    graph, _ = utilization.traced_step(model, 4, loss="square")
    again, largest = memory_graph.recomputed_bytes(graph)
    kept, _ = memory_graph.saved_bytes(model, 4)
    if recompute:
        # made again while the block's gradient runs: the block's input as the recomputation
        # reads it (8 floats) and the ReLU's output (16), the weights' reads not counted;
        # kept across the step: the block's input instead of its insides
        assert (again, largest) == (4 * 4 * (8 + 16), 4 * 4 * 16)
        assert kept == 4 * 4 * (8 + 8 + 8 + 2)
    else:
        assert (again, largest) == (0, 0)
        assert kept == 4 * 4 * (8 + 8 + 16 + 8 + 2)
    step = memory_graph.traced_profile(model).layers[0]
    # the transient: the largest tensor's gradient beside the recomputed block (per example)
    assert step.output_bytes == (4 * 16 + 4 * (8 + 16) if recompute else 4 * 16)


@pytest.mark.parametrize("recompute", [False, True])
def test_the_replay_reports_a_recomputing_steps_activation_peak(recompute):
    from tfaccel.performance import utilization

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8),
                              _MaybeRecomputed(recompute), keras.layers.Dense(2)])
    replay = memory_graph.pool_replay(model, 4, orders=1)
    graph, _ = utilization.traced_step(model, 4, loss="square")
    kept, peak = memory_graph.live_bytes(graph)
    assert replay.recomputed_peak == (peak if recompute else 0)
    if recompute:  # the block made again beside what is kept (the input is not an activation)
        assert peak - (kept - 4 * 4 * 8) >= 4 * 4 * (8 + 16)


def test_the_recomputing_gpt_plans_its_recomputed_block_as_a_transient():
    from tfaccel.train import gpt

    shape = dict(vocab_size=104, context=64, layers=4, heads=4, d_model=128)
    plain, recomputing = (plan.plan_memory(gpt.build_gpt(gpt.GPTConfig(**shape), recompute=rc),
                                           batch_size=256, sequence_length=64, input_batches=1)
                          for rc in (False, True))
    assert recomputing.breakdown["activations"] < plain.breakdown["activations"] / 10
    # one block's forward tensors (of the four blocks' kept ones) are made again at a time
    block = (plain.breakdown["activations"] - recomputing.breakdown["activations"]) / 4
    assert recomputing.breakdown["backward transients"] > 0.8 * block
    assert recomputing.breakdown["backward transients"] < 1.5 * block


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


def _step_graph(model, batch):
    from tfaccel.performance import utilization

    return utilization.traced_step(model, batch, loss="square")[0]


def test_the_step_peak_holds_a_layers_input_gradient_beside_its_kept_output():
    # at batch 2, the largest set alive at once (in the order the step's ops were made) is the
    # hidden ReLU output (16 floats, ReluGrad reads it), the loss's gradient (4) and the hidden
    # layer's input gradient (16); the bias add and ReLU write into the MatMul's buffer; the
    # input is the plan's input batch, the weights' gradients are model states
    kept, peak = memory_graph.live_bytes(_step_graph(_mlp(), 2))
    assert kept == 2 * 4 * (8 + 16 + 4)
    assert peak == 2 * 4 * (16 + 4 + 16)


def test_a_pooling_gradient_is_made_at_the_pooled_inputs_size_beside_it():
    model = keras.Sequential([keras.Input((6, 6, 2)),
                              keras.layers.Conv2D(4, 3, padding="same", activation="relu"),
                              keras.layers.MaxPooling2D(2), keras.layers.Flatten(),
                              keras.layers.Dense(3)])
    # MaxPoolGrad reads the ReLU's output (6x6x4) and the pooled output (3x3x4) and makes a
    # 6x6x4 gradient while the pooled output's gradient (3x3x4) is alive
    kept, peak = memory_graph.live_bytes(_step_graph(model, 1))
    assert kept == 4 * (6 * 6 * 2 + 6 * 6 * 4 + 3 * 3 * 4 + 3)
    assert peak == 4 * (6 * 6 * 4 + 6 * 6 * 4 + 3 * 3 * 4 + 3 * 3 * 4)


def test_weight_reads_are_no_buffers_and_weight_gradients_are_model_states():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, name="hidden"),
                              keras.layers.Dense(4, name="out")])
    events = memory_graph.step_buffers(_step_graph(model, 2))
    allocated = {name: (nbytes, activation) for name, nbytes, activation in events
                 if nbytes is not None}
    assert not any("ReadVariableOp" in name for name in allocated)
    kernel_grad = [v for k, v in allocated.items() if k.endswith("hidden/MatMul/MatMul:0")]
    assert kernel_grad == [(8 * 16 * 4, False)]  # the first kernel's gradient
    # every allocation is freed by the step's end
    assert sorted(n for n, b, _ in events if b is None) == sorted(allocated)


def test_executor_orders_are_topological_and_the_same_seed_gives_the_same_order():
    graph = _step_graph(_mlp(), 2)
    orders = [memory_graph.executor_order(graph, seed) for seed in (1, 1, 2, 3)]
    for order in orders:
        assert sorted(op.name for op in order) == sorted(op.name for op in graph.get_operations())
        position = {op.name: i for i, op in enumerate(order)}
        for op in order:  # every op after the ops it reads and its control inputs
            assert all(position[t.op.name] < position[op.name] for t in op.inputs)
            assert all(position[c.name] < position[op.name] for c in op.control_inputs)
    names = [[op.name for op in order] for order in orders]
    assert names[0] == names[1]
    assert names[1] != names[2] or names[1] != names[3]  # the ready ops are drawn at random


def test_every_order_keeps_the_backward_passs_tensors_alive_at_once():
    # whatever the order, the backward pass starts after the loss, so the kept activations
    # (all but the input, which is the plan's input batch) are alive together at its start
    graph = _step_graph(_mlp(), 2)
    creation_kept, _ = memory_graph.live_bytes(graph)
    for seed in range(1, 6):
        kept, peak = memory_graph.live_bytes(graph, memory_graph.executor_order(graph, seed))
        assert kept == creation_kept == 2 * 4 * (8 + 16 + 4)
        assert peak >= kept - 2 * 4 * 8


def test_the_slack_over_several_orders_covers_the_creation_order_and_repeats_by_seed():
    model = keras.Sequential([keras.Input((6, 6, 2)),
                              keras.layers.Conv2D(8, 3, padding="same", activation="relu"),
                              keras.layers.MaxPooling2D(2), keras.layers.Flatten(),
                              keras.layers.Dense(16, activation="relu"), keras.layers.Dense(3)])
    one = memory_graph.pool_slack(model, 64, slots=2, orders=1)
    several = memory_graph.pool_slack(model, 64, slots=2, orders=4, seed=7)
    assert several >= one >= 0
    assert memory_graph.pool_slack(model, 64, slots=2, orders=4, seed=7) == several
    with pytest.raises(ConfigError, match="orders=0"):
        memory_graph.pool_slack(model, 64, orders=0)


def test_the_transient_is_the_largest_kept_tensor_the_step_makes_not_its_input():
    # the input (64 floats) is the largest tensor the kernel's gradient reads, but no gradient
    # of the input is made: the transient is the hidden ReLU output's (8 floats)
    model = keras.Sequential([keras.Input((64,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    kept, largest = memory_graph.saved_bytes(model, 4)
    assert (kept, largest) == (4 * 4 * (64 + 8 + 2), 4 * 4 * 8)


def _weight_heavy():
    # two kernels without biases: 64 x 64 and 64 x 2 (4,224 parameters), tiny activations
    return keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, use_bias=False),
                             keras.layers.Dense(2, use_bias=False)])


def test_sgd_update_keeps_a_momentum_slot_and_one_weight_sized_buffer_from_the_graph():
    # tf_keras's SGD writes m = -g * lr + m * momentum, then w += m, with m kept at momentum
    # 0: a slot per parameter, and m * momentum (made before any gradient) waits beside them
    model = _weight_heavy()
    params = model.count_params()
    slots, update, early = memory_graph.optimizer_update(model, "sgd")
    assert slots == 4 * params
    assert early == 4 * params  # both m * momentum buffers, alive through the backward pass
    assert 4 * 64 * 64 <= update <= 4 * params
    result = plan.plan_memory(model, batch_size=4, optimizer="sgd", input_batches=1)
    assert result.breakdown["optimizer slots"] == 4 * params
    assert result.breakdown["optimizer update"] == 4 * params
    # another optimizer, as a suggestion would try it, falls back on the rule per optimizer
    other = plan.breakdown(memory_graph.traced_profile(model), plan.PlanSettings(
        batch_size=4, optimizer="adam").checked())
    assert other["optimizer slots"] == 8 * params and other["optimizer update"] == 0


def test_adam_update_holds_two_buffers_since_two_ops_read_each_gradient():
    # g - m and square(g) both read the gradient: the executor may run them at once, so
    # neither writes into it; no weight-sized update op runs before a gradient exists
    model = _weight_heavy()
    slots, update, early = memory_graph.optimizer_update(model, "adam")
    assert slots == 8 * model.count_params()
    assert early < 4 * 64  # scalars (the bias corrections), not a weight-sized buffer
    assert update >= 2 * 4 * 64 * 64


def test_exclusive_replay_writes_in_place_only_into_a_buffer_read_once():
    import tensorflow as tf

    @tf.function(autograph=False)
    def step(x):
        y = tf.exp(x)
        return tf.reduce_sum(tf.sqrt(y) + tf.square(y))

    graph = step.get_concrete_function(tf.TensorSpec((256,), tf.float32)).graph

    def made(exclusive):
        return [n for n, size, _ in memory_graph.step_buffers(graph, exclusive=exclusive)
                if size == 1024]

    # Exp's output is read by Sqrt and Square: in order, Square (its last reader) may take
    # it; replayed exclusively, both get a buffer of their own
    assert len(made(False)) + 1 == len(made(True))


def _zoo_cnn():
    from tfaccel.train import models

    return models.build_model("cnn", (8, 8, 1), 10)


def test_a_kernels_buffers_are_replayed_after_its_output_and_freed_before_the_next_op():
    import tensorflow as tf

    @tf.function(autograph=False)
    def step(x, w):
        return tf.reduce_sum(tf.tanh(tf.matmul(x, w)))

    graph = step.get_concrete_function(tf.TensorSpec((64, 32), tf.bfloat16),
                                       tf.TensorSpec((32, 16), tf.bfloat16)).graph
    buffers = memory_graph.kernel_buffers(graph, onednn=False)
    assert list(buffers.values()) == [(4 * 64 * 32, 4 * 32 * 16, 4 * 64 * 16)]
    events = memory_graph.step_buffers(graph, workspaces=buffers)
    start = next(i for i, e in enumerate(events) if e[0].endswith("MatMul:0"))
    name = next(iter(buffers))
    assert events[start + 1:start + 7] == [
        (f"{name}:workspace:0", 4 * 64 * 32, True), (f"{name}:workspace:1", 4 * 32 * 16, True),
        (f"{name}:workspace:2", 4 * 64 * 16, True), (f"{name}:workspace:2", None, None),
        (f"{name}:workspace:1", None, None), (f"{name}:workspace:0", None, None)]
    # given as one sum, one buffer
    one = memory_graph.step_buffers(graph, workspaces={name: sum(buffers[name])})
    assert [e for e in one if ":workspace" in e[0]] == [
        (f"{name}:workspace:0", sum(buffers[name]), True), (f"{name}:workspace:0", None, None)]


def test_the_replay_holds_a_convolutions_two_gradient_workspaces_at_once():
    model = _zoo_cnn()
    off = memory_graph.pool_replay(model, 256, slots=1, onednn=False, orders=1)
    on = memory_graph.pool_replay(model, 256, slots=1, onednn=True, orders=1)
    assert on.workspaces == 0
    # conv_1's two 14.2 MB buffers alive together, less what the step frees meanwhile
    assert 2 * 192 * 64 * 288 * 4 * 0.8 < off.workspaces <= 2 * 192 * 64 * 288 * 4
    assert memory_graph.pool_slack(model, 256, slots=1, orders=1) == \
        memory_graph.pool_replay(model, 256, slots=1, orders=1).slack


