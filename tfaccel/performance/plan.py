"""Will this model train on this device, and with which settings? A memory plan.

`plan_memory(profile, settings)` adds up, per device, what a training step keeps
alive at its peak: the model states (float32 weights, gradients, optimizer slots,
the 16-bit weight casts of mixed precision, under gradient accumulation the
accumulator carried into a micro-batch and its sum with that micro-batch's
gradients), the activations one micro-batch keeps for the backward pass (with
or without recomputation; under a pipeline, every micro-batch in flight on the
stage), the gradient of the largest activation, alive beside them in the backward
pass (two, while a recomputed block runs), the input batches buffered by tf.data,
for a built model on one device the pooled allocator's slack (its chunks served
whole: `memory_graph.pool_slack`) and, with oneDNN off, the kernels' own buffers
(`host_kernels.kernel_buffers`: convolution gradients' column buffers, a bfloat16 product's
float32 copies; for a recomputing step, what they add beyond its transient row), and a
margin for the framework and workspace.
It gives a verdict against the device's memory and, when the run does not fit, the cheapest
changes that make it fit, each with its new total. Nothing here imports
TensorFlow: a plan of a 13B model takes milliseconds.

What Keras keeps under mixed precision (counted here, unlike the ZeRO paper's 16
bytes per parameter): the variables stay float32 (they are the master weights),
gradients are float32, and each layer casts its weights to 16 bits when it runs,
a copy the backward pass needs again: 4 + 4 + 8 (Adam) + 2 = 18 bytes per
parameter. `LossScaleOptimizer` adds two scalars. TensorFlow has no ZeRO
sharding and no CPU offload of optimizer states: every data-parallel replica
holds all of them.

Example:

    from tfaccel.performance import memory_profile, plan

    profile = memory_profile.profile_transformer(40, 5120, 40, 32000, 2048)
    result = plan.plan_memory(profile, plan.PlanSettings(batch_size=1,
                              precision="mixed_bfloat16", device_memory="24GB"))
    print(plan.format_plan(result))
"""

import dataclasses
import re

from tfaccel import doctor
from tfaccel.choices import OPTIMIZERS, PRECISIONS
from tfaccel.errors import ConfigError
from tfaccel.performance import memory_profile

GB = 10**9
GiB = 2**30
DEVICES = {
    "rtx3060": 12, "rtx3080": 10, "rtx3090": 24, "rtx4080": 16, "rtx4090": 24, "rtx5090": 32,
    "t4": 16, "v100-16gb": 16, "v100-32gb": 32, "a10": 24, "l4": 24, "a6000": 48, "l40s": 48,
    "a100-40gb": 40, "a100-80gb": 80, "h100-80gb": 80, "h200": 141,
}
"""Memory of each card by name, in GiB as sold."""
_UNITS = {"": GiB, "b": 1, "kb": 2**10, "mb": 2**20, "gb": GiB, "tb": 2**40}


def parse_device_memory(text):
    """Bytes of '24GB', '24 GiB', '16000MB' or a card name from `DEVICES` ('rtx4090').

    Device memory is read the way cards are sold and `nvidia-smi` counts it: GB and GiB
    both mean 2**30 bytes (a "24 GB" RTX 4090 has 24,564 MiB), MB and MiB 2**20; a bare
    number is GB. Plans print sizes in GB of 10**9 bytes, as the ZeRO paper counts.

    Raises:
      ConfigError: an unknown card or a malformed size.
    """
    value = str(text).strip().lower()
    if value in DEVICES:
        return DEVICES[value] * GiB
    match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([kmgt])?i?(b)?", value)
    if not match or float(match.group(1)) <= 0:
        raise ConfigError(f"device memory {text!r} is neither a size (24GB, 24GiB, 16000MB) "
                          f"nor a card ({', '.join(DEVICES)})")
    unit = (match.group(2) or "") + ("b" if match.group(2) else (match.group(3) or ""))
    return int(float(match.group(1)) * _UNITS[unit])


