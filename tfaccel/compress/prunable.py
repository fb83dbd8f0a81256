"""The kernels magnitude pruning can zero in any Keras model, custom layers included.

TF-MOT finds kernels through a table of tf_keras layer classes and refuses any
layer it does not know, so a custom layer (KerasHub's `TransformerDecoder`, a
user's block) stops it. Here the walk goes into every layer, in either Keras,
without translating or copying the model:

- a layer with a `get_prunable_weights()` method (TF-MOT's `PrunableLayer`
  protocol) gives exactly what that method returns: the way a custom layer that
  holds its own kernels opts in;
- a known layer gives its kernels: `Dense`, `EinsumDense`, `Conv1D/2D/3D` (and
  their transposes), `DepthwiseConv1D/2D`, `SeparableConv1D/2D` (depthwise and
  pointwise) and `Embedding` (KerasHub's `ReversibleEmbedding` is one);
- any other layer is searched for such layers inside it (a TransformerDecoder's
  attention `EinsumDense`s and feed-forward `Dense`s); weights of two or more
  dimensions that belong to no known layer are reported, never guessed at.

`plan_kernels` then decides which kernels to prune (include/exclude, the first
convolution, a minimum size, the 2:4 pattern) and says why the others stay dense;
a kernel the user asked for that cannot be pruned as asked is an error instead.

Example:

    from tfaccel.compress import prunable

    plan = prunable.plan_kernels(lm, exclude=("token_embedding",))
    [k.key for k in plan.kernels]    # ['transformer_layer_0/self_attention/query/kernel', ...]
    plan.skipped                      # {'token_embedding/embeddings': 'excluded', ...}
"""

import dataclasses
import re
import weakref

import numpy as np
import tensorflow as tf

from tfaccel import _compat
from tfaccel.errors import ConfigError, UnsupportedLayerError
from tfaccel.keras import keras_of

_OPT_IN = ("give the layer a get_prunable_weights() method returning them (TF-MOT's "
           "PrunableLayer protocol), or pass them to prune_magnitude(kernels=[...])")


@dataclasses.dataclass(frozen=True, eq=False)
class Kernel:
    """One weight that magnitude pruning can zero.

    Attributes:
      path: the layer's place in the model: its name for a layer of the model (or
        of a nested model), 'outer/inner' for a layer inside a custom layer.
      name: the weight's attribute in its layer ('kernel', 'embeddings', ...).
      layer: the layer that holds it.
      variable: the variable (tf_keras or Keras 3).
      axis: the input (reduction) axis, along which 2:4 groups run; None when
        the kernel has none (an embedding table, a depthwise kernel).
      classes: class names of the layer and the layers around it, outermost first.
    """

    path: str
    name: str
    layer: object = dataclasses.field(repr=False)
    variable: object = dataclasses.field(repr=False)
    axis: int | None
    classes: tuple = ()

    @property
    def key(self):
        """'path/name', unique in a model."""
        return f"{self.path}/{self.name}"

    @property
    def shape(self):
        return tuple(int(d) for d in self.variable.shape)

    @property
    def size(self):
        return int(np.prod(self.shape))


def _einsum_input_axis(layer):
    """The last kernel axis an EinsumDense contracts with its input (None if unclear)."""
    equation = re.sub(r"\s", "", str(getattr(layer, "equation", "")))
    operands, _, _ = equation.partition("->")
    parts = operands.split(",")
    if len(parts) != 2 or "." in parts[1]:
        return None
    inputs, kernel = parts[0].replace(".", ""), parts[1]
    contracted = [i for i, letter in enumerate(kernel) if letter in inputs]
    return contracted[-1] - len(kernel) if contracted else None


def _known_layers(layers):
    """((classes, ((attribute, axis rule), ...)), ...) of a Keras's kernel layers, most
    specific first (tf_keras's Conv2DTranspose is a Conv2D)."""
    def have(*names):
        return tuple(getattr(layers, n) for n in names if hasattr(layers, n))

    return (
        (have("EinsumDense"), (("kernel", "einsum"),)),
        (have("SeparableConv1D", "SeparableConv2D"),
         (("depthwise_kernel", None), ("pointwise_kernel", -2))),
        # tf_keras names a depthwise kernel `depthwise_kernel`, Keras 3 `kernel`.
        (have("DepthwiseConv1D", "DepthwiseConv2D"),
         (("depthwise_kernel", None), ("kernel", None))),
        (have("Conv1DTranspose", "Conv2DTranspose", "Conv3DTranspose"), (("kernel", -1),)),
        (have("Conv1D", "Conv2D", "Conv3D"), (("kernel", -2),)),
        (have("Dense"), (("kernel", -2),)),
        (have("Embedding"), (("embeddings", None),)),
    )


