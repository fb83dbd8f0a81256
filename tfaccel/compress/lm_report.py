"""A trained language model's compressed variants side by side: loss, size, generation speed.

`measure_lm_variants` takes a causal language model (tfaccel's GPT in tf_keras, or a
Keras 3 one such as KerasHub's `GPT2CausalLM` built without a preprocessor), its
training and validation tokens, and variant names (`tfaccel.compress.lm_variants`:
float, Keras 3 int8/int4, float and dynamic-range TFLite, pruned to NN% with a short
fine-tune, pruned then quantized). It builds each one and measures, in one run:

- the validation loss over the same non-overlapping windows (nats per token: per
  character for the char tokenizer), bits per token and perplexity;
- the size as stored: a `.tflite` file, or a Keras model's variables (int8 one byte a
  value, packed int4 half; `keras3_quantize.keras_weight_sizes`), raw and gzipped;
- greedy generation of the same tokens after the same prompt, timed: `tokens_per_sec` is
  the variant's own fastest path (a Keras model decodes with its key/value cache,
  `tfaccel.train.generate`; a `.tflite` file has one fixed window and runs it whole for
  each token), and `window_tokens_per_sec` the whole window per token for every variant,
  the like-for-like comparison. All variants are timed interleaved in rounds, so load
  from other processes falls on all alike, and `tokens_per_cpu_sec` counts the process's
  CPU time instead of the clock's (what a token costs, barely moved by other load);
- for pruned variants the share of zeros in the pruned kernels, counted from the weights.

A variant that cannot be built for this model (Keras 3's quantize on a tf_keras model, a
conversion TFLite refuses) is a row with its one-line `refused` reason, not an error.
`write_lm_report` writes the rows as markdown and JSON, a plot of loss against gzipped
size and one of tokens/s, and the table and plots to TensorBoard.

Example:

    from tfaccel.compress import lm_report

    model, vocab = lm_report.load_causal_lm("runs/lm-text-gpt")
    rows = lm_report.measure_lm_variants(
        model, splits.train, splits.validation, 64, ["float", "int8", "pruned_50_int8"],
        directory="runs/lm-text-gpt/optimize/files", unit="char", finetune_steps=200,
        prompt_ids=vocab.encode("The "))
    lm_report.write_lm_report("runs/lm-text-gpt/optimize", "runs/lm-text-gpt/optimize/logs",
                              rows, {"model": "gpt"})
"""

import os
import time
import zipfile

import numpy as np
import tensorflow as tf

from tfaccel import plots, summaries
from tfaccel.compress import keras3_quantize, magnitude, prunable, tflite_lm
from tfaccel.compress.lm_variants import DEFAULT_LM_VARIANTS, parse_lm_variants
from tfaccel.compress.tflite_eval import make_interpreter, tflite_sizes
from tfaccel.data.text import text_dataset
from tfaccel.errors import ConfigError, ModelError, TfaccelError, first_line
from tfaccel.io import write_json, write_text
from tfaccel.keras import copy_model, flavour_of, keras_of, saved_flavour
from tfaccel.train import generate
from tfaccel.train.kv_cache import decoder_for, model_inputs
from tfaccel.train.language_model import compile_language_model, language_model_metrics
from tfaccel.train.training import make_optimizer

COLUMNS = ("variant", "runtime", "loss", "perplexity", "loss_change", "bytes", "gzip_bytes",
           "size_ratio", "tokens_per_sec", "tokens_per_cpu_sec", "decode",
           "window_tokens_per_sec",
           "same_greedy_prefix", "pruned_sparsity", "refused")
"""Columns of the report's table, in order (`description` follows them)."""

_KERAS3_MODES = {"keras3_int8": "int8", "keras3_int4": "int4"}
_TFLITE_MODES = {"tflite_float": "float", "tflite_dynamic": "dynamic_range"}
_DESCRIPTIONS = {
    "float": "the trained model, float32, in its Keras",
    "keras3_int8": "Keras 3 quantize('int8'): int8 weights, activations int8 on the fly",
    "keras3_int4": "Keras 3 quantize('int4'): int4 weights in blocks of 128 inputs",
    "tflite_float": "float32 .tflite of one fixed window (LiteRT)",
    "tflite_dynamic": "dynamic-range .tflite: int8 weights, float activations (LiteRT)"}


def _needs_keras_hub(path):
    """True when the .keras file at `path` holds classes of KerasHub (its config names them)."""
    try:
        with zipfile.ZipFile(path) as archive:
            return '"keras_hub' in archive.read("config.json").decode("utf-8", "replace")
    except (KeyError, OSError, zipfile.BadZipFile):
        return False


