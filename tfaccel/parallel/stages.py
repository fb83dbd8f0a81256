"""A model's layers split into consecutive stages, one per device, and the table that shows it.

Model and pipeline parallelism (`tfaccel.parallel.pipeline`) run a Sequential or
functional tf_keras model as K stages (a Keras 3 one of standard layers, such as
`keras.applications.MobileNetV2`, as its verified tf_keras translation: same layers,
same weights; a model of custom layers, KerasHub's, is refused naming what works): stage
k holds a consecutive run of the model's layers (in an order that can run them) and
lives on device k. Stages are cut where the user names a layer (each named layer starts
a stage) or balanced automatically: by parameters, each cut at the layer where the
running parameter count is nearest to k/K of the total, so each stage is within one
layer's size of equal; or by the memory planner's estimate (`balance="memory"`). A
tensor that crosses a cut is sent to the next stage; one that skips a stage (a residual
connection spanning it) is passed along by that stage, and the table says so.

Example:

    from tfaccel.parallel import stages
    from tfaccel.train.models import build_model

    plan = stages.plan_stages(build_model("cnn", (8, 8, 1), 10), num_stages=2,
                              devices=["/CPU:0", "/CPU:1"], batch_size=64, micro_batches=4)
    print(plan.table())
"""

import dataclasses

from tfaccel import _compat, choices
from tfaccel.errors import ConfigError, ModelError, UnsupportedLayerError
from tfaccel.keras import bridge, ensure_tf_keras, is_keras3_object, keras
from tfaccel.performance import memory_profile, plan
from tfaccel.performance.plan import (  # balanced_cuts: the one rule, also this module's name
    PlanSettings,
    balanced_cuts as balanced_cuts,
    bubble_fraction,
)

__all__ = ["BALANCES", "Stage", "StagePlan", "plan_stages", "check_splittable", "layer_order",
           "balanced_cuts", "cuts_at", "live_tensors", "splittable_model", "UNSPLITTABLE_ADVICE"]
BALANCES = choices.STAGE_BALANCES
UNSPLITTABLE_ADVICE = (
    "what works for it: data parallelism (tfaccel.make_strategy('mirrored'), the recipes' "
    "--strategy=mirrored) with gradient accumulation (--grad_accum_steps) for a larger batch, "
    "or for a GPT tfaccel's own, which splits (recipes/train_lm.py --parallel=pipeline "
    "--stage_boundaries=block_1_ln_1)")
"""What a refusal to split a model offers instead: each works for any Keras model."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage: its device, its layers (in run order), parameters, estimated memory.

    `receives` lists the tensors that cross into it as `(layer that made it, shape,
    passed along)`, where "passed along" means the previous stage only forwarded it.
    """

    index: int
    device: str
    layers: tuple
    parameters: int
    memory_bytes: object = None
    receives: tuple = ()


@dataclasses.dataclass(frozen=True)
class StagePlan:
    """The stages of a model and the micro-batches a pipeline feeds them."""

    model_name: str
    stages: tuple
    micro_batches: int = 1

    @property
    def bubble_fraction(self):
        """GPipe's idle share of a schedule, (K - 1) / (M + K - 1)."""

        return bubble_fraction(len(self.stages), self.micro_batches)

    def table(self):
        """The stage table, as Markdown (what the recipes print and log to TensorBoard)."""
        rows = ["| stage | device | layers | parameters | est. memory | receives |",
                "|---|---|---|---:|---:|---|"]
        for s in self.stages:
            span = s.layers[0] if len(s.layers) == 1 else f"{s.layers[0]} .. {s.layers[-1]}"
            memory = "-" if s.memory_bytes is None else f"{s.memory_bytes / 2**20:.1f} MiB"
            got = ", ".join(f"{name} {shape}" + (" (passed along)" if along else "")
                            for name, shape, along in s.receives) or "the model's inputs"
            rows.append(f"| {s.index} | {s.device} | {span} ({len(s.layers)}) | "
                        f"{s.parameters:,} | {memory} | {got} |")
        k, m = len(self.stages), self.micro_batches
        rows.append(f"\n{k} stage(s), {m} micro-batch(es) per step: bubble (K-1)/(M+K-1) = "
                    f"{self.bubble_fraction:.3f} of the step idle per device")
        return "\n".join(rows)

    def to_json(self):
        return {"model": self.model_name, "micro_batches": self.micro_batches,
                "bubble_fraction": self.bubble_fraction,
                "stages": [dataclasses.asdict(s) for s in self.stages]}


