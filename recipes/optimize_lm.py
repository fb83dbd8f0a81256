"""Make a trained language model small and show what it costs: loss, size, tokens/s.

    python recipes/optimize_lm.py --model_dir=runs/lm-text-gpt
    python recipes/optimize_lm.py --model_dir=runs/lm-gpt2-tiny \\
        --variants=float,keras3_int8,keras3_int4,tflite_dynamic,pruned_50,pruned_50_int8 \\
        --finetune_steps=200
    tensorboard --logdir runs/lm-text-gpt/optimize/logs --host localhost

Loads model.keras and vocabulary.json from --model_dir (what recipes/train_lm.py writes:
tfaccel's GPT, or a KerasHub causal LM, KerasHub imported to load it), cuts the same text
into the same training and validation tokens as train_lm.py did (its --data_dir from the
run's flags.cfg, its tokenizer from the vocabulary, its window from metrics.json), then
builds each of --variants (tfaccel.compress.lm_variants: float, keras3_int8, keras3_int4,
tflite_float, tflite_dynamic, int8, pruned_<NN>, pruned_<NN>_<base>) and measures, in one
run, each one's validation loss (nats per character for the char tokenizer) and
perplexity, its size as stored (raw and gzip), and greedy generation of --new_tokens
tokens after --prompt (tokens/s on its fastest path, and with the whole window per token
for every variant; all timed interleaved). A variant this model cannot have (Keras 3's
quantize on a tf_keras model) is a row with the reason.

Writes to --output_dir (default <model_dir>/optimize): report.md, report.json, report.png
(loss vs gzipped size), report_tokens_per_sec.png, tflite/ (the .tflite variants), and
TensorBoard logs (logs/report: the table as text, both plots, per-variant scalars). It
works in <output_dir>/.partial and moves the outputs up only when the run is complete.
"""

import os
import time

import common
from absl import flags

from tfaccel.compress import lm_variants

FLAGS = flags.FLAGS
flags.DEFINE_string("model_dir", "runs/lm-text-gpt", "A folder recipes/train_lm.py wrote "
                    "(model.keras, vocabulary.json, metrics.json, flags.cfg).")
flags.DEFINE_string("output_dir", None, "Where the report goes (default: <model_dir>/optimize).")
flags.DEFINE_list("variants", list(lm_variants.DEFAULT_LM_VARIANTS),
                  f"Variants to build and compare: {', '.join(lm_variants.BASES)}, pruned_<NN> "
                  "or pruned_<NN>_<base> (float is always measured: the baseline).")


def _check_variants(names):
    try:
        lm_variants.parse_lm_variants(names)
    except common.ConfigError as e:
        raise common.ConfigError(f"--variants={','.join(names)}: {e}") from None


common.check_flag("variants", _check_variants)
flags.DEFINE_string("data_dir", None, "The text the model was trained on (default: the run's "
                    "--data_dir in its flags.cfg, else the default corpus).")
flags.DEFINE_integer("finetune_steps", 200, "pruned_*: training steps while pruning (the "
                     "sparsity ramps over the first two thirds).", lower_bound=1)
flags.DEFINE_float("finetune_learning_rate", 3e-4, "pruned_*: AdamW learning rate.")
flags.DEFINE_integer("batch_size", 12, "pruned_*: windows per fine-tune step.", lower_bound=1)
flags.DEFINE_string("prompt", "The ", "Text every variant's greedy generation starts from.")
flags.DEFINE_integer("new_tokens", 100, "Tokens per timed generation.", lower_bound=1)
flags.DEFINE_integer("timing_rounds", 3, "Timed generations per variant (interleaved).",
                     lower_bound=1)
flags.DEFINE_integer("max_windows", 0, "Validation windows the loss is measured on (0: all).",
                     lower_bound=0)
flags.DEFINE_integer("seed", 0, "Seed of the fine-tune's window order.")


def _output_dir():
    return FLAGS.output_dir or os.path.join(FLAGS.model_dir, "optimize")


def _check_output_dir():
    """--output_dir must be writable: checked before TensorFlow is imported."""
    from tfaccel.io import check_writable_dir

    check_writable_dir(_output_dir(), "--output_dir")


