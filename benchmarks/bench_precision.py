"""Training speed of float32, mixed_float16, mixed_bfloat16, each with XLA off and on, in one run.

    python benchmarks/bench_precision.py                                  # digits CNN
    python benchmarks/bench_precision.py --dataset=synthetic --synthetic_shape=224,224,3 \\
        --model=resnet --batch_size=128                                   # on your GPU

For each setting it builds the model under the policy (float32 outputs, loss
scaling for float16), trains `--warmup` untimed steps and `--steps` timed
steps, `--repeats` times, and keeps the best median step time. It prints
steps/s and examples/s with ratios to float32 without XLA, and writes
results.json, a bar chart and TensorBoard logs to --output_dir. Use the
ratios to choose --precision and --jit_compile for recipes/train.py (or let
--precision=auto --jit_compile=auto measure them on every run).
"""

import os

import _cli
import common
from absl import flags

FLAGS = flags.FLAGS
common.define_data_flags()
common.define_model_flags()
flags.DEFINE_integer("batch_size", 64, "Global batch size.", lower_bound=1)
flags.DEFINE_integer("seed", 0, "Seed of initialization and synthetic data.")
flags.DEFINE_list("precisions", ["float32", "mixed_float16", "mixed_bfloat16"], "Policies to time.")
flags.DEFINE_list("jit_compile", ["false", "true"], "XLA settings to time.")
flags.DEFINE_integer("warmup", 5, "Untimed steps per setting (tracing, XLA compilation).",
                     lower_bound=1)
flags.DEFINE_integer("steps", 30, "Timed steps per setting.", lower_bound=1)
flags.DEFINE_integer("repeats", 3, "Timings per setting; the best counts.", lower_bound=1)
_cli.define_output_dir("runs/bench_precision", "Where results.json, the chart and TensorBoard "
                       "logs go.")


def main(argv):
    del argv  # stray arguments were rejected with the flags
    from tfaccel import data, doctor, io, monitor
    from tfaccel.errors import ConfigError
    from tfaccel.keras import keras
    from tfaccel.performance import memory
    from tfaccel.train import precision, training

    policies = [precision.check_precision(p) for p in FLAGS.precisions]
    jits = [precision.parse_jit_compile(j) for j in FLAGS.jit_compile]
    if "auto" in jits:
        raise ConfigError("--jit_compile lists the settings to time: true and/or false, not auto")
    splits = common.load_data()
    train = data.batch_dataset(splits.train.repeat().take(FLAGS.batch_size * 64).cache(),
                               FLAGS.batch_size, training=True, drop_remainder=True)
    for policy in policies:
        for line in precision.precision_advice(policy):
            print(f"note: {line}")

    rows = []
    for policy in policies:
        for jit in jits:
            best = None
            for _ in range(FLAGS.repeats):
                with precision.precision_scope(policy):
                    keras.utils.set_random_seed(0)
                    model = precision.apply_precision(common.load_model(splits.info), policy)
                    optimizer = precision.wrap_optimizer(keras.optimizers.Adam(1e-3), policy)
                    training.compile_classifier(model, optimizer, jit_compile=jit)
                    timing = monitor.time_training(model, train, FLAGS.batch_size,
                                                   FLAGS.warmup, FLAGS.steps)
                del model
                memory.free_memory()
                if best is None or timing["seconds_per_step"] < best["seconds_per_step"]:
                    best = timing
            rows.append({"precision": policy, "jit_compile": jit,
                         "ms_per_step": 1000 * best["seconds_per_step"],
                         "steps_per_sec": best["steps_per_sec"],
                         "examples_per_sec": best["examples_per_sec"]})
            print(f"{policy:15s} jit_compile={str(jit):5s} {rows[-1]['ms_per_step']:8.2f} ms/step "
                  f"{rows[-1]['examples_per_sec']:10.0f} examples/s", flush=True)

    base = next((r for r in rows if r["precision"] == "float32" and not r["jit_compile"]), rows[0])
    for row in rows:
        row["vs_float32"] = row["examples_per_sec"] / base["examples_per_sec"]
    label = f"{common.model_label()} on {FLAGS.dataset}, batch {FLAGS.batch_size}"
    title = (f"{label}: examples/s (vs {base['precision']} jit={base['jit_compile']}); "
             f"{doctor.machine_summary()}")
    table = monitor.write_trial_report(os.path.join(FLAGS.output_dir, "logs"), "bench/precision",
                                       rows, ["precision", "jit_compile"], "examples_per_sec",
                                       path=os.path.join(FLAGS.output_dir, "precision.png"),
                                       title=title)
    io.write_json(os.path.join(FLAGS.output_dir, "results.json"),
                  {"model": common.model_label(), "dataset": FLAGS.dataset,
                   "machine": doctor.machine_summary(),
                   "batch_size": FLAGS.batch_size, "warmup": FLAGS.warmup, "steps": FLAGS.steps,
                   "repeats": FLAGS.repeats, "rows": rows})
    print(f"\n{title}\n{table}")
    print(f"\nwrote {FLAGS.output_dir}: results.json, precision.png, logs/ "
          f"(tensorboard --logdir {os.path.join(FLAGS.output_dir, 'logs')})")


if __name__ == "__main__":
    _cli.run(main)