def splittable_model(model):
    """`model` as the tf_keras layer graph that stages split: a tf_keras model as it is, a
    Keras 3 Sequential or functional model of standard layers as its verified tf_keras
    translation (`tfaccel.keras.bridge.to_tf_keras`; `bridge.to_keras3(staged.placed)` is
    the way back).

    Raises:
      UnsupportedLayerError: a Keras 3 model of custom layers (KerasHub's) or a subclassed
        one: one line naming its layers, the limit (tfaccel's: the stages place layers it
        can rebuild on a device) and `UNSPLITTABLE_ADVICE`.
    """
    if not is_keras3_object(model):
        return model
    bad = bridge.untranslatable_parts(model)
    if bad:
        listed = ", ".join(f"{name} ({kind})" for name, kind, _ in bad[:3])
        raise UnsupportedLayerError(
            f"the pipeline cannot split {getattr(model, 'name', model)!r} at {listed}"
            f"{', ...' if len(bad) > 3 else ''}: tfaccel's stages rebuild standard Keras layers "
            f"of a functional graph on their devices, not custom or subclassed ones; "
            f"{UNSPLITTABLE_ADVICE}")
    return bridge.to_tf_keras(model)


def check_splittable(model):
    """Raises ModelError unless `model` is a built Sequential/functional tf_keras model whose
    layers are each called once (a shared layer cannot live on two devices)."""
    ensure_tf_keras(model)
    if not isinstance(model, keras.Model) or not _compat.is_graph_network(model):
        raise ModelError(f"model {getattr(model, 'name', model)!r} is a subclassed "
                         f"{type(model).__name__}: it has no layer graph to split into "
                         "stages; build it as a functional or Sequential model")
    if not model.built or not model.inputs:
        raise ModelError(f"model {model.name!r} is not built: give it an Input (or call "
                         "model.build(shape)) before splitting it")
    calls, _, _ = _compat.graph_calls(model)
    seen = {}
    for layer, *_ in calls:
        seen[layer.name] = seen.get(layer.name, 0) + 1
    shared = sorted(name for name, n in seen.items() if n > 1)
    if shared:
        raise ModelError(f"layer(s) {', '.join(shared)} are called more than once (shared); a "
                         "stage split needs each layer called once: give each use its own layer")
    return calls


def layer_order(model):
    """The names of `model`'s layer calls in the order stages run them (inputs excluded)."""
    if any(isinstance(layer, keras.Model) for layer in model.layers):
        raise ModelError(f"model {model.name!r} holds nested models: flatten it first with "
                         "tfaccel.flatten_model(model)")
    return [layer.name for layer, *_ in check_splittable(model)]


def cuts_at(names, boundaries):
    """Indices of the layers named in `boundaries` (each starts a stage), checked."""
    where = {name: i for i, name in enumerate(names)}
    missing = [b for b in boundaries if b not in where]
    if missing:
        raise ConfigError(f"stage boundary {missing[0]!r} is not a layer of the model: use "
                          f"layer names, in order, from: {', '.join(names[1:])}")
    cuts = [where[b] for b in boundaries]
    if cuts[0] == 0:
        raise ConfigError(f"stage boundary {boundaries[0]!r} is the first layer (stage 0 would "
                          "be empty): name the layer each later stage starts with")
    if any(b <= a for a, b in zip(cuts, cuts[1:])):
        raise ConfigError(f"stage boundaries {','.join(boundaries)} are not in the model's "
                          f"order (or repeat a layer): the order is {', '.join(names)}")
    return cuts


def _layer_weights(model, names, balance, memory):
    if balance == "parameters":
        return [model.get_layer(n).count_params() for n in names]
    return [memory.get(n, 0) for n in names]


def _memory_per_layer(model, settings, balance):
    """{layer name: estimated bytes} from the memory planner, or {} without settings."""
    if settings is None:
        return {}, None

    try:
        profile = memory_profile.profile_keras_model(model)
    except ModelError:  # e.g. a sequence length left open: no estimate, unless asked for
        if balance == "memory":
            raise
        return {}, None
    by_name = {layer.name: layer for layer in profile.layers}
    per_layer = {name: sum(plan.stage_breakdown(profile, [layer], settings, False).values())
                 for name, layer in by_name.items()}
    return per_layer, (profile, by_name)