_TABLES = {}


def _table(layer):
    k = keras_of(layer)
    if id(k) not in _TABLES:
        _TABLES[id(k)] = (k, _known_layers(k.layers))
    return _TABLES[id(k)][1]


def _short_name(variable):
    """'kernel' for 'dense/kernel:0' (tf_keras) or a Keras 3 variable named 'kernel'."""
    return str(variable.name).rpartition("/")[2].partition(":")[0]


def _is_variable(value):
    return value is not None and hasattr(value, "assign") and hasattr(value, "shape")


def layer_kernels(layer, path, classes=()):
    """(kernels, unknown) of one layer and the layers inside it.

    `unknown` is {path: (layer, [weight names])}: weights of two or more
    dimensions that no known layer or `get_prunable_weights` accounts for.
    """
    classes = (*classes, type(layer).__name__)
    if not layer.weights:
        return [], {}
    if callable(getattr(layer, "get_prunable_weights", None)):
        found = [Kernel(path, _short_name(v), layer, v, -2 if len(v.shape) >= 2 else None,
                        classes) for v in layer.get_prunable_weights()]
        return found, {}
    for types, attributes in _table(layer):
        if types and isinstance(layer, types):
            found = []
            for attribute, rule in attributes:
                value = getattr(layer, attribute, None)
                if _is_variable(value):
                    axis = _einsum_input_axis(layer) if rule == "einsum" else rule
                    found.append(Kernel(path, attribute, layer, value, axis, classes))
            if found:
                return found, {}
    kernels, unknown, covered = [], {}, set()
    for sub in _compat.sublayers(layer):
        more, strange = layer_kernels(sub, f"{path}/{sub.name}", classes)
        kernels += more
        unknown.update(strange)
        covered.update(id(w) for w in sub.weights)
    own = [w for w in layer.weights if id(w) not in covered and len(w.shape) >= 2]
    if own:
        unknown[path] = (layer, [_short_name(w) for w in own])
    return kernels, unknown


def find_kernels(model):
    """(kernels, unknown): every prunable kernel of `model` in layer order, and the weights
    no known layer accounts for ({path: (layer, [names])}).

    Walks into nested models (their layers keep their own names, as in
    `pruning_plan.walk_layers`) and into custom layers ('outer/inner'). A layer
    or weight used in several places is listed once.
    """
    kernels, unknown, seen = [], {}, set()
    model_class = keras_of(model).Model

    def visit(container):
        for layer in container.layers:
            if id(layer) in seen:
                continue
            seen.add(id(layer))
            if isinstance(layer, model_class) and not callable(
                    getattr(layer, "get_prunable_weights", None)):
                visit(layer)
                continue
            more, strange = layer_kernels(layer, layer.name)
            kernels.extend(k for k in more if id(k.variable) not in seen)
            seen.update(id(k.variable) for k in more)
            unknown.update(strange)

    visit(model)
    covered = {id(w) for layer in model.layers for w in layer.weights}
    own = [w for w in model.weights if id(w) not in covered and len(w.shape) >= 2]
    if own:
        unknown[model.name] = (model, [_short_name(w) for w in own])
    return kernels, unknown


# ---------------------------------------------------------------- which to prune


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """The kernels to prune, and why the others stay dense ({'path/name' or path: reason}).

    `unfit` names the skipped kernels that cannot hold the requested m:n pattern (TF-MOT
    leaves such kernels dense without a word; here they are listed and logged as warnings).
    """

    kernels: tuple
    skipped: dict
    unfit: tuple = ()

    @property
    def layers(self):
        """Paths of the layers with pruned kernels, in order (the names `sparsity_report` uses)."""
        return tuple(dict.fromkeys(k.path for k in self.kernels))


def _matches(kernel, item):
    if callable(item):
        return bool(item(kernel))
    return (item in (kernel.path, kernel.key, kernel.path.rpartition("/")[2])
            or item in kernel.classes or kernel.path.startswith(item + "/"))