def host_memory_available():
    """Bytes of RAM available to new allocations (Linux's MemAvailable), or None."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_device_memory():
    """(bytes, what) of the device a run trains on: the first GPU's memory (nvidia-smi), else
    the host's available RAM; (None, why) when neither is known."""

    gpus = [g for g in doctor.gpus() if g.get("memory_total_mb")]
    if gpus:
        return gpus[0]["memory_total_mb"] * 2**20, f"GPU 0 ({gpus[0]['name']})"
    available = host_memory_available()
    if available:
        return available, "the host's available RAM (no GPU)"
    return None, "no GPU and no /proc/meminfo"


SLOTS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2, "rmsprop": 1}
"""Optimizer slot variables per parameter (float32), as Keras's optimizers make them."""
FRAMEWORK_MARGIN = 0.05
"""Share of the device kept free for the framework, kernels' workspace and fragmentation."""


@dataclasses.dataclass(frozen=True)
class PlanSettings:
    """The run's settings a memory plan depends on.

    Attributes:
      batch_size: examples per device per optimizer step (the per-replica batch).
      precision: float32, mixed_float16 or mixed_bfloat16.
      optimizer: one of `SLOTS`.
      grad_accum_steps: the batch is computed as this many micro-batches, one at a time.
      recompute: recompute activations in the backward pass (per block or layer).
      replicas: data-parallel replicas (each holds the whole model: no ZeRO in TensorFlow).
      stages: pipeline stages (the layers split into this many consecutive parts, one per
        device); micro_batches: how many micro-batches a pipeline splits the batch into.
      device_memory: bytes, or a string for `parse_device_memory`; None: no verdict.
      margin: the share of the device kept for the framework (`FRAMEWORK_MARGIN`).
      input_batches: input batches alive at once: 3 for a tf.data pipeline (the batch in
        use, the prefetch buffer, the next one being made); 1 for a constant input.
    """

    batch_size: int = 32
    precision: str = "float32"
    optimizer: str = "adam"
    grad_accum_steps: int = 1
    recompute: bool = False
    replicas: int = 1
    stages: int = 1
    micro_batches: int = 1
    device_memory: object = None
    margin: float = FRAMEWORK_MARGIN
    input_batches: int = 3

    def checked(self, num_layers=None):
        """These settings, validated (device memory in bytes).

        Raises:
          ConfigError: one line naming the bad setting and the fix.
        """
        for label in ("batch_size", "grad_accum_steps", "replicas", "stages", "micro_batches",
                      "input_batches"):
            value = getattr(self, label)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"{label}={value!r}: must be a positive integer")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision {self.precision!r}: use one of {', '.join(PRECISIONS)}")
        if self.optimizer not in SLOTS:
            raise ConfigError(f"optimizer {self.optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
        if self.grad_accum_steps > self.batch_size:
            raise ConfigError(f"grad_accum_steps={self.grad_accum_steps} is larger than "
                              f"batch_size={self.batch_size}: each micro-batch needs an example")
        if self.micro_batches > self.batch_size:
            raise ConfigError(f"micro_batches={self.micro_batches} is larger than "
                              f"batch_size={self.batch_size}")
        if num_layers is not None and self.stages > num_layers:
            raise ConfigError(f"stages={self.stages} is more than the model's {num_layers} "
                              "layers: use at most one stage per layer")
        if not 0 <= self.margin < 1:
            raise ConfigError(f"margin={self.margin}: a share of the device in [0, 1)")
        memory = self.device_memory
        if memory is not None and not isinstance(memory, int):
            memory = parse_device_memory(memory)
        return dataclasses.replace(self, device_memory=memory)

MODEL_STATES = ("weights (float32)", "gradients (float32)", "optimizer slots", "optimizer update",
                "16-bit weight casts", "accumulated gradients")


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """A plan: the busiest device's breakdown (bytes), its verdict and the changes that fit."""

    model: str
    parameters: int
    settings: PlanSettings
    breakdown: dict
    total: int
    fits: object  # True, False, or None without a device memory
    headroom: object  # device memory (less the margin) minus total, or None
    suggestions: tuple = ()
    pipeline_devices: object = None  # {card GiB: stages that fit} when it does not fit
    method: str = ""  # where the activations came from (the profile's method)
    measured: object = None  # a `Calibration` when measured, else None
    onednn: object = None  # whether the host's kernels were oneDNN's (a traced plan), else None

    def to_json(self):
        out = dataclasses.asdict(self)
        out["settings"] = dataclasses.asdict(self.settings)
        return out


def balanced_cuts(weights, num_stages):
    """Indices where stages 1..K-1 start: each cut where the running sum of `weights` is
    nearest to k/K of the total (so each stage is within the largest weight of equal).

    The one stage-balancing rule: the pipeline (`tfaccel.parallel.stages`) cuts a model with
    it and the plan prices the same cuts, so `tfaccel plan --stages=K` answers for the split
    `--parallel=pipeline --stages=K` makes. A tie goes to the earlier cut.
    """
    total = float(sum(weights))
    prefix = [0.0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    cuts, last = [], 0
    for k in range(1, num_stages):
        target = total * k / num_stages
        lo, hi = last + 1, len(weights) - (num_stages - k)  # every stage keeps a layer
        cut = min(range(lo, hi + 1), key=lambda j: (abs(prefix[j] - target), j))
        cuts.append(cut)
        last = cut
    return cuts


def split_stages(layers, stages):
    """`layers` (`LayerMemory`s) as consecutive groups balanced by parameters, cut by
    `balanced_cuts` over the layers the pipeline splits (as it cuts the model); the model's
    inputs go with the first stage."""
    inputs = [layer for layer in layers if layer.is_input]
    layers = [layer for layer in layers if not layer.is_input]
    if stages <= 1 or len(layers) < stages:
        return [inputs + layers]
    cuts = balanced_cuts([layer.parameters for layer in layers], stages)
    groups = [layers[a:b] for a, b in zip([0, *cuts], [*cuts, len(layers)])]
    return [inputs + groups[0], *groups[1:]]


def stage_breakdown(profile, layers, s, first):
    """One stage's bytes by kind: `layers` (`LayerMemory`s) under settings `s`; `first`:
    it holds the input batches."""
    half = s.precision != "float32"
    params = sum(layer.parameters for layer in layers)
    trainable = params * (profile.trainable / max(1, profile.parameters))
    micro = max(1, s.batch_size // (s.grad_accum_steps * s.micro_batches))
    in_flight = s.micro_batches if s.stages > 1 else 1
    # a profile made for one precision, planned in the other: activations scale with the dtype
    scale = 1.0 if half == profile.half_activations else (0.5 if half else 2.0)
    if s.recompute and profile.recompute_unit != "step":  # a traced step is what it is
        boundary = sum(layer.recompute_boundary_bytes or layer.output_bytes for layer in layers)
        biggest = max((layer.activation_bytes for layer in layers), default=0)
        activations = micro * (in_flight * boundary + biggest)
        transient = micro * 2 * max((layer.output_bytes for layer in layers), default=0)
    else:
        activations = micro * in_flight * sum(layer.activation_bytes for layer in layers)
        transient = micro * max((layer.output_bytes for layer in layers), default=0)
    traced = profile.update_optimizer == s.optimizer  # its slots and update read from a graph
    workspaces = profile.kernel_workspace_bytes if first else 0
    if workspaces and profile.recomputed_step_peak_bytes and scale == 1.0:
        # a recomputing step's transient row holds a whole recomputed block at once; the
        # replay frees it as the block's gradient runs, and the kernels' buffers fit in that
        allowance = (activations + transient + profile.fixed_activation_bytes
                     - profile.recomputed_step_peak_bytes)
        workspaces = max(0, workspaces - max(0, allowance))
    out = {
        "weights (float32)": 4 * params,
        "gradients (float32)": 4 * int(trainable),
        "optimizer slots": profile.optimizer_slot_bytes if traced
        else 4 * SLOTS[s.optimizer] * int(trainable),
        # the update runs once the backward pass has freed the activations: what it holds
        # beyond them, or what it made before the gradients, alive beside them
        "optimizer update": max(profile.early_update_bytes, profile.update_bytes
                                - int(scale * (activations + transient))) if traced and first
        else 0,
        "16-bit weight casts": 2 * params if half else 0,
        "accumulated gradients": 8 * int(trainable) if s.grad_accum_steps > 1 else 0,
        "all-reduce buffer": 4 * int(trainable) if s.replicas > 1 else 0,
        "activations": int(scale * (activations + (profile.fixed_activation_bytes
                                                   if first else 0))),
        "backward transients": int(scale * transient),
        "allocator slack (pooled)": int(micro * profile.pool_slack_per_example)
        if first else 0,
        "kernel workspaces (oneDNN off)": workspaces,
        "input batches": s.input_batches * s.batch_size * profile.input_bytes
        if first else 0,
    }
    return out


def breakdown(profile, settings):
    """The busiest device's bytes by kind (see `plan_memory`), before the framework margin."""
    s = settings
    stages = split_stages(profile.layers, s.stages)
    parts = [stage_breakdown(profile, layers, s, i == 0) for i, layers in enumerate(stages)]
    return max(parts, key=lambda p: sum(p.values()))


def _total(profile, settings):
    return sum(breakdown(profile, settings).values())


def _usable(settings):
    return int(settings.device_memory * (1 - settings.margin))


def _fits(profile, s, change):
    try:
        new = dataclasses.replace(s, **change).checked(num_layers=len(profile.layers))
    except ConfigError:
        return None
    total = _total(profile, new)
    return total if total <= _usable(new) else None


def _with_stages(profile, s, change):
    """`change` plus the fewest pipeline stages (>= 2) with which it fits, or None."""
    for stages in range(max(2, s.stages + 1), len(profile.layers) + 1):
        micro = min(s.batch_size, max(s.micro_batches, 4 * stages))
        staged = {**change, "stages": stages, "micro_batches": micro}
        if _fits(profile, s, staged) is not None:
            return staged
    return None


def _describe(change, s):
    parts = []
    if "precision" in change:
        parts.append("mixed precision (--precision=mixed_bfloat16; mixed_float16 on GPUs "
                     "before Ampere)")
    if "grad_accum_steps" in change:
        k = change["grad_accum_steps"]
        parts.append(f"micro-batches of {s.batch_size // k} with --grad_accum_steps={k} "
                     "(the same batch per step)")
    if change.get("recompute"):
        parts.append("recomputation (--recompute)")
    if "optimizer" in change:
        parts.append(f"a lighter optimizer ({change['optimizer']}: "
                     f"{SLOTS[change['optimizer']]} slot(s) per parameter)")
    if "stages" in change:
        k, m = change["stages"], change["micro_batches"]
        parts.append(f"{k} pipeline stages on {k} devices (--stages={k} --micro_batches={m}; "
                     f"idle bubble {100 * bubble_fraction(k, m):.0f}%)")
    return " + ".join(parts)


_COST = {"precision": 0, "grad_accum_steps": 1, "recompute": 2, "optimizer": 3, "stages": 4}


def _suggestions(profile, s):
    """The changes that make the run fit, cheapest first (see `plan_memory`)."""
    base = []
    if s.precision == "float32":
        base.append({"precision": "mixed_bfloat16"})
    accum = [k for k in (2, 4, 8, 16, 32, 64, 128)
             if k > s.grad_accum_steps and s.batch_size % k == 0]
    fitting = [k for k in accum if _fits(profile, s, {"grad_accum_steps": k}) is not None]
    if fitting or accum:
        base.append({"grad_accum_steps": (fitting or accum)[0]})
    if not s.recompute:
        base.append({"recompute": True})
    base += [{"optimizer": o} for o in ("momentum", "sgd") if SLOTS[o] < SLOTS[s.optimizer]]
    candidates = list(base)
    candidates += [{**a, **b} for i, a in enumerate(base) for b in base[i + 1:]
                   if not set(a) & set(b) and "optimizer" not in a and "optimizer" not in b]
    staged = [_with_stages(profile, s, c) for c in [{}, *candidates[:len(base)]]]
    candidates += [c for c in staged if c]
    found, seen = [], set()
    for change in candidates:
        key = tuple(sorted(change.items()))
        total = _fits(profile, s, change) if change and key not in seen else None
        seen.add(key)
        if total is not None:
            found.append((sum(_COST[k] for k in change if k in _COST), change.get("stages", 1),
                          total, change))
    found.sort(key=lambda f: f[:3])
    return tuple({"change": _describe(c, s), "settings": c, "total": t,
                  "breakdown": breakdown(profile, dataclasses.replace(s, **c))}
                 for _, _, t, c in found[:6])


PIPELINE_CARDS_GIB = (24, 40, 80)
"""The card sizes a plan that does not fit prices a pipeline on."""


def pipeline_devices(profile, settings, cards_gib=PIPELINE_CARDS_GIB):
    """{card GiB: the fewest pipeline stages (one device each) that fit, or None}.

    Each count is for the run's settings with recomputation on, mixed precision (if it
    was float32) and at least 4 micro-batches per stage (GPipe's M >= 4K).
    """
    s = settings
    out = {}
    for gib in cards_gib:
        out[gib] = None
        for stages in range(1, len(profile.layers) + 1):
            trial = dataclasses.replace(
                s, device_memory=int(gib * GiB), stages=stages, recompute=True,
                precision="mixed_bfloat16" if s.precision == "float32" else s.precision,
                micro_batches=min(s.batch_size, max(s.micro_batches, 4 * stages)))
            if _total(profile, trial) <= _usable(trial):
                out[gib] = stages
                break
    return out


def plan_memory(profile, settings=None, **kwargs):
    """The memory plan of `profile` trained with `settings` (or `PlanSettings(**kwargs)`).

    Args:
      profile: a `memory_profile.MemoryProfile` (e.g. `profile_transformer(...)` for a
        Transformer described by its size), a built tf_keras model, a .keras/.h5 file, or a
        zoo name (then pass ``input_shape=`` and ``num_classes=`` too).
      settings: a `PlanSettings`; or its fields as keyword arguments, and ``method``
        ('graph' or 'layers'), ``measure`` (also run it: `calibrate.measure_memory`),
        ``onednn`` (a traced plan's host kernels: True for oneDNN's, False for TensorFlow's
        own, which an AVX2-only CPU runs and which keep workspaces of their own; None for
        this process's), ``input_shape``, ``num_classes``, ``sequence_length``.

    Returns:
      A `MemoryPlan`: the busiest device's breakdown in bytes, its total, and with a
      device memory the verdict, the headroom, the cheapest changes that fit (ranked:
      precision, accumulation, recomputation, a lighter optimizer, pipeline stages, then
      pairs of them) and, when it does not fit, how many 24, 40 and 80 GiB devices a
      pipeline needs (`pipeline_devices`).

    Raises:
      ConfigError: bad settings (`PlanSettings.checked`).
    """

    shape, classes = kwargs.pop("input_shape", None), kwargs.pop("num_classes", None)
    sequence_length = kwargs.pop("sequence_length", None)
    method, measure = kwargs.pop("method", "graph"), kwargs.pop("measure", False)
    onednn = kwargs.pop("onednn", None)
    settings = settings or PlanSettings(**kwargs)
    if method not in ("graph", "layers"):
        raise ConfigError(f"method={method!r}: use 'graph' (the traced train step) or 'layers'")
    model, given, at_micro_batch, kernels = None, profile, None, None
    if not isinstance(profile, memory_profile.MemoryProfile):
        settings.checked()  # bad settings are reported before a model is built
        model = memory_profile.built_model(profile, shape, classes, settings.precision)
        # a pipeline splits the model's layers, so it is priced layer by layer
        if method == "graph" and settings.stages == 1:
            from tfaccel import _compat  # deferred: TensorFlow
            from tfaccel.performance import memory_graph

            kernels = _compat.onednn_in_use() if onednn is None else bool(onednn)
            traced = memory_graph.traced_profile(model, sequence_length)
            slot_bytes, update, early = memory_graph.optimizer_update(
                model, settings.optimizer, settings.precision, sequence_length)
            traced = dataclasses.replace(traced, update_optimizer=settings.optimizer,
                                         optimizer_slot_bytes=slot_bytes, update_bytes=update,
                                         early_update_bytes=early)

            def at_micro_batch(micro):  # the pool's slack is replayed at each batch
                replay = memory_graph.pool_replay(
                    model, micro, round(slot_bytes / max(1, 4 * traced.trainable)),
                    settings.grad_accum_steps > 1, sequence_length, onednn=kernels)
                return dataclasses.replace(traced, pool_slack_per_example=replay.slack / micro,
                                           kernel_workspace_bytes=replay.workspaces,
                                           recomputed_step_peak_bytes=replay.recomputed_peak)

            profile = at_micro_batch(max(1, settings.batch_size // settings.grad_accum_steps))
        else:
            profile = memory_profile.profile_of(model)
    if measure and model is None:
        raise ConfigError("measure=True needs a model (a file or a zoo name), not a "
                          f"profile of {profile.name!r}: nothing to run")
    s = settings.checked(num_layers=len(profile.layers))
    parts = breakdown(profile, s)
    total = sum(parts.values())
    measured = None
    if measure:
        from tfaccel.performance import calibrate  # deferred: a subprocess running TensorFlow

        graph = None
        if at_micro_batch is not None:  # the graph's plan at each calibration batch too
            micro = max(1, s.batch_size // s.grad_accum_steps)
            graph = {micro: total}
            for b in calibrate.calibration_batches(micro):
                if b not in graph:
                    graph[b] = _total(at_micro_batch(b), dataclasses.replace(
                        s, batch_size=b * s.grad_accum_steps))
        measured = calibrate.measure_memory(given if isinstance(given, str) else model, s,
                                            shape, classes, sequence_length, graph=graph,
                                            onednn=onednn)
    if s.device_memory is None:
        return MemoryPlan(profile.name, profile.parameters, s, parts, total, None, None,
                          method=profile.method, measured=measured, onednn=kernels)
    headroom = _usable(s) - total
    fits = headroom >= 0
    suggestions = () if fits else _suggestions(profile, s)
    needed = None if fits else pipeline_devices(profile, s)
    return MemoryPlan(profile.name, profile.parameters, s, parts, total, fits, headroom,
                      suggestions, needed, profile.method, measured, kernels)


def format_size(n):
    """Bytes as the plan prints them: GB of 10^9 bytes, below 1 GB MB of 10^6."""
    return f"{n / GB:,.2f} GB" if abs(n) >= GB else f"{n / 10**6:,.2f} MB"


def _per_example(n):
    """Bytes per example: in KB below 10 KB (a small model's 2 KB would read 0.00 MB)."""
    return f"{n / 1e3:,.2f} KB" if abs(n) < 10**4 else format_size(n)


def _slack_text(slack):
    """The calibration's allocator slack ({batch: fraction}) as a clause of the plan's text."""
    if not slack:
        return ""
    low, high = min(slack.values()), max(slack.values())
    span = f"{100 * low:.0f}-{100 * high:.0f}%" if high - low >= 0.005 else f"{100 * high:.0f}%"
    return (f"; at a traced peak the allocator held {span} more than the tensors asked for "
            "(chunks served whole), so one process's peak can sit that far above another's")


def format_plan(result):
    """The plan as text: the breakdown table, the verdict and the changes that fit."""
    s = result.settings
    lines = [f"{result.model}: {result.parameters:,} parameters; batch {s.batch_size} per "
             f"device, {s.precision}, {s.optimizer}, accumulation {s.grad_accum_steps}, "
             f"recompute {'on' if s.recompute else 'off'}, {s.replicas} replica(s), "
             f"{s.stages} stage(s) x {s.micro_batches} micro-batch(es)", "",
             "| memory (busiest device) | size |", "|---|---|"]
    states = sum(v for k, v in result.breakdown.items() if k in MODEL_STATES)
    lines += [f"| {k} | {format_size(v)} |" for k, v in result.breakdown.items() if v]
    lines.append(f"| (model states, of the rows above) | {format_size(states)} |")
    lines.append(f"| **total** | **{format_size(result.total)}** |")
    if result.method:
        lines += ["", f"activations from: {result.method}"]
    if result.onednn is not None:
        lines.append("host CPU kernels: " + (
            "oneDNN's" if result.onednn else "TensorFlow's own, oneDNN off (as on a CPU without "
            "AVX512_VNNI, AVX512_BF16, AVX-VNNI or AMX): their buffers are the 'kernel "
            "workspaces' row"))
    c = result.measured
    if c is not None:
        peaks = ", ".join(f"batch {b}: {format_size(p)}" for b, p in c.peaks.items())
        lines += [f"measured: {format_size(c.predicted)} at batch {c.batch_size} ({c.method}; "
                  f"{peaks}; {format_size(c.fixed)} fixed + {_per_example(c.per_example)} per "
                  f"example; peaks {100 * c.spread:.0f}% apart across processes"
                  f"{_slack_text(c.slack)}); planned {format_size(result.total)}, ratio "
                  f"{result.total / max(1, c.predicted):.2f}. "
                  "Trust the measured number on this machine (it sees backend workspaces "
                  "and the order ops ran in); the planned one for another device."]
    if result.fits is None:
        return "\n".join(lines)
    device = s.device_memory
    lines += ["", f"device {device / GiB:g} GiB ({format_size(device)}), {100 * s.margin:g}% "
              f"kept for the framework: {'FITS' if result.fits else 'DOES NOT FIT'}, headroom "
              f"{format_size(result.headroom)}"]
    one_device = [x for x in result.suggestions if "stages" not in x["settings"]]
    if result.fits is False and not one_device:
        lines += ["", "no change on one device makes it fit: TensorFlow has no ZeRO sharding "
                  "and no CPU offload of optimizer states, so it needs several devices."]
    if result.suggestions:
        lines += ["", "changes that make it fit (cheapest first):"]
        lines += [f"- {x['change']}: {format_size(x['total'])}" for x in result.suggestions]
    if result.pipeline_devices:
        counts = [f"{n} x {gib} GiB" if n else f"no pipeline of {gib} GiB cards"
                  for gib, n in result.pipeline_devices.items()]
        lines.append("a pipeline (one stage per device, recomputation, mixed precision, "
                     f">= 4 micro-batches per stage) fits on: {', '.join(counts)}")
    return "\n".join(lines)


def write_plan(logdir, result, tag="memory/plan", path=None):
    """Logs `result` to TensorBoard under `logdir`: the plan as text and a stacked-bar chart
    (also written to `path` when given). Returns the text."""
    # deferred: TensorFlow and matplotlib, only to write a report
    from tfaccel import plots, summaries

    text = format_plan(result)
    summaries.write_text(logdir, tag, text)
    bars = [("this run", result.breakdown)]
    bars += [(", ".join(f"{k}={v}" for k, v in x["settings"].items()), x["breakdown"])
             for x in result.suggestions[:3]]
    png = plots.plot_memory(bars, path, f"memory plan: {result.model}",
                            result.settings.device_memory)
    summaries.write_png(logdir, f"{tag}_chart", png)
    return text


def bubble_fraction(stages, micro_batches):
    """GPipe's idle share of a pipeline: (K - 1) / (M + K - 1)."""
    return (stages - 1) / (micro_batches + stages - 1) if stages > 1 else 0.0

