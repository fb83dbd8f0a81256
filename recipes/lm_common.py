"""What the language-model recipes share (train_lm.py, generate.py, bench_lm.py).

Their own flags (`define_flags`: the text and GPT flags defined here, and the shared ones
of recipes/shared_flags.py), checked while they are parsed (the heads divide the width, the
windows fit the model's context), and from those flags to tfaccel calls: the corpus and its
vocabulary; the decoder; the training and validation windows for `fit` under a strategy;
and the compile. Flags are read here and in the recipes only.
"""

import collections
import dataclasses
import os

import common
from absl import flags
from flagkit import DATA, FLAGS, MODEL, PERFORMANCE, TRAINING, check_flags

from tfaccel import choices
from tfaccel.errors import ConfigError

MODEL_DIR_PREFIX = "lm-"  # runs/lm-text-gpt by default
LM_MODELS = ("gpt", "gpt2")  # tfaccel's GPT (tf_keras), KerasHub's GPT2CausalLM (Keras 3)
# fit_batch: the windows of one of fit's steps (Keras 3 accumulating in its optimizer: a
# micro-batch); fit_steps: fit's steps per epoch for --steps_per_epoch updates.
LMInputs = collections.namedtuple("LMInputs", "train validation steps_per_epoch fit_batch "
                                  "fit_steps", defaults=(None, None))


# The language model's defaults (train_lm.py and benchmarks/bench_lm.py define the same flags
# here): 8 epochs x 250 steps of 12 windows, AdamW at 3e-3 with beta2 0.99 and clipping at 1,
# half an epoch of warmup, then a cosine to a tenth (measured: docs/language-models.md).
EPOCHS, STEPS_PER_EPOCH, BATCH_SIZE, LEARNING_RATE = 8, 250, 12, 3e-3


def define_text_flags():
    """--dataset=text, --data_dir, --tokenizer, --sequence_length (tfaccel.data.text)."""
    flags.DEFINE_enum("dataset", "text", choices.TEXT_DATASETS, "text: the Python standard "
                      "library's pydoc_data.topics (465k characters), or --data_dir.",
                      module_name=DATA)
    flags.DEFINE_string("data_dir", None, "A UTF-8 text file, or a folder of .txt/.md/.rst/.py "
                        "files (read in sorted order), instead of the default corpus.",
                        module_name=DATA)
    flags.DEFINE_enum("tokenizer", "char", choices.TOKENIZERS, "char: the training text's "
                      "characters (saved with the model); byte: UTF-8 bytes (256, nothing "
                      "unknown).", module_name=DATA)
    flags.DEFINE_integer("sequence_length", 0, "Tokens per training window (0: the model's "
                         "context).", lower_bound=0, module_name=DATA)


