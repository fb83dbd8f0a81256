"""The names of a language model's compressed variants, and what each one is.

`tfaccel.compress.lm_report` builds and measures them; the names are parsed here, with
no TensorFlow, so that a recipe refuses a misspelt one while parsing its flags.

A name is a base, optionally after a pruning step:

- `float`: the model itself, in its Keras.
- `keras3_int8`, `keras3_int4`: Keras 3's `model.quantize` (int8: weights and activations
  int8; int4: weights in blocks of 128 inputs), measured in Keras (Keras 3 models only).
- `tflite_float`, `tflite_dynamic`: a `.tflite` file of one fixed window, float32 or with
  dynamic-range int8 weights (`tfaccel.compress.tflite_lm`), run in LiteRT.
- `int8`: the int8 this model's Keras has: `keras3_int8` for a Keras 3 model,
  `tflite_dynamic` for a tf_keras one (Keras 3's quantize does not take tf_keras models).
- `pruned_<NN>`: magnitude pruning (`tfaccel.compress.magnitude`, no TF-MOT, custom
  layers such as KerasHub's included) to NN% zeros in every prunable kernel during a short
  fine-tune, then stripped; `pruned_<NN>_<base>`: that pruned model, then the base (e.g.
  `pruned_50_int8`).

Example:

    from tfaccel.compress import lm_variants

    [v.base for v in lm_variants.parse_lm_variants(["float", "pruned_50_int8"])]
    # ['float', 'int8'];  .sparsity: None, 0.5
"""

import dataclasses
import re

from tfaccel.errors import ConfigError

BASES = ("float", "keras3_int8", "keras3_int4", "tflite_float", "tflite_dynamic", "int8")
"""What a variant ends as (see the module docstring)."""

DEFAULT_LM_VARIANTS = ("float", "keras3_int8", "keras3_int4", "tflite_float", "tflite_dynamic",
                       "pruned_50", "pruned_50_int8")
"""Every kind of variant once: what `recipes/optimize_lm.py` builds by default."""

_PRUNED = re.compile(r"pruned_(\d{1,2})(?:_(.+))?")


@dataclasses.dataclass(frozen=True)
class LMVariant:
    """One parsed variant name: `sparsity` (None: not pruned) then `base`."""

    name: str
    base: str
    sparsity: float = None


def parse_lm_variant(name):
    """The `LMVariant` of `name`, e.g. 'keras3_int4', 'pruned_50', 'pruned_75_tflite_dynamic'.

    Raises:
      ConfigError: a name that is none of those (one line listing what is).
    """
    name = str(name).strip()
    if name in BASES:
        return LMVariant(name, name)
    match = _PRUNED.fullmatch(name)
    if match and 1 <= int(match.group(1)) <= 99 and match.group(2) in (None, *BASES[1:]):
        return LMVariant(name, match.group(2) or "float", int(match.group(1)) / 100)
    raise ConfigError(f"unknown language-model variant {name!r}: use one of {', '.join(BASES)}, "
                      f"pruned_<NN> (NN% zeros, 1-99) or pruned_<NN>_<one of "
                      f"{', '.join(BASES[1:])}>")


def parse_lm_variants(names):
    """`LMVariant`s of `names` in order, each once; float first (the baseline of ratios).

    Raises:
      ConfigError: an unknown name, or none at all.
    """
    parsed = [parse_lm_variant(n) for n in dict.fromkeys(names)]
    if not parsed:
        raise ConfigError(f"no variants given: name some, e.g. {','.join(DEFAULT_LM_VARIANTS)}")
    return ([LMVariant("float", "float")]
            + [v for v in parsed if v.name != "float"])
