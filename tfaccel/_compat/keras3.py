"""Private touchpoints: Keras 3 (the `keras` package), for the bridge to tf_keras and the
learning rate a step used."""
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


def last_learning_rate(optimizer):
    """The learning rate the last step of `optimizer` (of either Keras) used, as a float.

    tf_keras's `optimizer.learning_rate` holds it (a schedule is evaluated at the
    optimizer's `iterations`). Keras 3's is the schedule at the current step, the
    rate of the *next* step; for Keras 3 this evaluates the schedule one step
    back. Relies on the private `BaseOptimizer._learning_rate` (the schedule)
    and `_iterations` (the steps counted as the schedule counts them, batches
    under gradient accumulation). Checked: Keras 3.15.
    """

    # deferred: tf_keras (tfaccel.keras loads it)
    from tfaccel.keras import is_keras3_object, keras, keras3

    if not is_keras3_object(optimizer):
        lr = getattr(optimizer, "learning_rate", None)
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            lr = lr(optimizer.iterations)
        return float(keras.backend.get_value(lr))
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