def define_gpt_flags():
    """--model (gpt or a .keras file), --gpt_size and its overrides, --recompute."""
    flags.DEFINE_enum("model", "gpt", LM_MODELS, "gpt: tfaccel's decoder-only Transformer of "
                      "--gpt_size (tf_keras); gpt2: KerasHub's GPT2CausalLM of the same sizes "
                      "(Keras 3, built from the config, nothing downloaded; pip install -e "
                      "'.[hub]'). recipes/generate.py loads what train_lm.py exports.",
                      module_name=MODEL)
    flags.DEFINE_string("model_fn", None, "package.module:function(vocabulary_size, "
                        "sequence_length) returning a Keras 3 causal LM (token ids [batch, "
                        "length], or KerasHub's token_ids/padding_mask dict, to logits [batch, "
                        "length, vocabulary]); overrides --model. Its folder must be on "
                        "PYTHONPATH.", module_name=MODEL)
    flags.DEFINE_enum("gpt2_init", "scaled", ("scaled", "keras_hub"), "--model=gpt2's "
                      "initialization: scaled: redrawn as tfaccel's GPT draws its own (a normal "
                      "of 0.02 x sqrt(768/d_model), MLP outputs / sqrt(2 layers)); keras_hub: "
                      "GPT-2's (a flat 0.02).", module_name=MODEL)
    flags.DEFINE_enum("gpt_size", "tiny", tuple(choices.GPT_SIZES), "Named size: "
                      + "; ".join(f"{k}: {v['layers']} layers, {v['heads']} heads, d_model "
                                  f"{v['d_model']}, context {v['context']}"
                                  for k, v in choices.GPT_SIZES.items()) + ".",
                      module_name=MODEL)
    for name, what in (("layers", "Transformer blocks"), ("heads", "attention heads"),
                       ("d_model", "model width"), ("context", "longest sequence (positions)")):
        flags.DEFINE_integer(f"gpt_{name}", None, f"{what.capitalize()} (default: "
                             "--gpt_size's).", lower_bound=1, module_name=MODEL)
    flags.DEFINE_float("gpt_dropout", 0.0, "Dropout in the blocks (0 <= p < 1).",
                       lower_bound=0.0, upper_bound=0.99, module_name=MODEL)
    flags.DEFINE_bool("tie_embeddings", False, "Share the token embedding with the output "
                      "layer (fewer parameters).", module_name=MODEL)
    flags.DEFINE_bool("recompute", False, "Recompute each block's activations in the backward "
                      "pass (tf.recompute_grad): activation memory of one block, not all, for "
                      "about one more forward pass of compute.", module_name=PERFORMANCE)


def define_flags():
    """Every flag the language-model recipe and its benchmark share, with their defaults."""
    define_text_flags()
    define_gpt_flags()
    common.define_train_flags(epochs=EPOCHS, batch_size=BATCH_SIZE, learning_rate=LEARNING_RATE,
                              optimizer="adamw")
    flags.DEFINE_integer("steps_per_epoch", STEPS_PER_EPOCH, "Optimizer steps per epoch "
                         "(validation, a sample and a backup chance at each epoch's end).",
                         lower_bound=1, module_name=TRAINING)
    common.define_optimizer_flags(beta2=0.99, clip_norm=1.0)
    common.define_distribute_flags()
    common.define_backup_flags(default_freq=common.TRAIN_BACKUP_FREQ)
    common.define_schedule_flags("cosine", warmup_epochs=0.5, min_lr_ratio=0.1)
    common.define_performance_flags(batch_search=False)
    # What wins on the machine at hand, measured (docs/language-models.md, "Speed"): the
    # trials' table is printed and logged; pass --precision/--jit_compile to skip them.
    FLAGS.set_default("precision", "auto")
    FLAGS.set_default("jit_compile", "auto")
    flags.DEFINE_string("prompt", "The ", "Text the per-epoch samples (and metrics.json's) "
                        "start from.", module_name=TRAINING)
    flags.DEFINE_integer("sample_tokens", 200, "Tokens of each per-epoch sample (0: none).",
                         lower_bound=0, module_name=TRAINING)
    check_flags(("gpt_size", "gpt_layers", "gpt_heads", "gpt_d_model", "gpt_context",
                 "sequence_length"), _check_shape)


def check_model_flags():
    """Registers the check of --model/--model_fn against the flags only tfaccel's GPT
    takes; call it once every flag it reads is defined (train_lm.py: after the parallel
    flags)."""
    check_flags(("model", "model_fn", "recompute", "tie_embeddings", "plan", "parallel",
                 "strategy"), _check_brought_model)


