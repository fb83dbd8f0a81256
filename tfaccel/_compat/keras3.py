"""Private touchpoints: Keras 3 (the `keras` package), for the bridge to tf_keras."""
import numpy as np


def is_keras3_functional(model):
    """True for a Keras 3 functional model (`keras.Model(inputs, outputs)`, or a subclass of one).

    Keras 3 exports no `Functional` class; relies on
    `keras.src.models.functional.Functional`. Checked: Keras 3.15.
    """
    from tfaccel.keras import keras3  # deferred: tf_keras (tfaccel.keras loads it)

    return isinstance(model, keras3().src.models.functional.Functional)


def keras3_operations(model):
    """Every operation of a Keras 3 functional model's graph, in order: layers and raw ops.

    `model.layers` leaves out the operations that are not layers (`x * 2`,
    `keras.ops.relu(x)`), which no config translation can carry over; relies on
    Keras 3's private `Functional._operations`. Checked: Keras 3.15.
    """
    return list(model._operations)


def keras3_last_learning_rate(optimizer):
    """The learning rate a Keras 3 optimizer's last step used (a float).

    Keras 3's `optimizer.learning_rate` is the schedule at the current step, the
    rate of the *next* step, where tf_keras's holds the rate of the last one;
    this evaluates the schedule one step back. Relies on the private
    `BaseOptimizer._learning_rate` (the schedule) and `_iterations` (the steps
    counted as the schedule counts them, batches under gradient accumulation).
    Checked: Keras 3.15.
    """

    from tfaccel.keras import keras3  # deferred: tf_keras (tfaccel.keras loads it)

    schedule = optimizer._learning_rate
    if not isinstance(schedule, keras3().optimizers.schedules.LearningRateSchedule):
        return float(np.asarray(optimizer.learning_rate))
    step = max(int(np.asarray(optimizer._iterations)) - 1, 0)
    return float(np.asarray(schedule(step)))


def keras_hub_seeded_cache(causal_lm, token_ids):
    """A KerasHub causal LM's key/value cache for `token_ids` `[batch, T]`, seeded by one
    forward pass over them (what its `generate` starts from).

    Relies on the private `CausalLM._build_cache(token_ids)` -> (hidden states, cache) that
    KerasHub's text causal LMs (GPT-2, Llama, Mistral, Gemma, Qwen, ...) define for their
    `generate_step`; the cache is then advanced with their public `call_with_cache`.
    Checked: keras-hub 0.32.0 (GPT2CausalLM).
    """
    return causal_lm._build_cache(token_ids)[1]