def load_causal_lm(directory):
    """(model, vocabulary) of a folder holding `model.keras` and `vocabulary.json`, as
    `recipes/train_lm.py` writes them: the model in the Keras that saved it (KerasHub
    imported first when the file holds its classes), without its optimizer.

    Raises:
      ModelError: a file is missing or unreadable, KerasHub is needed and not installed,
        or the model and vocabulary disagree.
    """
    model_path = os.path.join(directory, generate.MODEL_FILE)
    vocab_path = os.path.join(directory, generate.VOCABULARY_FILE)
    missing = [p for p in (model_path, vocab_path) if not os.path.isfile(p)]
    if missing:
        raise ModelError(f"{directory} holds no trained language model ({', '.join(missing)} "
                         "missing): give a folder recipes/train_lm.py wrote")
    if saved_flavour(model_path)[0] == "keras3" and _needs_keras_hub(model_path):
        try:
            import keras_hub  # noqa: F401  # deferred: KerasHub registers its classes
        except ImportError as e:
            raise ModelError(f"{model_path} holds a KerasHub model and KerasHub is not "
                             f"installed ({e}): pip install -e '.[hub]'") from None
    return generate.load_language_model(directory)


# ---------------------------------------------------------------- building the variants

def _compile_for_training(model, learning_rate):
    """`model` compiled for next-token training in its own Keras: AdamW, loss from logits."""
    optimizer = make_optimizer("adamw", learning_rate, beta_2=0.99, clip_norm=1.0,
                               flavour=flavour_of(model))
    if flavour_of(model) == "tf_keras":
        return compile_language_model(model, optimizer)
    loss = keras_of(model).losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=optimizer, loss=loss)
    return model