def _check_brought_model(model="gpt", model_fn=None, recompute=False, tie_embeddings=False,
                         plan=False, parallel="none", strategy="auto"):
    """A Keras 3 model (--model=gpt2, --model_fn) with a flag only tfaccel's GPT (tf_keras)
    takes, or --model=gpt2 without KerasHub: one line, while the flags are parsed."""
    import importlib.util

    if not model_fn and model == "gpt":
        return
    which = f"--model_fn={model_fn}" if model_fn else f"--model={model}"
    if not model_fn and importlib.util.find_spec("keras_hub") is None:
        raise ConfigError(f"{which} needs KerasHub, which is not installed: pip install -e "
                          "'.[hub]' (keras-hub 0.32), or train tfaccel's GPT (--model=gpt)")
    refused = [(f"--{name}", why) for name, given, why in (
        ("recompute", recompute, "it recomputes tfaccel's GPT blocks"),
        ("tie_embeddings", tie_embeddings, "KerasHub's GPT-2 always ties its embedding"
         if not model_fn else "your function decides its embedding"),
        ("plan", plan and bool(model_fn), "the plan reads the decoder's sizes from the GPT "
         "flags, which do not describe your model"),
        ("parallel", parallel != "none", "train_lm's stages split tfaccel's GPT blocks; "
         "--strategy=mirrored with --grad_accum_steps trains it on several devices"),
        ("strategy", strategy == "multi_worker", "Keras 3.15's fit fails under it "
         "(keras-team/keras#20585)")) if given]
    if refused:
        flag, why = refused[0]
        raise ConfigError(f"{flag} cannot train {which}, a Keras 3 model ({why}): drop {flag}, "
                          "or train tfaccel's GPT (--model=gpt)")


def is_keras3_model():
    """True when the flags ask for a Keras 3 language model (--model=gpt2 or --model_fn)."""
    return bool(FLAGS.model_fn) or FLAGS.model != "gpt"


def gpt_shape(gpt_size, gpt_layers=None, gpt_heads=None, gpt_d_model=None, gpt_context=None):
    """(layers, heads, d_model, context) of --gpt_size with the --gpt_* overrides given."""
    size = choices.GPT_SIZES[gpt_size]
    return (gpt_layers or size["layers"], gpt_heads or size["heads"],
            gpt_d_model or size["d_model"], gpt_context or size["context"])


def _window(length, context):
    """--sequence_length, or the model's context when 0; a longer one is refused."""
    length = length or context
    if length > context:
        raise ConfigError(f"--sequence_length={length} is larger than the model's context "
                          f"{context}: pass --sequence_length<={context}, or "
                          f"--gpt_context>={length}")
    return length


def _check_shape(sequence_length, **gpt):
    _, heads, d_model, context = gpt_shape(**gpt)
    if d_model % heads:
        divisor = max(h for h in range(1, min(heads, d_model) + 1) if d_model % h == 0)
        raise ConfigError(f"--gpt_heads={heads} does not divide --gpt_d_model={d_model}: pick "
                          f"heads that divide it (e.g. {divisor}) or another d_model")
    _window(sequence_length, context)


def _flags_gpt_shape():
    return gpt_shape(FLAGS.gpt_size, FLAGS.gpt_layers, FLAGS.gpt_heads, FLAGS.gpt_d_model,
                     FLAGS.gpt_context)


def model_context():
    """The context (longest sequence) of the model the flags ask for, known before any
    TensorFlow: --gpt_context or --gpt_size's."""
    return _flags_gpt_shape()[3]


def sequence_length():
    """--sequence_length, or the model's context when 0 (checked when the flags were parsed)."""
    return _window(FLAGS.sequence_length, model_context())


def load_text(length):
    """The corpus the flags ask for, tokenized and split (`tfaccel.data.text.TextSplits`)."""
    from tfaccel.data import text

    return text.load_text_dataset(FLAGS.data_dir, FLAGS.tokenizer, sequence_length=length)


def gpt_config(vocab_size):
    """The `tfaccel.train.gpt.GPTConfig` of the --gpt_* flags for a `vocab_size` vocabulary."""
    from tfaccel.train import gpt

    layers, heads, d_model, context = _flags_gpt_shape()
    return gpt.gpt_config(FLAGS.gpt_size, vocab_size=vocab_size, layers=layers, heads=heads,
                          d_model=d_model, context=context, dropout=FLAGS.gpt_dropout,
                          tie_embeddings=FLAGS.tie_embeddings)


