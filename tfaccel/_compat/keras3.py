"""Private touchpoints: Keras 3 (the `keras` package), for the bridge to tf_keras."""


def is_keras3_functional(model):
    """True for a Keras 3 functional model (`keras.Model(inputs, outputs)`, or a subclass of one).

    Keras 3 exports no `Functional` class; relies on
    `keras.src.models.functional.Functional`. Checked: Keras 3.15.
    """
    from tfaccel.keras import keras3

    return isinstance(model, keras3().src.models.functional.Functional)


def keras3_operations(model):
    """Every operation of a Keras 3 functional model's graph, in order: layers and raw ops.

    `model.layers` leaves out the operations that are not layers (`x * 2`,
    `keras.ops.relu(x)`), which no config translation can carry over; relies on
    Keras 3's private `Functional._operations`. Checked: Keras 3.15.
    """
    return list(model._operations)
