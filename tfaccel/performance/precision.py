"""Mixed precision and XLA: set them safely, or measure and keep the fastest.

`set_precision` sets the tf_keras global dtype policy (float32,
mixed_float16 or mixed_bfloat16); set it before building the model.
`apply_precision` makes any model (zoo, loaded from a file, user-built) compute
under a policy while the layers that produce its outputs stay float32, so the
softmax and the loss never run in half precision. `wrap_optimizer` adds
dynamic loss scaling for float16, and `scaled_gradients` does the same in a
custom training loop. `precision_advice` says when a choice will not pay off
on this hardware.

`auto_select` (the recipes' `--precision=auto` and `--jit_compile=auto`) trains
each candidate for a few steps on the actual model and data and keeps the
fastest, never one slower than float32 without XLA.

Example:

    from tfaccel.performance import precision
    from tfaccel.train import training

    precision.set_precision("mixed_float16")
    model = precision.apply_precision(build_my_model(), "mixed_float16")
    optimizer = precision.wrap_optimizer(training.make_optimizer("adam", 1e-3), "mixed_float16")
    training.compile_classifier(model, optimizer)
"""

import contextlib
import dataclasses

import tensorflow as tf
from absl import logging

from tfaccel.choices import JIT_CHOICES, PRECISIONS
from tfaccel.errors import ConfigError, ModelError
from tfaccel.keras import ensure_tf_keras, keras

BASELINE = ("float32", False)
"""The setting `auto_select` compares against and falls back to."""
MIN_SPEEDUP = 1.05
"""How much faster than the baseline `auto_select` needs another setting to measure."""
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
    """Sets the tf_keras global dtype policy; returns the previous policy's name."""
    check_precision(name)
    previous = keras.mixed_precision.global_policy().name
    keras.mixed_precision.set_global_policy(name)
    return previous