def build_language_model(vocab_size, recompute=None, length=None):
    """The decoder the flags ask for (call it in the strategy's scope, after the precision
    policy is set): tfaccel's GPT (`recompute` defaults to --recompute), KerasHub's GPT-2
    of the same sizes (--model=gpt2), or --model_fn's model for `length`-token windows
    (default: the model's context)."""
    from tfaccel.train import causal_lm, gpt

    if FLAGS.model_fn:
        return causal_lm.language_model_from_fn(FLAGS.model_fn, vocab_size,
                                                length or model_context())
    if FLAGS.model == "gpt2":
        layers, heads, d_model, context = _flags_gpt_shape()
        return causal_lm.keras_hub_gpt2(vocab_size, layers, heads, d_model, context,
                                        dropout=FLAGS.gpt_dropout, init=FLAGS.gpt2_init,
                                        seed=FLAGS.seed)
    return gpt.build_gpt(gpt_config(vocab_size),
                         recompute=FLAGS.recompute if recompute is None else recompute)


def model_settings(vocab_size):
    """What the flags build, as a dict for reports, metrics.json and the resume check: the
    GPT's config, or KerasHub's GPT-2 sizes, or the --model_fn."""
    if FLAGS.model_fn:
        return {"model_fn": FLAGS.model_fn, "vocab_size": vocab_size,
                "context": model_context()}
    if FLAGS.model == "gpt2":
        layers, heads, d_model, context = _flags_gpt_shape()
        return {"model": "keras_hub.GPT2CausalLM", "vocab_size": vocab_size, "layers": layers,
                "heads": heads, "d_model": d_model, "intermediate_dim": 4 * d_model,
                "context": context, "dropout": FLAGS.gpt_dropout, "tie_embeddings": True,
                "init": FLAGS.gpt2_init}
    return gpt_config(vocab_size).to_json()


def model_headline(settings):
    """One line of what `settings` (`model_settings`) describe, for the recipe's output."""
    if "model_fn" in settings:
        return f"--model_fn={settings['model_fn']}"
    name = "KerasHub GPT2CausalLM" if settings.get("model") else "GPT"
    return (f"{name} {settings['layers']} layers x {settings['heads']} heads x d_model "
            f"{settings['d_model']}, context {settings['context']}")