def pattern_problem(kernel, m_by_n):
    """Why `kernel` cannot hold the m:n pattern (whose limit, and the numbers), or None."""
    if not m_by_n:
        return None
    m, n = m_by_n
    if kernel.axis is None:
        if "embedding" in kernel.name:
            what = "an embedding table is looked up, not summed"
        elif "depthwise" in kernel.name or any("Depthwise" in c for c in kernel.classes):
            what = "a depthwise kernel filters each channel apart"
        else:
            what = f"this {len(kernel.shape)}-D weight has no known input axis"
        return f"{m}:{n} sparsity groups the weights a kernel sums over; {what}"
    length = kernel.shape[kernel.axis]
    if length % n:
        return (f"{m}:{n} sparsity needs the input axis (axis {kernel.axis % len(kernel.shape)} "
                f"of {kernel.shape}) divisible by {n}, it has {length}")
    return None


def check_m_by_n(m_by_n):
    """`m_by_n` as a tuple (m, n) with 0 < m < n, None for None, else ConfigError."""
    if m_by_n is None:
        return None
    value = tuple(m_by_n) if isinstance(m_by_n, (tuple, list)) else (m_by_n,)
    if len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool)
                                  for v in value) or not 0 < value[0] < value[1]:
        raise ConfigError(f"m_by_n={m_by_n!r} must be two integers 0 < m < n, e.g. (2, 4)")
    return value


def _explicit_kernels(model, variables, found):
    by_id = {id(k.variable): k for k in found}
    weights = {id(w) for w in model.weights}
    chosen = []
    for v in variables:
        if not _is_variable(v):
            raise ConfigError(f"kernels: {v!r:.60} is not a variable: pass weight variables, "
                              "e.g. [layer.kernel]")
        if id(v) not in weights:
            raise ConfigError(f"kernels: {getattr(v, 'path', v.name)!r} is not a weight of "
                              f"model {model.name!r}: pass that model's variables")
        path = str(getattr(v, "path", v.name)).partition(":")[0].rpartition("/")[0] or model.name
        chosen.append(by_id.get(id(v)) or Kernel(path, _short_name(v), None, v,
                                                 -2 if len(v.shape) >= 2 else None))
    return chosen