@contextlib.contextmanager
def precision_scope(name):
    """Sets the global policy to `name` inside the block and restores it after."""
    previous = set_precision(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def precision_advice(name, gpus=None, cpu_flags=None):
    """Warnings for a precision that will not speed training up on this hardware.

    float16 pays off on GPUs of compute capability >= 7.0 (Tensor Cores),
    bfloat16 on >= 8.0; on CPUs bfloat16 needs AVX512_BF16 or AMX, and float16
    has no fast CPU path at all.

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
    if name == "mixed_float16":
        return [("no GPU: mixed_float16 has no fast path on CPUs and trains slower than "
                 "float32; use it here only to check correctness, or use --precision=auto")]
    flags = _cpu_flags() if cpu_flags is None else cpu_flags
    if not {"avx512_bf16", "amx_bf16"} & set(flags):
        return [("this CPU has no bfloat16 instructions (AVX512_BF16 or AMX): mixed_bfloat16 "
                 "will train slower than float32; use float32 or --precision=auto")]
    return []


def _visible_gpus():
    gpus = []
    for gpu in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(gpu)
        gpus.append({"name": details.get("device_name", gpu.name),
                     "compute_capability": details.get("compute_capability", (0, 0))})
    return gpus


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _output_layers(model):
    if isinstance(model, keras.Sequential):
        return [model.layers[-1]]
    return list(getattr(model, "_output_layers", []))


def outputs_are_float32(model):
    """True when every output of `model` is float32."""
    return all(t.dtype == tf.float32 for t in tf.nest.flatten(model.outputs))


def _matches(model, name):
    outputs = {id(layer) for layer in _output_layers(model)}
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer) or id(layer) in outputs:
            continue
        if layer.dtype_policy.name != name:
            return False
    return outputs_are_float32(model)


def _clone(model, name, float32_outputs):
    outputs = {id(layer) for layer in _output_layers(model)} if float32_outputs else set()

    def clone_layer(layer):
        if isinstance(layer, keras.Model):
            return _clone(layer, name, float32_outputs=False)
        config = layer.get_config()
        config["dtype"] = "float32" if id(layer) in outputs else name
        try:
            return layer.__class__.from_config(config)
        except Exception as e:  # noqa: BLE001 (a user layer whose from_config rejects a dtype)
            raise ModelError(f"cannot rebuild layer {layer.name!r} ({type(layer).__name__}) under "
                             f"{name} ({type(e).__name__}: {e}): set the policy before building "
                             "the model instead") from None

    clone = keras.models.clone_model(model, clone_function=clone_layer)
    clone.set_weights(model.get_weights())
    return clone


def apply_precision(model, name):
    """`model` computing under policy `name`, with float32 outputs.

    A model already built under `name` whose outputs are float32 (every zoo
    model built after `set_precision`) is returned as is. Otherwise a
    Functional or Sequential model (e.g. loaded from a file, or ending in
    `Dense(activation='softmax')`) is rebuilt with the same weights, its
    hidden layers under `name` and its output layers in float32.

    Args:
      model: a built tf_keras model.
      name: a precision (see `PRECISIONS`).

    Returns:
      `model` or its rebuilt copy (not compiled).

    Raises:
      ConfigError: unknown precision.
      ModelError: a subclassed model whose layers (but the last, which must be
        float32) do not already compute under `name`: build it after
        `set_precision` and end it in a layer with dtype='float32'.
    """
    check_precision(name)
    ensure_tf_keras(model)
    graph_model = isinstance(model, keras.Sequential) or getattr(model, "_is_graph_network", False)
    if not graph_model:
        *hidden, last = model.layers or [None]
        if last is not None and last.dtype_policy.name == "float32" and \
                all(layer.dtype_policy.name == name for layer in hidden):
            return model
        raise ModelError(f"model {model.name!r} is a subclassed model that does not compute under "
                         f"{name} with float32 outputs: build it after set_precision({name!r}) "
                         "and end it in a layer with dtype='float32'")
    return model if _matches(model, name) else _clone(model, name, float32_outputs=True)


def layer_dtypes(model):
    """Rows {'layer', 'type', 'compute_dtype', 'variable_dtype'}: which layer computes in what."""
    return [{"layer": layer.name, "type": type(layer).__name__,
             "compute_dtype": layer.compute_dtype, "variable_dtype": layer.variable_dtype}
            for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]


def wrap_optimizer(optimizer, name):
    """Wraps `optimizer` in a dynamic `LossScaleOptimizer` for mixed_float16; else returns it.

    float16 gradients underflow without loss scaling; bfloat16 has float32's
    range and needs none.
    """
    check_precision(name)
    scaled = isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer)
    if name == "mixed_float16" and not scaled:
        return keras.mixed_precision.LossScaleOptimizer(optimizer)
    return optimizer


def scaled_gradients(tape, loss, variables, optimizer):
    """Gradients of `loss` for a custom loop, loss-scaled when `optimizer` is a LossScaleOptimizer.

    Call after the `GradientTape` block; pass the result to
    `optimizer.apply_gradients`, which skips the step (and lowers the scale)
    when a gradient is not finite.
    """
    if isinstance(optimizer, keras.mixed_precision.LossScaleOptimizer):
        with tape:  # re-entering the tape records the scaling
            scaled = optimizer.get_scaled_loss(loss)
        return optimizer.get_unscaled_gradients(tape.gradient(scaled, variables))
    return tape.gradient(loss, variables)


@dataclasses.dataclass(frozen=True)
class AutoChoice:
    """What `auto_select` measured and kept."""

    precision: str
    jit_compile: bool
    table: tuple
    """One dict per candidate: precision, jit_compile, ms_per_step, examples_per_sec, speedup."""


def choose_fastest(timings, baseline=BASELINE, min_speedup=1.0):
    """The fastest setting of `timings`, never one slower than `baseline`.

    Args:
      timings: {(precision, jit_compile): seconds_per_step}; must include `baseline`.
      baseline: the setting to beat (float32 without XLA unless the precision is fixed).
      min_speedup: another setting wins only if it is at least this many times
        faster than the baseline (1.0: any measured gain).

    Returns:
      The chosen (precision, jit_compile).
    """
    if baseline not in timings:
        raise ConfigError(f"timings of {sorted(timings)} lack the baseline {baseline}")
    best = min(timings, key=timings.get)
    if timings[baseline] / timings[best] < min_speedup:
        return baseline
    return best


def _default_compile(model, precision, jit_compile):
    from tfaccel.train.training import compile_classifier

    compile_classifier(model, wrap_optimizer(keras.optimizers.Adam(1e-3), precision),
                       jit_compile=jit_compile)


def auto_select(model, dataset, batch_size, precisions=PRECISIONS, jit_options=(False, True),
                compile_fn=None, warmup=2, steps=8, rounds=3, drop_slower_than=3.0,
                min_speedup=MIN_SPEEDUP):
    """Times precision and XLA settings on `model` and `dataset`, and keeps the fastest.

    First every precision is timed without XLA, then XLA on and off for the
    fastest precision (a coordinate search: 4 settings instead of 6 for
    `--precision=auto --jit_compile=auto`). Each setting trains its own copy of
    `model` (same weights; `model` itself is untouched), compiled and warmed up
    first; then the settings take turns for `rounds` rounds of `steps` steps,
    so that other load on the machine hits them alike, and each keeps its best
    round (the median step time of a round; contention only ever slows a
    round down). A setting more than `drop_slower_than` times slower than the
    best after a round cannot win and is not timed again. A round of a setting
    is cut to the steps that fit in `drop_slower_than` times the fastest
    setting's round (at least one; paced by the last step time known, the
    warm-up's at first), so that a setting 100x slower (float16 on most CPUs)
    costs a few steps, not a long round. The baseline is
    float32 without XLA (or the one precision given, without XLA), and another
    setting wins only if it measured at least `min_speedup` times faster (5%
    by default: smaller gaps are within a short trial's noise, and XLA or half
    precision bring costs of their own), so the choice is never slower than
    the baseline as measured. The global policy is restored.

    Example:

        choice = auto_select(model, train_ds, batch_size=64)
        print(choice.precision, choice.jit_compile)

    Args:
      model: a built Functional or Sequential tf_keras model.
      dataset: the batched training dataset.
      batch_size: its global batch size (for examples/s).
      precisions: candidate precisions, e.g. `PRECISIONS` or ('mixed_float16',).
      jit_options: candidate XLA settings, e.g. (False, True) or (False,).
      compile_fn: `fn(model, precision, jit_compile)` compiling a copy as training
        will (default: classifier loss, Adam, loss scaling for float16).
      warmup: untimed steps of each setting (tracing, XLA compilation).
      steps: timed steps per round.
      rounds: timed rounds per setting.
      drop_slower_than: see above.
      min_speedup: see `choose_fastest`.

    Returns:
      An `AutoChoice` whose table lists every setting tried.
    """
    from tfaccel import monitor
    from tfaccel.performance import memory

    precisions = tuple(check_precision(p) for p in precisions)
    jit_options = tuple(bool(j) for j in jit_options)
    if not precisions or not jit_options:
        raise ConfigError("auto_select needs at least one precision and one jit_compile option")
    compile_fn = compile_fn or _default_compile
    first_jit = False if False in jit_options else jit_options[0]
    baseline = ("float32" if "float32" in precisions else precisions[0], first_jit)
    copies, timings, measured_rounds, probes = {}, {}, {}, {}

    def prepare(key):
        with precision_scope(key[0]):
            copies[key] = _clone(model, key[0], float32_outputs=True)
            compile_fn(copies[key], *key)
            probes[key] = monitor.time_training(copies[key], dataset, batch_size, warmup,
                                                1)["seconds_per_step"]

    def measure(keys):
        active = list(keys)
        for _ in range(rounds):
            pace = {k: timings.get(k, probes[k]) for k in active}
            budget = drop_slower_than * steps * min(pace.values())
            for key in active:  # a far slower setting gets fewer steps (>= 1), not a long round
                n = max(1, min(steps, int(budget / pace[key])))
                seconds = monitor.time_training(copies[key], dataset, batch_size, 1,
                                                n)["seconds_per_step"]
                timings[key] = min(timings.get(key, float("inf")), seconds)
                measured_rounds[key] = measured_rounds.get(key, 0) + 1
                logging.info("auto trial %s jit_compile=%s: %.2f ms/step", *key, 1000 * seconds)
            fastest = min(timings[k] for k in active)
            active = [k for k in active if timings[k] <= drop_slower_than * fastest]

    try:
        stage1 = [(p, first_jit) for p in sorted(precisions, key=lambda p: p != baseline[0])]
        for key in stage1:
            prepare(key)
        measure(stage1)
        best_precision = choose_fastest(timings, baseline, min_speedup)[0]
        for key in [k for k in stage1 if k[0] != best_precision and k != baseline]:
            del copies[key]
        stage2 = [(best_precision, jit) for jit in jit_options]
        if len(stage2) > 1:
            for key in stage2:
                if key not in copies:
                    prepare(key)
            measure(stage2)
    finally:
        copies.clear()
        memory.free_memory()
    table = tuple({"precision": p, "jit_compile": j, "ms_per_step": 1000 * t,
                   "examples_per_sec": batch_size / t, "speedup": timings[baseline] / t,
                   "rounds": measured_rounds[(p, j)]} for (p, j), t in timings.items())
    chosen = choose_fastest(timings, baseline, min_speedup)
    return AutoChoice(precision=chosen[0], jit_compile=chosen[1], table=table)