def lm_inputs(splits, length, strategy, epoch=None, model=None):
    """Training and validation windows of `splits` for `fit` under `strategy`, global
    --batch_size; training is an endless stream of which epoch k (of --steps_per_epoch
    updates) is the same in an uninterrupted and in a resumed run (`epoch`:
    `resume.EpochCounter().epoch`). With `model`, the windows are what it takes (KerasHub's
    dict), in the batches `fit` gives it (`common.fit_batch_size`: a Keras 3 model
    accumulating in its optimizer gets --grad_accum_steps micro-batches an update)."""
    from tfaccel import distribute
    from tfaccel.data import text
    from tfaccel.train import causal_lm

    workers = distribute.num_workers(strategy)
    fit_batch = (FLAGS.batch_size if model is None else
                 common.fit_batch_size(model, FLAGS.batch_size, FLAGS.grad_accum_steps))
    fit_steps = FLAGS.steps_per_epoch * (FLAGS.batch_size // fit_batch)
    train = text.text_dataset(splits.train, length, fit_batch, training=True,
                              seed=FLAGS.seed, epoch=epoch, steps_per_epoch=fit_steps)
    validation = text.text_dataset(splits.validation, length, FLAGS.batch_size, training=False,
                                   drop_remainder=distribute.needs_drop_remainder(strategy))
    if model is not None:
        train, validation = (causal_lm.with_model_inputs(ds, model) for ds in (train, validation))
    return LMInputs(*(distribute.with_shard_policy(ds, True, workers)
                      for ds in (train, validation)), FLAGS.steps_per_epoch, fit_batch,
                    fit_steps)


def compile_from_flags(model, learning_rate, policy="float32", jit_compile=False,
                       accum_steps=1):
    """`common.compile_from_flags` for a language model (next-token loss from logits)."""
    from tfaccel.train import language_model

    return common.compile_from_flags(model, learning_rate, policy, jit_compile, accum_steps,
                                     compile_fn=language_model.compile_language_model)


def memory_plan(model, batch_size, policy, replicas, length):
    """The memory plan of the decoder the flags describe (from its size: what TensorFlow's
    gradient graph keeps per block), `batch_size` sequences of `length` tokens per device."""
    from tfaccel.performance import memory_profile, plan
    from tfaccel.train import gpt

    config = gpt.gpt_config_of(model)
    if config is None:  # KerasHub's GPT-2 (--model_fn refuses --plan): the flags' sizes, tied
        config = dataclasses.replace(gpt_config(int(model.backbone.vocabulary_size)),
                                     tie_embeddings=True)
    profile = memory_profile.profile_transformer(
        config.layers, config.d_model, config.heads, config.vocab_size, length,
        tied=config.tie_embeddings, half=policy != "float32", dropout=config.dropout,
        context=config.context)
    memory = FLAGS.device_memory or plan.default_device_memory()[0]
    return plan.plan_memory(profile, plan.PlanSettings(
        batch_size=batch_size, precision=policy, optimizer=FLAGS.optimizer,
        grad_accum_steps=FLAGS.grad_accum_steps, replicas=replicas, device_memory=memory,
        recompute=FLAGS.recompute))


MODEL_CONFIG_FILE = "model_config.json"  # what a backup in --backup_dir was trained as


def model_description(settings, length):
    """What a backup must match to be resumed: the decoder (`model_settings`),
    recomputation, tokens."""
    return {**settings, "recompute": bool(FLAGS.recompute),
            "tokenizer": FLAGS.tokenizer, "sequence_length": length}


def check_resumable(model_dir, backup_dir, description):
    """Raises ConfigError (one line) when `backup_dir` holds a backup of another model than
    `description` (its checkpoint would not load): say which setting changed."""
    import json

    from tfaccel.train import resume

    path = os.path.join(model_dir, MODEL_CONFIG_FILE)
    if resume.read_backup(backup_dir) is None or not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        before = json.load(f)
    changed = [f"{k}={before.get(k)!r} -> {v!r}" for k, v in description.items()
               if before.get(k) != v]
    if changed:
        raise ConfigError(f"the backup in {backup_dir} is of another model ({', '.join(changed)})"
                          ": rerun with its flags to resume it, or remove that folder to start "
                          "again")


def lm_row(loss, unit):
    """{'loss', 'bits_per_<unit>', 'perplexity'} of a validation loss in nats per token."""
    from tfaccel.train import language_model

    return {"loss": loss, **language_model.language_model_metrics(loss, unit)}


def tflite_rows(model, tokens, length, model_dir, unit):
    """model.tflite and model_int8.tflite (dynamic-range int8) of the float32 `model` in
    `model_dir`, each with its validation loss on `tokens` and its size: report rows. A
    Keras 3 model converts from itself (`tfaccel.compress.tflite.convert_to_tflite`, at
    `length` tokens), a dict-taking one through `causal_lm.token_ids_model` (one input)."""
    from tfaccel.compress import tflite, tflite_lm
    from tfaccel.keras import is_keras3_object
    from tfaccel.train import causal_lm

    def convert(mode, path):
        if not is_keras3_object(model):
            return tflite_lm.language_model_tflite(model, path, mode=mode, sequence_length=length)
        return tflite.convert_to_tflite(causal_lm.token_ids_model(model, length), path,
                                        mode=tflite_lm.LM_MODES[mode], sequence_length=length)

    rows = []
    for mode, name in (("float", "model.tflite"), ("dynamic_range", "model_int8.tflite")):
        path = convert(mode, os.path.join(model_dir, name))
        result = tflite_lm.evaluate_language_model_tflite(path, tokens, length)
        rows.append({"model": name, "precision": "int8 weights" if mode != "float" else
                     "float32", **lm_row(result["loss"], unit),
                     "size_mb": os.path.getsize(path) / 1e6})
    return rows


def run(main):
    """Runs a language-model recipe (`common.run`): flags parsed and checked, then the output
    folders, all before TensorFlow is imported."""
    common.run(main, MODEL_DIR_PREFIX)
