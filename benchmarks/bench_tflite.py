"""The optimize recipe's claims, measured: accuracy, gzip size and latency of each TFLite variant.

    python benchmarks/bench_tflite.py                         # runs the preset, then checks
    python benchmarks/bench_tflite.py --report=runs/optimize-digits-cnn/report.json

Runs `recipes/optimize.py --flagfile=recipes/presets/optimize_digits_cnn.cfg`
(unless --report names an existing report), timing it end to end and noting the
machine's load (other jobs share these cores), then re-measures single-sample
latency of the float, int8, qat_int8 and pruned_qat_int8 files with more
interleaved rounds than the recipe (so that load falls on all of them alike)
and prints each target of the quantization issue with the measured value:

- QAT int8 TFLite accuracy >= float Keras accuracy - 0.5 point;
- full-int8 PTQ within 2 points of float Keras;
- pruned + QAT int8 >= 12x smaller gzipped than float TFLite, within 1.0 point;
- int8 single-sample latency below float's (p50, ratio printed);
- TFLite predictions agree with the Keras QAT model on >= 99% of the test set;
- the recipe ran in under 10 minutes.

Writes bench_tflite.json (the checks, the latencies, the recipe's timing),
bench_tflite.png (the re-measured p50 latencies) and both as TensorBoard text and
image to --output_dir.
"""

import json
import os
import resource
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import _cli  # noqa: E402
from absl import flags  # noqa: E402

ROOT = _cli.ROOT
FLAGS = flags.FLAGS
flags.DEFINE_string("report", None,
                    "An existing report.json to check instead of running the recipe.")
flags.DEFINE_string("flagfile_preset", os.path.join(ROOT, "recipes", "presets",
                                                    "optimize_digits_cnn.cfg"), "Preset to run.")
flags.DEFINE_string("model_dir", None, "Where the recipe writes (default: the preset's).")
flags.DEFINE_integer("latency_runs", 3000, "Timed runs per file in the re-measurement.")
flags.DEFINE_integer("rounds", 15, "Interleaved rounds of the re-measurement.")
_cli.define_output_dir("runs/bench_tflite", "Where bench_tflite.json, the chart and TensorBoard "
                       "logs go.")


def run_recipe():
    from tfaccel import monitor

    command = [sys.executable, os.path.join(ROOT, "recipes", "optimize.py"),
               f"--flagfile={FLAGS.flagfile_preset}"]
    if FLAGS.model_dir:
        command.append(f"--model_dir={FLAGS.model_dir}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get(
        "PYTHONPATH")])))
    load_before, clock = os.getloadavg()[0], monitor.StepClock()
    clock.start()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                            check=False)
    clock.stop()
    seconds = clock.times().total
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode:
        sys.exit(f"recipe failed ({result.returncode}):\n{result.stderr[-3000:]}")
    report_line = next(line for line in result.stdout.splitlines() if line.startswith("wrote "))
    model_dir = report_line.split()[1].rstrip(":")
    return os.path.join(ROOT, model_dir) if not os.path.isabs(model_dir) else model_dir, {
        "recipe_wall_seconds": seconds, "recipe_cpu_seconds": usage.ru_utime + usage.ru_stime,
        "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
        "cpu_count": os.cpu_count(), "command": " ".join(command)}


def main(argv):
    del argv
    from tfaccel import doctor, plots
    from tfaccel.compress import tflite_eval

    timing = {}
    if FLAGS.report:
        report_path = FLAGS.report
    else:
        model_dir, timing = run_recipe()
        report_path = os.path.join(model_dir, "report.json")
    with open(report_path) as f:
        report = json.load(f)
    rows = {row["variant"]: row for row in report["variants"]}
    timed = {v: rows[v]["path"] for v in ("float", "int8", "qat_int8", "pruned_qat_int8")
             if v in rows}
    latency = tflite_eval.compare_latency(timed, num_runs=FLAGS.latency_runs,
                                          rounds=FLAGS.rounds)
    float_keras = report["float_keras_accuracy"]
    checks = []

    def check(name, value, target, ok):
        checks.append({"target": name, "measured": value, "required": target, "pass": bool(ok)})

    if "qat_int8" in rows:
        acc = rows["qat_int8"]["accuracy"]
        check("QAT int8 accuracy vs float Keras (points)", 100 * (acc - float_keras), ">= -0.5",
              100 * (acc - float_keras) >= -0.5)
        check("QAT int8 TFLite agreement with Keras QAT", rows["qat_int8"]["agreement_with_source"],
              ">= 0.99", rows["qat_int8"]["agreement_with_source"] >= 0.99)
    if "int8" in rows:
        delta = 100 * (rows["int8"]["accuracy"] - float_keras)
        check("full-int8 PTQ accuracy vs float Keras (points)", delta, ">= -2", delta >= -2)
        ratio = latency["float"]["p50_us"] / latency["int8"]["p50_us"]
        check("int8 latency speed-up over float (p50, re-measured)", ratio, "> 1", ratio > 1)
    if "pruned_qat_int8" in rows:
        row = rows["pruned_qat_int8"]
        delta = 100 * (row["accuracy"] - float_keras)
        check("pruned+QAT int8 gzip ratio vs float TFLite", row["gzip_ratio"], ">= 12",
              row["gzip_ratio"] >= 12)
        check("pruned+QAT int8 accuracy vs float Keras (points)", delta, ">= -1.0", delta >= -1.0)
        check("pruned+QAT int8 TFLite agreement with its Keras QAT model",
              row["agreement_with_source"], ">= 0.99", row["agreement_with_source"] >= 0.99)
    if timing:
        minutes = timing["recipe_wall_seconds"] / 60
        check("recipe wall time (minutes)", minutes, "< 10", minutes < 10)

    lines = [f"report: {report_path}", f"machine: {doctor.machine_summary()}"]
    if timing:
        lines.append(f"recipe: {timing['recipe_wall_seconds']:.0f} s wall, "
                     f"{timing['recipe_cpu_seconds']:.0f} s CPU; load average "
                     f"{timing['load_average_before']:.1f} -> {timing['load_average_after']:.1f} "
                     f"on {timing['cpu_count']} cores")
    lines.append("latency re-measured (us, p50 / mean): " + ", ".join(
        f"{v} {s['p50_us']:.1f} / {s['mean_us']:.1f}" for v, s in latency.items()))
    width = max(len(c["target"]) for c in checks)
    for c in checks:
        value = f"{c['measured']:.4g}" if isinstance(c["measured"], float) else c["measured"]
        lines.append(f"{'PASS' if c['pass'] else 'FAIL'}  {c['target']:<{width}}  {value:>8}  "
                     f"(required {c['required']})")
    text = "\n".join(lines)
    print(f"\n{text}")
    png = plots.plot_rates(list(latency), [s["p50_us"] for s in latency.values()],
                           os.path.join(FLAGS.output_dir, "bench_tflite.png"),
                           "single-sample latency, p50 (microseconds)",
                           f"TFLite variants of {report_path}")
    _cli.write_outputs("bench_tflite", {"machine": doctor.machine_summary(), "checks": checks,
                                        "latency": latency, "timing": timing,
                                        "report": report_path},
                       text.replace("\n", "\n\n"), png)


if __name__ == "__main__":
    _cli.run(main)