def pruned_copy(model, sparsity, train_tokens, sequence_length, steps, batch_size=12,
                learning_rate=3e-4, seed=0):
    """A copy of `model` magnitude-pruned to `sparsity` zeros in each prunable kernel while it
    trains `steps` batches of `train_tokens` windows, then stripped (`model` is untouched).

    The sparsity ramps up (TF-MOT's polynomial schedule) over the first two thirds of the
    steps and holds for the rest, so the last third fine-tunes around the final zeros.

    Returns:
      (pruned model, its pruned kernels: `prunable.Kernel`s, variables of the copy).

    Raises:
      ConfigError: `steps` < 1 or a bad sparsity. ModelError: the model cannot be copied.
    """
    if int(steps) < 1:
        raise ConfigError(f"fine-tune steps={steps}: pruning needs at least 1 training step "
                          "(e.g. 200)")
    steps = int(steps)
    pruned = _compile_for_training(copy_model(model, "prune a copy of"), learning_rate)
    frequency = max(1, steps // 20)
    end_step = max(frequency, (2 * steps // 3) // frequency * frequency)
    _, callbacks = magnitude.prune_magnitude(pruned, sparsity, end_step=end_step,
                                             frequency=frequency)
    kernels = list(prunable.active_pruning(pruned).plan.kernels)
    windows = text_dataset(train_tokens, sequence_length, batch_size, training=True, seed=seed,
                           steps_per_epoch=steps)
    windows = windows.map(lambda x, y: (model_inputs(pruned, x), y))
    pruned.fit(windows, epochs=1, steps_per_epoch=steps, callbacks=callbacks, verbose=0,
               shuffle=False)
    return magnitude.strip_magnitude(pruned), kernels


def kernel_sparsity(kernels):
    """Share of exact zeros in `kernels` (`prunable.Kernel`s), counted from their weights."""
    values = [np.asarray(k.variable.numpy()) for k in kernels]
    return sum(int(np.count_nonzero(v == 0)) for v in values) / max(1, sum(v.size for v in values))


def _base(variant, model):
    if variant.base != "int8":
        return variant.base
    return "keras3_int8" if flavour_of(model) == "keras3" else "tflite_dynamic"


def _build(variant, source, base, directory, sequence_length):
    """(runtime, Keras model or .tflite path) of `base` applied to `source`."""
    if base == "float":
        return "keras", source
    if base in _KERAS3_MODES:
        if flavour_of(source) != "keras3":
            raise ModelError(f"{source.name!r} is a tf_keras model and Keras 3's quantize takes "
                             "Keras 3 models only: use tflite_dynamic (int8 weights in a .tflite "
                             "file), or int8, which picks it for tf_keras models")
        return "keras", keras3_quantize.keras3_quantized(source, _KERAS3_MODES[base])
    path = os.path.join(directory, f"{variant.name}.tflite")
    return "tflite", tflite_lm.language_model_tflite(source, path, _TFLITE_MODES[base],
                                                     sequence_length)


def _description(variant, base, finetune_steps):
    text = _DESCRIPTIONS[base]
    if variant.base == "int8":
        text = f"int8 of this Keras: {text}"
    if variant.sparsity is None:
        return text
    pruned = (f"magnitude-pruned to {variant.sparsity:.0%} zeros during {finetune_steps} "
              "fine-tune steps, stripped")
    return pruned if base == "float" else f"{pruned}; then {text}"


# ---------------------------------------------------------------- measuring them

def keras_language_model_loss(model, tokens, sequence_length, max_windows=None, batch_size=32):
    """Mean next-token cross-entropy (nats per token) of a Keras causal LM over the
    non-overlapping windows of `tokens`, as `tflite_lm.evaluate_language_model_tflite`
    cuts them (so a Keras variant's loss sits beside a file's)."""
    x, y = tflite_lm.lm_windows(tokens, int(sequence_length), max_windows)
    logits_of = tf.function(lambda w: tf.cast(model(model_inputs(model, w), training=False),
                                              tf.float32),
                            input_signature=[tf.TensorSpec([None, x.shape[1]], tf.int32)])
    total = 0.0
    for start in range(0, len(x), batch_size):
        logits = logits_of(tf.constant(x[start:start + batch_size])).numpy()
        total += tflite_lm.cross_entropy(logits, y[start:start + batch_size]) * len(logits)
    return total / len(x)


def tflite_greedy_tokens(path, prompt_ids, max_new_tokens):
    """Greedy continuation of `prompt_ids` by a `.tflite` language model of one window
    [1, L]: the whole window runs for each token, and a full window drops its oldest token
    (what `generate.generate_tokens(temperature=0, use_cache=False, context=L)` does)."""
    interpreter = make_interpreter(path)
    inp, out = interpreter.get_input_details()[0], interpreter.get_output_details()[0]
    length = int(inp["shape"][1])
    tokens, new = [int(t) for t in prompt_ids][-length:], []
    for _ in range(int(max_new_tokens)):
        window = np.zeros((1, length), inp["dtype"])
        window[0, :len(tokens)] = tokens
        interpreter.set_tensor(inp["index"], window)
        interpreter.invoke()
        token = int(np.argmax(interpreter.get_tensor(out["index"])[0, len(tokens) - 1]))
        new.append(token)
        tokens = (tokens + [token])[-length:]
    return new


def _generators(runtime, made, prompt_ids, max_new_tokens, length):
    """{path name: fn() -> greedy token ids}: a Keras model's cached path (when it has a
    key/value cache) and its whole-window path; a file's whole-window path."""
    if runtime == "tflite":
        return {"window": lambda: tflite_greedy_tokens(made, prompt_ids, max_new_tokens)}

    def keras_path(use_cache):
        return lambda: generate.generate_tokens(made, prompt_ids, max_new_tokens, temperature=0,
                                                context=length, use_cache=use_cache)

    paths = {"window": keras_path(False)}
    if decoder_for(made, length) is not None:
        paths["cache"] = keras_path(True)
    return paths


def _size(runtime, made):
    return tflite_sizes(made) if runtime == "tflite" else keras3_quantize.keras_weight_sizes(made)


def _loss(runtime, made, tokens, length, max_windows):
    if runtime == "tflite":
        return tflite_lm.evaluate_language_model_tflite(made, tokens, length, max_windows)["loss"]
    return keras_language_model_loss(made, tokens, length, max_windows)


def measure_lm_variants(model, train_tokens, validation_tokens, sequence_length,
                        variants=DEFAULT_LM_VARIANTS, *, directory, unit="token",
                        finetune_steps=200, batch_size=12, learning_rate=3e-4, prompt_ids=(1,),
                        new_tokens=100, timing_rounds=3, max_windows=None, seed=0):
    """Builds each variant of `model` and measures loss, size and greedy generation speed.

    Args:
      model: a trained causal LM in float32 (tf_keras or Keras 3; left untouched).
      train_tokens: 1-D token ids the pruned variants fine-tune on (`TextSplits.train`).
      validation_tokens: 1-D token ids every variant's loss is measured on.
      sequence_length: tokens per window (the model's training window): the loss
        windows, the `.tflite` files' input and the generation window.
      variants: names (`lm_variants.parse_lm_variants`); float is always measured.
      directory: where `.tflite` files go.
      unit: what a token is ('char', 'byte', 'token'): names the bits column.
      finetune_steps, batch_size, learning_rate, seed: the pruned variants' fine-tune
        (AdamW, from a fresh optimizer).
      prompt_ids: token ids generation starts from (the same for every variant).
      new_tokens: greedy tokens generated per timed run.
      timing_rounds: timed generations per path, interleaved across variants.
      max_windows: measure the loss on the first windows only (None: all).

    Returns:
      Rows (dicts), one per variant in order: `variant`, `description`, `runtime`
      ('keras'|'tflite'), `loss` (nats per token), `bits_per_<unit>`, `perplexity`,
      `loss_change` (vs float), `bytes`, `gzip_bytes`, `size_ratio` (float bytes /
      these), `tokens_per_sec` (median of `timing_rounds`), `tokens_per_cpu_sec`, `decode`
      ('kv cache'|'full window'),
      `window_tokens_per_sec`, `same_greedy_prefix` (how many greedy tokens equal float's
      before the first that differs), `path` (a file), `pruned_sparsity`; or `variant`,
      `description`, `refused` (one line) where the variant cannot be built for this model.

    Raises:
      ConfigError: an unknown variant name, bad steps or token arrays.
    """
    specs = parse_lm_variants(variants)
    length = int(sequence_length)
    prompt_ids = [int(t) for t in np.asarray(prompt_ids).reshape(-1)]
    os.makedirs(directory, exist_ok=True)
    pruned, built, rows = {}, {}, []  # pruned: sparsity -> (model, layers) or the refusal
    for spec in specs:
        base = _base(spec, model)
        row = {"variant": spec.name, "description": _description(spec, base, finetune_steps)}
        try:
            source = model
            if spec.sparsity is not None:
                if spec.sparsity not in pruned:
                    try:
                        pruned[spec.sparsity] = pruned_copy(
                            model, spec.sparsity, train_tokens, length, finetune_steps,
                            batch_size, learning_rate, seed)
                    except (ModelError, ConfigError) as e:
                        pruned[spec.sparsity] = e
                if isinstance(pruned[spec.sparsity], Exception):
                    raise pruned[spec.sparsity]
                source, kernels = pruned[spec.sparsity]
                row["pruned_sparsity"] = kernel_sparsity(kernels)
            built[spec.name] = _build(spec, source, base, directory, length)
        except TfaccelError as e:
            rows.append({**row, "refused": first_line(e)})
            continue
        runtime, made = built[spec.name]
        loss = _loss(runtime, made, validation_tokens, length, max_windows)
        rows.append({**row, "runtime": runtime, "loss": loss,
                     **language_model_metrics(loss, unit), **_size(runtime, made),
                     **({"path": made} if runtime == "tflite" else {})})
    _measure_generation(rows, built, prompt_ids, new_tokens, length, timing_rounds)
    base = rows[0]
    for row in rows:
        if "loss" in row:
            row["loss_change"] = row["loss"] - base["loss"]
            row["size_ratio"] = base["bytes"] / row["bytes"]
    return rows


def _time_interleaved(paths, rounds):
    """{key: (median wall seconds, median process CPU seconds)} of each `paths[key]()`,
    timed in `rounds` rounds that run every path once, in turn (load from other processes
    falls on all alike; CPU time, summed over this process's threads, barely sees it)."""
    seconds = {key: ([], []) for key in paths}
    for _ in range(int(rounds)):
        for key, run in paths.items():
            wall, cpu = time.perf_counter(), time.process_time()
            run()
            seconds[key][0].append(time.perf_counter() - wall)
            seconds[key][1].append(time.process_time() - cpu)
    return {key: (float(np.median(w)), float(np.median(c))) for key, (w, c) in seconds.items()}


def _measure_generation(rows, built, prompt_ids, new_tokens, length, rounds):
    """Adds the generation columns to `rows`: every path's tokens once (its trace), then
    all paths timed interleaved, `rounds` generations each."""
    paths, tokens = {}, {}
    for name, (runtime, made) in built.items():
        for kind, run in _generators(runtime, made, prompt_ids, new_tokens, length).items():
            paths[(name, kind)] = run
            tokens[(name, kind)] = run()
    timed = _time_interleaved(paths, rounds)
    reference = tokens[("float", "window")]
    for row in rows:
        name = row["variant"]
        if name not in built:
            continue
        best = "cache" if (name, "cache") in timed else "window"
        wall, cpu = timed[(name, best)]
        row.update(tokens_per_sec=new_tokens / wall, tokens_per_cpu_sec=new_tokens / cpu,
                   decode="kv cache" if best == "cache" else "full window",
                   window_tokens_per_sec=new_tokens / timed[(name, "window")][0],
                   same_greedy_prefix=_common_prefix(tokens[(name, best)], reference))


def _common_prefix(tokens, reference):
    """How many leading tokens of `tokens` equal `reference`'s (after the first difference
    the texts go their own ways, so later matches mean nothing)."""
    same = [a == b for a, b in zip(tokens, reference)] + [False]
    return same.index(False)


# ---------------------------------------------------------------- the report

def markdown_lm_report(rows, summary, title="Language-model variants"):
    """The report as markdown: title, the summary as a two-column table, the variants."""
    unit = next((k for r in rows for k in r if k.startswith("bits_per_")), None)
    columns = [c for c in COLUMNS if any(c in r for r in rows)]
    if unit:
        columns.insert(columns.index("perplexity"), unit)
    return "\n\n".join([
        f"# {title}",
        summaries.markdown_table({k: v for k, v in summary.items()
                                  if not isinstance(v, (dict, list))}),
        "## Variants (loss: validation nats per token; sizes in bytes; tokens/s: greedy "
        "generation; ratios vs float)",
        summaries.markdown_table(rows, columns + ["description"]),
    ]) + "\n"


def plot_loss_vs_size(rows, path, title="Validation loss vs size"):
    """A PNG scatter of validation loss against gzipped size (KB, log scale), one point per
    measured variant, labelled with its tokens per CPU-second; returns `path` (written
    atomically)."""
    fig, ax = plots.new_figure(7, 4.5)
    measured = [r for r in rows if "loss" in r]
    for row in measured:
        x = row["gzip_bytes"] / 1024
        ax.scatter([x], [row["loss"]], s=50, zorder=3)
        ax.annotate(f"{row['variant']} ({row['tokens_per_cpu_sec']:,.0f} tok/CPU-s)",
                    (x, row["loss"]),
                    textcoords="offset points", xytext=(6, 4), fontsize=8)
    ax.set_xscale("log")
    ax.margins(x=0.3, y=0.2)
    ax.set_xlabel("gzipped size (KB, log scale)")
    ax.set_ylabel("validation loss (nats per token)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    return plots.save_png(fig, path)


def write_lm_report(directory, logdir, rows, summary, title="Language-model variants",
                    name="report"):
    """Writes <name>.json, <name>.md, <name>.png (loss vs gzipped size) and
    <name>_tokens_per_sec.png to `directory`, and the table (text `<name>/table`), both
    plots and per-variant scalars (loss, tokens/s) to TensorBoard in `logdir`.

    Returns:
      {'json', 'markdown', 'png', 'speed_png': paths, 'logdir': logdir}.
    """
    os.makedirs(directory, exist_ok=True)
    paths = {"json": os.path.join(directory, f"{name}.json"),
             "markdown": os.path.join(directory, f"{name}.md"),
             "png": os.path.join(directory, f"{name}.png"),
             "speed_png": os.path.join(directory, f"{name}_tokens_per_sec.png"), "logdir": logdir}
    measured = [r for r in rows if "loss" in r]
    markdown = markdown_lm_report(rows, summary, title)
    plot_loss_vs_size(rows, paths["png"], title)
    plots.plot_rates([f"{r['variant']} ({r['decode']})" for r in measured],
                     [r["tokens_per_cpu_sec"] for r in measured], paths["speed_png"],
                     "greedy generation, tokens per second of process CPU time",
                     f"{title}: generation cost")
    write_json(paths["json"], {**summary, "variants": rows})
    write_text(paths["markdown"], markdown)
    summaries.write_text(logdir, f"{name}/table", markdown)
    summaries.write_png(logdir, f"{name}/loss_vs_size", paths["png"])
    summaries.write_png(logdir, f"{name}/tokens_per_sec", paths["speed_png"])
    summaries.write_scalars(logdir, {
        **{f"loss/{r['variant']}": r["loss"] for r in measured},
        **{f"tokens_per_sec/{r['variant']}": r["tokens_per_sec"] for r in measured},
        **{f"tokens_per_cpu_sec/{r['variant']}": r["tokens_per_cpu_sec"] for r in measured}})
    return paths

