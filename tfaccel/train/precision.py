"""Mixed precision and XLA settings: checked, set safely on any model, loss-scaled for float16.

`set_precision` sets the global dtype policy (float32, mixed_float16 or
mixed_bfloat16) of tf_keras, and of Keras 3 when it is loaded; set it before
building the model. Every helper here works on models of either Keras
(`tfaccel.keras.flavour_of`).
`apply_precision` makes any model (zoo, loaded from a file, user-built) compute
under a policy while the layers that produce its outputs stay float32, so the
softmax and the loss never run in half precision. `wrap_optimizer` adds
dynamic loss scaling for float16, and `scaled_gradients` does the same in a
custom training loop. `precision_advice` says when a choice will not pay off
on this hardware. `apply_precision(model, "float32")` is also how tfaccel makes
the float32 copy of a mixed precision model that quantization and export need.

Measuring which precision and XLA setting is fastest (the recipes'
`--precision=auto` and `--jit_compile=auto`) is `tfaccel.performance.trials`.

Example:

    from tfaccel.train import precision
    from tfaccel.train import training

    precision.set_precision("mixed_float16")
    model = precision.apply_precision(build_my_model(), "mixed_float16")
    optimizer = precision.wrap_optimizer(training.make_optimizer("adam", 1e-3), "mixed_float16")
    training.compile_classifier(model, optimizer)
"""

import contextlib

import tensorflow as tf

from tfaccel import _compat, doctor
from tfaccel.choices import JIT_CHOICES, PRECISIONS
from tfaccel.errors import ConfigError, ModelError, first_line
from tfaccel.keras import (
    clone_with_weights,
    keras,
    keras_of,
    rebuild_from_config,
    set_global_policy,
)

_MIN_CAPABILITY = {"mixed_float16": (7, 0), "mixed_bfloat16": (8, 0)}


def check_precision(name, allow_auto=False):
    """Returns `name` if it is a known precision, else raises ConfigError."""
    choices = PRECISIONS + (("auto",) if allow_auto else ())
    if name not in choices:
        raise ConfigError(f"unknown precision {name!r}: use one of {', '.join(choices)}")
    return name