def _run_settings(model_dir):
    """(data_dir, sequence_length, train_lm's validation loss) the run in `model_dir` used:
    from its flags.cfg and metrics.json (None where a file does not say)."""
    import json

    data_dir = length = loss = None
    path = os.path.join(model_dir, "flags.cfg")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            data_dir = next((line.strip().partition("=")[2] for line in f
                             if line.startswith("--data_dir=")), None) or None
    path = os.path.join(model_dir, "metrics.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            metrics = json.load(f)
        length, loss = metrics.get("sequence_length"), metrics.get("validation_loss")
    return data_dir, length, loss


def main(argv):
    common.reject_extra_args(argv)
    from tfaccel import io
    from tfaccel.compress import lm_report, report
    from tfaccel.data import text
    from tfaccel.keras import flavour_of
    from tfaccel.train import generate, language_model

    # --- Inputs: the model, its text cut as train_lm.py cut it; all checked before writing.
    variants = [v.name for v in lm_variants.parse_lm_variants(FLAGS.variants)]
    model, vocab = lm_report.load_causal_lm(FLAGS.model_dir)
    run_data_dir, length, train_lm_loss = _run_settings(FLAGS.model_dir)
    data_dir = FLAGS.data_dir or run_data_dir
    length = int(length or generate.model_context(model))
    splits = text.load_text_dataset(data_dir, vocab.kind, sequence_length=length)
    if splits.vocab.to_json() != vocab.to_json():
        raise common.ConfigError(f"{splits.source} gives another {vocab.kind} vocabulary than "
                                 f"the model's ({splits.vocab.size} vs {vocab.size} tokens): "
                                 "pass --data_dir=<the text the model was trained on>")
    prompt_ids = vocab.encode(FLAGS.prompt)  # a prompt the vocabulary cannot spell: one line
    final_dir = _output_dir()
    work_dir = os.path.join(final_dir, ".partial")
    report.discard(work_dir)  # a stale one from a killed run
    start = time.perf_counter()

    # --- Build and measure every variant, then the report.
    rows = lm_report.measure_lm_variants(
        model, splits.train, splits.validation, length, variants,
        directory=os.path.join(work_dir, "tflite"), unit=language_model.UNITS[vocab.kind],
        finetune_steps=FLAGS.finetune_steps, batch_size=FLAGS.batch_size,
        learning_rate=FLAGS.finetune_learning_rate, prompt_ids=prompt_ids,
        new_tokens=FLAGS.new_tokens, timing_rounds=FLAGS.timing_rounds,
        max_windows=FLAGS.max_windows or None, seed=FLAGS.seed)
    for row in rows:
        if "path" in row:  # where the file will be once published
            row["path"] = os.path.join(final_dir, os.path.relpath(row["path"], work_dir))
    summary = {"model_dir": FLAGS.model_dir, "model": type(model).__name__,
               "keras": flavour_of(model), "source": splits.source,
               "tokenizer": vocab.kind, "sequence_length": length,
               "parameters": int(model.count_params()),
               "validation_windows": FLAGS.max_windows or "all",
               "train_lm_validation_loss": train_lm_loss, "finetune_steps": FLAGS.finetune_steps,
               "prompt": FLAGS.prompt, "new_tokens": FLAGS.new_tokens,
               "timing_rounds": FLAGS.timing_rounds, "cpu_count": os.cpu_count(),
               "seconds": time.perf_counter() - start, "command": common.command_line()}
    paths = lm_report.write_lm_report(work_dir, os.path.join(work_dir, "logs", "report"), rows,
                                      summary, title=f"Compressing {summary['model']} "
                                      f"({os.path.basename(os.path.normpath(FLAGS.model_dir))})")
    io.write_text(os.path.join(work_dir, "flags.cfg"), FLAGS.flags_into_string())
    report.publish(work_dir, final_dir, last=[os.path.basename(p) for k, p in paths.items()
                                              if k != "logdir"])
    with open(os.path.join(final_dir, "report.md"), encoding="utf-8") as f:
        print("\n" + f.read())
    print(f"wrote {final_dir}: report.md, report.json, report.png, report_tokens_per_sec.png, "
          "tflite/, logs/")


if __name__ == "__main__":
    common.flagkit.run(main, preflight=_check_output_dir)
