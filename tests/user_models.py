"""Models written the way users write them, for `--model_fn=user_models:<name>` runs in tests.

Importable in a recipe subprocess with this directory on PYTHONPATH, e.g.
`run_recipe("optimize", "--model_fn=user_models:functional_resnet",
env={"PYTHONPATH": TESTS_DIR})`.
"""

import tf_keras as keras


def _conv_bn(x, filters, name, stride=1, relu=True):
    x = keras.layers.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False,
                            name=f"{name}_conv")(x)
    x = keras.layers.BatchNormalization(name=f"{name}_bn")(x)
    return keras.layers.ReLU(name=f"{name}_relu")(x) if relu else x


def _residual_block(input_shape, filters, name):
    """A downsampling residual block as its own functional model (nested in the ResNet)."""
    inputs = keras.Input(input_shape, name=f"{name}_in")
    y = _conv_bn(inputs, filters, f"{name}_a", stride=2)
    y = _conv_bn(y, filters, f"{name}_b", relu=False)
    shortcut = keras.layers.Conv2D(filters, 1, strides=2, use_bias=False,
                                   name=f"{name}_proj")(inputs)
    shortcut = keras.layers.BatchNormalization(name=f"{name}_proj_bn")(shortcut)
    outputs = keras.layers.ReLU(name=f"{name}_out")(
        keras.layers.Add(name=f"{name}_add")([y, shortcut]))
    return keras.Model(inputs, outputs, name=name)


def functional_resnet(input_shape, num_classes):
    """Conv+BN+ReLU blocks, two residual Adds (one inside a nested sub-model), a Dense head."""
    inputs = keras.Input(input_shape, name="pixels")
    x = _conv_bn(inputs, 32, "stem")
    y = _conv_bn(x, 32, "res1_a")
    y = _conv_bn(y, 32, "res1_b", relu=False)
    x = keras.layers.ReLU(name="res1_out")(keras.layers.Add(name="res1_add")([x, y]))
    x = _residual_block(tuple(x.shape[1:]), 64, "res2")(x)
    x = keras.layers.GlobalAveragePooling2D(name="gap")(x)
    outputs = keras.layers.Dense(num_classes, activation="softmax", name="classes")(x)
    return keras.Model(inputs, outputs, name="functional_resnet")


class TinySubclassed(keras.Model):
    def __init__(self, num_classes):
        super().__init__(name="tiny_subclassed")
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(32, activation="relu")
        self.out = keras.layers.Dense(num_classes, activation="softmax")

    def call(self, inputs):
        return self.out(self.hidden(self.flatten(inputs)))


def subclassed(input_shape, num_classes):
    """A subclassed model (no input shape until it is called)."""
    return TinySubclassed(num_classes)