def plan_stages(model, num_stages=None, boundaries=None, devices=None, balance="parameters",
                batch_size=None, micro_batches=1, optimizer="adam"):
    """Splits `model` into consecutive stages and places stage k on `devices[k]`.

    Args:
      model: a built Sequential or functional model (a Keras 3 one: `splittable_model`).
      num_stages: how many stages (balanced by `balance`); or give `boundaries`.
      boundaries: layer names, in order, each the first layer of a stage after the first.
      devices: one device string per stage (default: '/CPU:0' for all).
      balance: 'parameters' or 'memory' (the planner's estimate; needs `batch_size`).
      batch_size, micro_batches, optimizer: the run's, for the memory estimate per stage
        (no estimate without `batch_size`).

    Returns:
      A `StagePlan`.

    Raises:
      ConfigError / ModelError: one line naming the problem and the fix.
    """

    model = splittable_model(model)
    names = layer_order(model)
    if balance not in BALANCES:
        raise ConfigError(f"balance={balance!r}: use one of {', '.join(BALANCES)}")
    if boundaries:
        cuts = cuts_at(names, list(boundaries))
        if num_stages is not None and num_stages != len(cuts) + 1:
            raise ConfigError(f"{len(boundaries)} stage boundaries make {len(cuts) + 1} stages, "
                              f"not {num_stages}: give one fewer boundary than stages")
        num_stages = len(cuts) + 1
    num_stages = int(num_stages or 1)
    if num_stages < 1:
        raise ConfigError(f"stages={num_stages}: must be a positive integer")
    if num_stages > len(names):
        raise ConfigError(f"stages={num_stages} is more than the model's {len(names)} layers: "
                          "use at most one stage per layer")
    devices = list(devices or ["/CPU:0"] * num_stages)
    if len(devices) < num_stages:
        raise ConfigError(f"stages={num_stages} but only {len(devices)} device(s): use at most "
                          f"{len(devices)} stages, or more devices (--cpu_devices=N on CPU)")
    if balance == "memory" and not batch_size:
        raise ConfigError("balance='memory' needs the batch size: pass batch_size=")
    settings = None
    if batch_size:
        half = next((p for p in ("bfloat16", "float16")
                     if any(layer.compute_dtype == p for layer in model.layers)), None)
        settings = PlanSettings(batch_size=int(batch_size), optimizer=optimizer,
                                precision=f"mixed_{half}" if half else "float32",
                                stages=num_stages, micro_batches=int(micro_batches)).checked()
    memory, profiled = _memory_per_layer(model, settings, balance)
    if not boundaries:
        cuts = balanced_cuts(_layer_weights(model, names, balance, memory), num_stages)
    groups = [names[a:b] for a, b in zip([0, *cuts], [*cuts, len(names)])]
    receives = _receives(model, groups)
    return StagePlan(model.name, tuple(
        Stage(k, devices[k], tuple(group), sum(model.get_layer(n).count_params() for n in group),
              _stage_memory(profiled, group, settings, k == 0), receives[k])
        for k, group in enumerate(groups)), int(micro_batches))


def _stage_memory(profiled, group, settings, first):
    if profiled is None:
        return None

    profile, by_name = profiled
    layers = [by_name[n] for n in group if n in by_name]
    if first and "input cast" in by_name:
        layers.insert(0, by_name["input cast"])
    return int(sum(plan.stage_breakdown(profile, layers, settings, first).values()))


def _receives(model, groups):
    """Per stage, what crosses into it: (producing layer, shape, passed along by the stage
    before); the graph is walked once for all stages."""
    stage_of = {name: i for i, group in enumerate(groups) for name in group}
    calls, input_ids, output_ids = _compat.graph_calls(model)
    made_by = {i: ("input", -1) for i in input_ids}
    shapes = {i: tuple(ref.shape) for ref, i in zip(model.inputs, input_ids)}
    for layer, _, outs, node in calls:
        tensors = node.outputs if isinstance(node.outputs, (list, tuple)) else [node.outputs]
        for i, tensor in zip(outs, tensors):
            made_by[i] = (layer.name, stage_of[layer.name])
            shapes[i] = tuple(tensor.shape)
    return [()] + [tuple((made_by[i][0], shapes[i], made_by[i][1] < k - 1)
                         for i in live_tensors(calls, input_ids, output_ids, stage_of, k))
                   for k in range(1, len(groups))]


def live_tensors(calls, input_ids, output_ids, stage_of, k):
    """Ids of the tensors made before stage k and read at stage k or later (or outputs)."""
    made_before = set(input_ids) | {i for layer, _, outs, _ in calls
                                    if stage_of[layer.name] < k for i in outs}
    needed = {i for layer, ins, _, _ in calls if stage_of[layer.name] >= k for i in ins}
    needed |= set(output_ids)
    order = list(input_ids) + [i for _, _, outs, _ in calls for i in outs]
    return [i for i in order if i in made_before and i in needed]
