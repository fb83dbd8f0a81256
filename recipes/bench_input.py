"""Is training input-bound or compute-bound? Measure both sides and say what to change.

    python recipes/bench_input.py                                   # CNN on digits
    python recipes/bench_input.py --dataset=image_dir --data_dir=/data/flowers \\
        --image_size=160,160 --model=mobilenet_v2 --cache=none --random_flip

Measures, in examples/s (best of --repeats after --warmup batches): the input
pipeline alone (the same `tfaccel.data` pipeline the train recipe builds from
the same flags) and the train step alone (the compiled model on a few batches
held in memory). Prints the verdict ("input-bound" or "compute-bound") with
both numbers and the suggestion that follows; writes diagnosis.json, a bar
chart and the same to TensorBoard under --model_dir. It times steps, not epochs,
so it has no --epochs.
"""

import os

import common
from absl import flags

FLAGS = flags.FLAGS
common.define_data_flags()
common.define_model_flags()
common.define_train_flags(epochs=None)  # measures steps, not epochs
common.define_pipeline_flags()
common.define_host_allocator_flag()
flags.DEFINE_integer("num_batches", 20, "Timed batches (and train steps) per run.", lower_bound=1)
flags.DEFINE_integer("warmup", 3, "Untimed batches (and steps) before each run.", lower_bound=0)
flags.DEFINE_integer("repeats", 3, "Timed runs; the best counts.", lower_bound=1)


def main(argv):
    common.reject_extra_args(argv)
    common.use_host_allocator()  # as the train recipe does, so both measure the same input speed
    from tfaccel import io, summaries
    from tfaccel.keras import keras
    from tfaccel.performance import diagnose

    common.check_host_allocator()

    # --- Inputs: everything that can be wrong is checked before anything is measured.
    keras.utils.set_random_seed(FLAGS.seed)
    common.pipeline_config(FLAGS.batch_size)
    splits = common.load_data()
    model = common.load_model(splits.info)
    inputs = common.input_from_flags(splits)  # the train recipe's pipeline, one process
    common.compile_from_flags(model, FLAGS.learning_rate)
    model_dir = common.default_model_dir(prefix="bench_input-")

    # --- Measure both sides.
    print(f"measuring the input pipeline and the train step of {common.model_label()} on "
          f"{FLAGS.dataset} (batch {FLAGS.batch_size}, best of {FLAGS.repeats}) ...", flush=True)
    result = diagnose.diagnose_input(model, inputs.train, config=inputs.config,
                                     num_batches=FLAGS.num_batches, warmup=FLAGS.warmup,
                                     repeats=FLAGS.repeats)

    # --- Report.
    rows = [{"measured": "input pipeline alone",
             "best examples/s": round(result.input_examples_per_sec),
             "runs": ", ".join(f"{v:,.0f}" for v in result.input_runs)},
            {"measured": "train step alone (cached data)",
             "best examples/s": round(result.step_examples_per_sec),
             "runs": ", ".join(f"{v:,.0f}" for v in result.step_runs)}]
    table = summaries.markdown_table(rows)
    logdir = os.path.join(model_dir, "logs")
    io.write_json(os.path.join(model_dir, "diagnosis.json"),
                  {**result.as_dict(), "flags": common.flag_values(),
                   "command": common.command_line()})
    png = os.path.join(model_dir, "diagnosis.png")
    _plot(png, result)
    diagnose.write_diagnosis(logdir, result)
    summaries.write_text(logdir, "input_diagnosis/table", table + f"\n\n`{common.command_line()}`")
    summaries.write_png(logdir, "input_diagnosis/plot", png)
    print("\n" + table + "\n\n" + result.summary())
    print(f"\nwrote {model_dir}: diagnosis.json, diagnosis.png, logs/")


def _plot(path, result):
    from tfaccel import plots

    plots.plot_rates(["input pipeline alone", "train step alone"],
                     [result.input_examples_per_sec, result.step_examples_per_sec], path,
                     "examples/s (best of runs)", result.verdict,
                     colors=["#c44e52", "#4c72b0"])


if __name__ == "__main__":
    common.run(main, model_dir_prefix="bench_input-")
