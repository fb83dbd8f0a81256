"""Pruning the digits CNN to 80%: accuracy, measured sparsity and gzipped size vs unpruned,
over seeds.

    python benchmarks/bench_prune.py                       # seeds 0,1,2, the recipe's defaults
    python benchmarks/bench_prune.py --seeds=0,1,2,3,4 --output_dir=runs/bench_prune

Runs `recipes/prune.py` once per seed (each run trains its own unpruned
baseline, for the recipe's 30 epochs unless --epochs, then prunes it with the
recipe's 20 epochs of fine-tuning unless --prune_epochs), so the unpruned and
the pruned model of a row come from the same run and are scored on the same
360 test images. The targets are for the recipe's defaults; fewer epochs make
a quick check that the benchmark runs. Sizes are of .h5 files saved without
optimizer state, raw and gzip -9, and of the TFLite conversions.

Prints one row per seed and the worst case against the targets: accuracy
within 1.0 point of the unpruned model, sparsity of the pruned layers within 1
point of 80%, gzipped stripped model <= 0.35x the gzipped unpruned model.
Writes bench_prune.json and bench_prune.md to --output_dir.
"""

import json
import os
import subprocess
import sys

import _cli
from absl import flags

ROOT = _cli.ROOT

flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds, one recipe run each.")
flags.DEFINE_float("sparsity", 0.8, "Target sparsity.")
flags.DEFINE_integer("epochs", None, "Baseline epochs (default: the recipe's).", lower_bound=1)
flags.DEFINE_integer("prune_epochs", None, "Fine-tuning epochs while pruning (default: the "
                     "recipe's).", lower_bound=1)
_cli.define_output_dir("runs/bench_prune", "Where the runs and the summary go.")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    from tfaccel import io, summaries

    rows = []
    for seed in FLAGS.seeds:
        model_dir = os.path.join(FLAGS.output_dir, f"seed{seed}")
        cmd = [sys.executable, os.path.join(ROOT, "recipes", "prune.py"), f"--seed={seed}",
               f"--sparsity={FLAGS.sparsity}", f"--model_dir={model_dir}", "--retrain_baseline",
               *[f"--{name}={FLAGS[name].value}" for name in ("epochs", "prune_epochs")
                 if FLAGS[name].value is not None]]
        print("running:", " ".join(cmd), flush=True)
        env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="3")
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode:
            sys.exit(f"seed {seed} failed:\n{done.stderr[-3000:]}")
        with open(os.path.join(model_dir, "report.json")) as f:
            r = json.load(f)
        sizes = {row["file"]: row for row in r["size_table"]}
        rows.append({
            "seed": int(seed),
            "unpruned_acc": r["baseline_test_accuracy"], "pruned_acc": r["pruned_test_accuracy"],
            "acc_change_points": r["accuracy_change_points"],
            "sparsity_pruned_layers": r["sparsity"]["pruned"]["sparsity"],
            "h5_gzip_unpruned": sizes["h5"]["baseline_gzip"],
            "h5_gzip_pruned": sizes["h5"]["pruned_gzip"],
            "h5_gzip_ratio": sizes["h5"]["gzip_ratio"],
            "tflite_sparse_bytes_ratio": sizes["tflite_sparse"]["pruned_bytes"]
            / sizes["tflite"]["baseline_bytes"],
        })
        print(summaries.markdown_table(rows[-1:]), flush=True)
    worst = {
        "acc_change_points (>= -1.0)": min(r["acc_change_points"] for r in rows),
        "sparsity error points (<= 1.0)": max(abs(r["sparsity_pruned_layers"] - FLAGS.sparsity)
                                              for r in rows) * 100,
        "h5_gzip_ratio (<= 0.35)": max(r["h5_gzip_ratio"] for r in rows),
    }
    ok = (worst["acc_change_points (>= -1.0)"] >= -1.0
          and worst["sparsity error points (<= 1.0)"] <= 1.0
          and worst["h5_gzip_ratio (<= 0.35)"] <= 0.35)
    text = (f"{summaries.markdown_table(rows)}\n\nworst case over {len(rows)} seeds:\n\n"
            f"{summaries.markdown_table(worst)}\n\ntargets met: {ok}\n")
    print("\n" + text)
    io.write_json(os.path.join(FLAGS.output_dir, "bench_prune.json"),
                  {"rows": rows, "worst": worst, "targets_met": ok})
    io.write_text(os.path.join(FLAGS.output_dir, "bench_prune.md"), text)


if __name__ == "__main__":
    _cli.run(main)
