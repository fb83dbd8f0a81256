"""Keras 3 models written the way users write them, for `--model_fn=user_models_keras3:<name>`.

Importable in a recipe subprocess with this directory on PYTHONPATH (as tests/user_models.py).
"""

import keras

L = keras.layers


def residual_cnn(input_shape, num_classes):
    """Issue 17's model: Conv2D, BatchNorm, DepthwiseConv2D, a residual Add, pooling, Dropout and
    Dense, functional Keras 3."""
    inputs = keras.Input(input_shape, name="image")
    x = L.ReLU(name="relu_0")(L.BatchNormalization(momentum=0.9, name="bn_0")(
        L.Conv2D(16, 3, padding="same", name="conv_0")(inputs)))
    y = L.ReLU(name="relu_1")(L.BatchNormalization(momentum=0.9, name="bn_1")(
        L.DepthwiseConv2D(3, padding="same", name="depthwise")(x)))
    x = L.MaxPooling2D(name="pool")(L.Add(name="residual")([x, y]))
    x = L.Conv2D(32, 3, padding="same", activation="relu", name="conv_1")(x)
    x = L.Dropout(0.2, name="dropout")(L.Flatten(name="flatten")(x))
    x = L.Dense(64, activation="relu", name="dense")(x)
    return keras.Model(inputs, L.Dense(num_classes, activation="softmax", name="head")(x),
                       name="residual_k3")


class Doubler(L.Layer):
    """A user's own layer: no translation to tf_keras exists for it."""

    def call(self, x):
        return 2.0 * x


def with_custom_layer(input_shape, num_classes):
    inputs = keras.Input(input_shape)
    x = Doubler(name="my_doubler")(L.Flatten()(inputs))
    return keras.Model(inputs, L.Dense(num_classes, activation="softmax")(x), name="custom")


class Classifier(keras.Model):
    def __init__(self, num_classes):
        super().__init__()
        self.flatten, self.head = L.Flatten(), L.Dense(num_classes, activation="softmax")

    def call(self, x):
        return self.head(self.flatten(x))


def subclassed(input_shape, num_classes):
    return Classifier(num_classes)