def plan_kernels(model, *, include=(), exclude=(), kernels=None, min_weights=0,
                 keep_first_conv=False, m_by_n=None):
    """Decides which kernels of `model` to prune and why the others stay dense.

    Args:
      model: a built tf_keras or Keras 3 model, any kind (custom layers, subclassed, KerasHub).
      include: layer names, class names ('Dense', 'TransformerDecoder': everything
        inside those), paths ('transformer_layer_0/self_attention'), 'path/name'
        keys, or a function (Kernel) -> bool; empty: every kernel found.
      exclude: the same, never pruned.
      kernels: the variables to prune, instead of looking (any weight of the model,
        a custom layer's own included).
      min_weights: leave kernels with fewer weights dense (unless included by name).
      keep_first_conv: leave the first kernel dense when it is a convolution's.
      m_by_n: e.g. (2, 4): kernels that cannot hold the pattern stay dense (and are
        listed); one asked for by name or in `kernels` is an error.

    Returns:
      A `KernelPlan`.

    Raises:
      ConfigError: unknown names in include/exclude, bad m_by_n, nothing to prune.
      UnsupportedLayerError: a kernel asked for cannot be pruned as asked.
    """
    m_by_n = check_m_by_n(m_by_n)
    found, unknown = find_kernels(model)
    items = [include] if callable(include) else list(include)
    excluded = [exclude] if callable(exclude) else list(exclude)
    names = {part for k in found for part in (k.path, k.key, *k.classes, *k.path.split("/"))}
    for field, values in (("include", items), ("exclude", excluded)):
        unknown_names = [v for v in values if isinstance(v, str) and v not in names
                         and not any(k.path.startswith(v + "/") for k in found)]
        strange = [v for v in unknown_names if v in unknown]
        if strange and field == "include":
            layer, weights = unknown[strange[0]]
            raise UnsupportedLayerError(
                f"layer {strange[0]!r} ({type(layer).__name__}) holds weights "
                f"{', '.join(weights)} that are not kernels of a layer tfaccel knows: {_OPT_IN}")
        if len(strange) < len(unknown_names):
            shown = ", ".join(dict.fromkeys(k.path for k in found)) or "none"
            raise ConfigError(f"{field}={','.join(v for v in unknown_names if v not in strange)}"
                              f": no such layer, class or path with a kernel in {model.name!r}; "
                              f"layers with kernels: {shown[:300]}")
    explicit_ids = set()
    if kernels is not None:
        candidates = _explicit_kernels(model, kernels, found)
        explicit_ids = {id(k) for k in candidates}
    else:
        candidates = found
    pruned, skipped, unfit = [], {}, []
    for path, (layer, weights) in unknown.items():
        skipped[path] = (f"{type(layer).__name__} holds weights {', '.join(weights)} that are "
                         f"not kernels of a layer tfaccel knows: {_OPT_IN}")
    first = candidates[0] if candidates and kernels is None else None
    for k in candidates:
        explicit = id(k) in explicit_ids or any(
            isinstance(i, str) and i in (k.path, k.key, k.path.rpartition("/")[2])
            for i in items)
        if any(_matches(k, e) for e in excluded):
            skipped[k.key] = "excluded"
            continue
        if items and kernels is None and not any(_matches(k, i) for i in items):
            skipped[k.key] = "not in include"
            continue
        dtype = tf.as_dtype(k.variable.dtype)
        if not dtype.is_floating:
            reason = f"a {dtype.name} (quantized) kernel: magnitude pruning needs float weights"
            fix = "prune the float model before quantizing it"
        else:
            reason = pattern_problem(k, m_by_n)
            fix = "prune it element-wise (m_by_n=None)"
            if reason:
                unfit.append(k.key)
        if reason and explicit:
            raise UnsupportedLayerError(f"kernel {k.key!r} {k.shape} cannot be pruned as asked: "
                                        f"{reason}; {fix}, or leave it out")
        if not reason and not explicit:
            if keep_first_conv and k is first and len(k.shape) >= 3:
                reason = "first convolution (kept dense: pruning it costs the most accuracy)"
            elif k.size < min_weights:
                reason = f"only {k.size} weights (< min_weights={min_weights})"
        if reason:
            skipped[k.key] = reason
        else:
            pruned.append(k)
    if not pruned:
        reasons = "; ".join(f"{key}: {why}" for key, why in list(skipped.items())[:6]) or \
            "no Dense, EinsumDense, Conv or Embedding kernel found"
        raise ConfigError(f"nothing to prune in {model.name!r}: {reasons[:400]}: "
                          f"{_nothing_to_prune_fix(skipped.values(), min_weights)}")
    return KernelPlan(tuple(pruned), skipped, tuple(unfit))


def _nothing_to_prune_fix(reasons, min_weights):
    """The ways out that match why each kernel stayed dense."""
    fixes = {"excluded": "remove names from exclude",
             "not in include": "name more layers in include",
             "first convolution": "set keep_first_conv=False",
             "< min_weights": f"lower min_weights (now {min_weights})",
             "sparsity needs": "drop m_by_n", "sparsity groups": "drop m_by_n",
             "not kernels of a layer": _OPT_IN.replace("give the layer", "give a custom layer")}
    return ways_out(reasons, fixes, f"give a model with kernels to prune, or {_OPT_IN}")


def ways_out(reasons, fixes, otherwise):
    """The fixes ({phrase in a reason: fix}) that match why kernels stayed dense, joined with
    'or', each once; `otherwise` when none matches. Shared by both pruning planners."""
    found = list(dict.fromkeys(fix for key, fix in fixes.items() if any(key in r for r in reasons)))
    return ", or ".join(found) if found else otherwise


# ---------------------------------------------------------------- models being pruned

_ACTIVE = weakref.WeakKeyDictionary()


def register_pruning(model, pruning):
    """Remembers that `pruning` (a `magnitude.MagnitudePruning`) prunes `model`, for the
    report, the sparsity logger and `strip_pruning`."""
    _ACTIVE[model] = pruning


def active_pruning(model):
    """The `MagnitudePruning` callback pruning `model` (until it is stripped), or None."""
    try:
        return _ACTIVE.get(model)
    except TypeError:  # an object that cannot be weakly referenced is pruned by nothing
        return None


def end_pruning(model):
    """Forgets `model`'s pruning (after its masks are baked in)."""
    _ACTIVE.pop(model, None)