def parse_jit_compile(value):
    """True, False or 'auto' from a bool or 'true'/'false'/'auto' (any case)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text not in JIT_CHOICES:
        raise ConfigError(f"jit_compile={value!r}: use one of {', '.join(JIT_CHOICES)}")
    return "auto" if text == "auto" else text == "true"


def set_precision(name):
    """Sets the global dtype policy of tf_keras and, if imported, Keras 3; returns the previous
    (tf_keras) policy's name.

    Keras 3 is not imported for this: a program that has not imported it builds no Keras 3 model.
    """
    return set_global_policy(check_precision(name))


@contextlib.contextmanager
def precision_scope(name):
    """Sets the global policy to `name` inside the block and restores it after."""
    previous = set_precision(name)
    try:
        yield
    finally:
        set_precision(previous)


def precision_advice(name, gpus=None, cpu_flags=None):
    """Warnings for a precision that will not speed training up on this hardware.

    float16 pays off on GPUs of compute capability >= 7.0 (Tensor Cores),
    bfloat16 on >= 8.0. On CPUs bfloat16 needs AMX-BF16 or AVX512_BF16
    (`doctor.MATRIX_INSTRUCTIONS`), and float16 has no fast TensorFlow path
    even where the CPU has float16 math (AVX512_FP16, AMX-FP16): TensorFlow
    2.21's CPU training kernels do not use it.

    Args:
      name: a precision.
      gpus: [{'name': str, 'compute_capability': (major, minor)}] (default: the visible GPUs).
      cpu_flags: set of CPU feature flags (default: read from /proc/cpuinfo).

    Returns:
      A list of one-line warnings (empty when the choice can help).
    """
    if name not in _MIN_CAPABILITY:
        return []
    gpus = _visible_gpus() if gpus is None else gpus
    if gpus:
        need = _MIN_CAPABILITY[name]
        return [f"{name} will not speed up GPU {i} ({g['name']}, compute capability "
                f"{g['compute_capability'][0]}.{g['compute_capability'][1]}): it needs "
                f">= {need[0]}.{need[1]}; use float32 or --precision=auto"
                for i, g in enumerate(gpus) if tuple(g["compute_capability"]) < need]
    matrix = doctor.matrix_instructions(doctor.cpu_flags() if cpu_flags is None else cpu_flags)
    if name == "mixed_float16":
        has = (f"this CPU's {'/'.join(doctor.instruction_name(f) for f in matrix['fp16'])} "
               "float16 math is not used by TensorFlow's training kernels, so "
               if matrix["fp16"] else "")
        return [(f"no GPU: {has}mixed_float16 has no fast path on CPUs and trains far slower "
                 "than float32; use it here only to check correctness, or use --precision=auto")]
    if not matrix["bf16"]:
        return [("this CPU has no bfloat16 instructions (AMX-BF16 or AVX512_BF16): "
                 "mixed_bfloat16 will train slower than float32; use float32 or --precision=auto")]
    return []


def auto_candidates(precisions=PRECISIONS, gpus=None, cpu_flags=None):
    """The precisions worth timing for `--precision=auto` on this hardware: float32 always,
    each other one only where `precision_advice` has nothing against it (mixed_float16 on a
    CPU, or bfloat16 without AMX-BF16/AVX512_BF16, would spend the trials' budget on a
    setting known to lose).

    >>> auto_candidates(gpus=[], cpu_flags={"avx2", "fma"})
    ('float32',)
    """
    return tuple(p for p in precisions
                 if p == "float32" or not precision_advice(p, gpus=gpus, cpu_flags=cpu_flags))


def _visible_gpus():
    gpus = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        gpus.append({"name": details.get("device_name", gpu.name),
                     "compute_capability": details.get("compute_capability", (0, 0))})
    return gpus


def outputs_are_float32(model):
    """True when every output of `model` is float32."""
    return all(t.dtype == tf.float32 for t in tf.nest.flatten(model.outputs))


def _clone(model, name):
    """A copy of a graph model with the same weights, its layers under `name`.

    The layers producing the outputs are float32; a nested model is cloned the
    same way, all its layers under `name`.
    """
    outputs = {id(layer) for layer in _compat.output_layers(model)}

    def clone_layer(layer):
        config = layer.get_config()
        config["dtype"] = "float32" if id(layer) in outputs else name
        try:
            return layer.__class__.from_config(config)
        except Exception as e:  # noqa: BLE001 (a user layer whose from_config rejects a dtype)
            raise ModelError(f"cannot rebuild layer {layer.name!r} ({type(layer).__name__}) under "
                             f"{name} ({first_line(e, with_type=True)}): set the policy before "
                             "building the model instead") from None

    return clone_with_weights(model, clone_layer)


def _computes_under(model, name, outputs=()):
    input_layer = keras_of(model).layers.InputLayer
    return all(layer.dtype_policy.name == name for layer in model.layers
               if not (isinstance(layer, input_layer) or id(layer) in outputs))


def apply_precision(model, name, *, copy=False):
    """`model` computing under policy `name`, never broken, never of another class.

    A model whose layers already compute under `name` is returned as is: with
    float32 outputs (every zoo model built after `set_precision`), or of a class
    of its own (a KerasHub `GPT2CausalLM` keeps its outputs and its `generate()`;
    Keras 3's losses compute in float32 whatever the outputs' dtype). Otherwise
    a plain Functional or Sequential model (e.g. loaded from a file, or ending in
    `Dense(activation='softmax')`) is rebuilt with the same weights, its hidden
    layers under `name` and its output layers in float32; a model of another
    class (KerasHub tasks and backbones, subclassed models with a config) is
    rebuilt from its own config under `name`, same class, same weights.
    `apply_precision(model, "float32")` is the float32 copy of a mixed
    precision model (for quantization, export, size reports).

    Args:
      model: a built model of either Keras.
      name: a precision (see `PRECISIONS`).
      copy: always return a new model (same weights), even when `model`
        already computes under `name`: for trials that train a copy each.

    Returns:
      `model` or its rebuilt copy (not compiled).

    Raises:
      ConfigError: unknown precision.
      ModelError: a model that must be rebuilt and whose class cannot be rebuilt from its
        config (one line: build it under `set_precision(name)` instead).
    """
    check_precision(name)
    if _compat.is_plain_graph_model(model):
        outputs = {id(layer) for layer in _compat.output_layers(model)}
        if outputs_are_float32(model) and _computes_under(model, name, outputs) and not copy:
            return model
        return _clone(model, name)
    if _computes_under(model, name) and not copy:
        return model
    if not copy and not _compat.is_graph_network(model):
        *hidden, last = model.layers or [None]
        if last is not None and last.dtype_policy.name == "float32" and \
                all(layer.dtype_policy.name == name for layer in hidden):
            return model
    rebuilt = rebuild_from_config(model, name)
    if rebuilt is None:
        kind = "subclassed model" if not _compat.is_graph_network(model) else "model"
        raise ModelError(f"{kind} {model.name!r} ({type(model).__name__}) does not compute "
                         f"under {name} and cannot be rebuilt from its config with the same "
                         f"weights: build it after set_precision({name!r}) (a KerasHub model: "
                         f"its backbone with dtype={name!r})")
    return rebuilt


def layer_dtypes(model):
    """Rows {'layer', 'type', 'compute_dtype', 'variable_dtype'}: which layer computes in what."""
    input_layer = keras_of(model).layers.InputLayer
    return [{"layer": layer.name, "type": type(layer).__name__,
             "compute_dtype": layer.compute_dtype, "variable_dtype": layer.variable_dtype}
            for layer in model.layers if not isinstance(layer, input_layer)]


def wrap_optimizer(optimizer, name):
    """Wraps `optimizer` in a dynamic `LossScaleOptimizer` for mixed_float16; else returns it.

    float16 gradients underflow without loss scaling; bfloat16 has float32's
    range and needs none.
    """
    check_precision(name)
    scale = keras_of(optimizer).mixed_precision.LossScaleOptimizer
    if name == "mixed_float16" and not isinstance(optimizer, scale):
        return scale(optimizer)
    return optimizer


def scaled_gradients(tape, loss, variables, optimizer):
    """Gradients of `loss` for a custom loop, loss-scaled when `optimizer` is a LossScaleOptimizer.

    Call after the `GradientTape` block; pass the result to
    `optimizer.apply_gradients`, which skips the step (and lowers the scale)
    when a gradient is not finite. Keras 3's optimizer unscales them there,
    tf_keras's here.
    """
    optimizer_keras = keras_of(optimizer)
    if not isinstance(optimizer, optimizer_keras.mixed_precision.LossScaleOptimizer):
        return tape.gradient(loss, variables)
    tf_keras = optimizer_keras is keras
    with tape:  # re-entering the tape records the scaling
        scaled = optimizer.get_scaled_loss(loss) if tf_keras else optimizer.scale_loss(loss)
    if tf_keras:
        return optimizer.get_unscaled_gradients(tape.gradient(scaled, variables))
    return tape.gradient(scaled, variables)  # Keras 3's apply_gradients unscales them
