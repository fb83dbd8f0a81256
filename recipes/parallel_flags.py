"""--parallel=model|pipeline for the recipes: the flags, their checks, and the staged model.

The stages run in one process on its devices (the visible GPUs, or --cpu_devices logical
CPUs), so a split run uses TensorFlow's default strategy; the combinations that would
need more (pipeline inside a data-parallel strategy, per-step accumulation on top of the
micro-batches, XLA compiling the whole step for one device, timed trials) are refused
while the flags are parsed (an absl validator), each with one line, before TensorFlow loads.
"""

from absl import flags
from flagkit import DISTRIBUTION, FLAGS, check_flags

from tfaccel.choices import PARALLEL_MODES, STAGE_BALANCES
from tfaccel.errors import ConfigError


def define_parallel_flags(recompute=True):
    """--parallel, --stages, --stage_boundaries, --stage_balance, --micro_batches (and
    --recompute when `recompute`: a recipe that has its own leaves it out)."""
    flags.DEFINE_enum("parallel", "none", PARALLEL_MODES, "none; model: the model's layers split "
                      "into --stages consecutive stages, one per device (GPUs, or --cpu_devices "
                      "logical CPUs); pipeline: the same stages fed --micro_batches per step "
                      "(GPipe), gradients summed and applied once.", module_name=DISTRIBUTION)
    flags.DEFINE_integer("stages", None, "--parallel: number of stages, balanced by "
                         "--stage_balance (default: one per device).", lower_bound=1,
                         module_name=DISTRIBUTION)
    flags.DEFINE_list("stage_boundaries", [], "--parallel: layer names, in order, each the "
                      "first layer of a new stage (instead of --stages).",
                      module_name=DISTRIBUTION)
    flags.DEFINE_enum("stage_balance", "parameters", STAGE_BALANCES, "--stages: balance the "
                      "stages by 'parameters' or by the memory planner's estimate ('memory').",
                      module_name=DISTRIBUTION)
    flags.DEFINE_integer("micro_batches", 1, "--parallel=pipeline: micro-batches per step "
                         "(must divide --batch_size); the idle bubble is (K-1)/(M+K-1).",
                         lower_bound=1, module_name=DISTRIBUTION)
    if recompute:
        flags.DEFINE_bool("recompute", False, "--parallel: recompute each stage's activations "
                          "in the backward pass (tf.recompute_grad): memory for compute.",
                          module_name=DISTRIBUTION)
    check_flags(("parallel", "stages", "stage_boundaries", "micro_batches", "strategy",
                 "batch_size", "grad_accum_steps", "jit_compile", "precision"),
                _check_parallel_flags)


def _check_parallel_flags(parallel, stages, stage_boundaries, micro_batches, strategy,
                          batch_size, grad_accum_steps=1, jit_compile="false",
                          precision="float32"):
    """Raises ConfigError for a combination the split run does not support."""
    if parallel == "none":
        extra = [f"--{name}" for name, value, off in (
            ("stages", stages, None), ("stage_boundaries", stage_boundaries, []),
            ("micro_batches", micro_batches, 1)) if value != off]
        if extra:
            raise ConfigError(f"{', '.join(extra)} apply to --parallel=model|pipeline: add "
                              "--parallel=pipeline (or model), or drop them")
        return
    refused = [(strategy not in ("auto", "default"), f"--strategy={strategy}",
                "the stages use the devices one process sees: drop --strategy"),
               (grad_accum_steps > 1, f"--grad_accum_steps={grad_accum_steps}",
                "the pipeline already sums the gradients of --micro_batches: use those"),
               (jit_compile != "false" and _given("jit_compile"), f"--jit_compile={jit_compile}",
                "XLA would compile the whole step for one device: use --jit_compile=false"),
               (precision == "auto" and _given("precision"), "--precision=auto",
                "the timed trials run the unsplit model: pick the precision"),
               (batch_size == "auto", "--batch_size=auto",
                "the search runs the unsplit model: give --batch_size"),
               (parallel == "model" and micro_batches > 1, f"--micro_batches={micro_batches}",
                "--parallel=model runs whole batches: use --parallel=pipeline")]
    for bad, what, why in refused:
        if bad:
            raise ConfigError(f"{what} with --parallel={parallel} is not supported: {why}")
    if batch_size % micro_batches:
        raise ConfigError(f"--micro_batches={micro_batches} does not divide --batch_size="
                          f"{batch_size}: use a divisor of the batch (or another batch)")
    if stages and stage_boundaries and stages != len(stage_boundaries) + 1:
        raise ConfigError(f"--stage_boundaries names {len(stage_boundaries)} boundaries "
                          f"({len(stage_boundaries) + 1} stages) but --stages={stages}: give "
                          "one or the other")


def _given(name):
    """True when --name was on the command line (a recipe whose default is 'auto', such as
    train_lm.py's --precision, is not refused for a default the split run replaces)."""
    return name in FLAGS and FLAGS[name].present


def use_default_strategy():
    """Under --parallel the strategy becomes TensorFlow's default: the stages are the
    devices' use (the flags were checked when parsed); a default --precision/--jit_compile
    of 'auto' (train_lm.py's) becomes float32 without XLA, said in one line, since the
    timed trials and XLA run the unsplit model."""
    if FLAGS.parallel == "none":
        return
    FLAGS.strategy = "default"
    kept = [f"--{name}={value}" for name, value in (("precision", "float32"),
                                                    ("jit_compile", "false"))
            if name in FLAGS and FLAGS[name].value == "auto"]
    for setting in kept:
        name, value = setting[2:].split("=")
        FLAGS[name].value = value
    if kept:
        print(f"--parallel={FLAGS.parallel}: {' '.join(kept)} (the timed trials and XLA run the "
              "unsplit model; pass --precision to choose another)")


def staged_model(model, recompute=None):
    """`model` as a `PipelineModel` per the flags (devices: GPUs, else logical CPUs), or
    `model` itself without --parallel. `recompute`: per stage (default --recompute); the
    language-model recipe passes False, its --recompute recomputes each block instead."""
    if FLAGS.parallel == "none":
        return model
    from tfaccel.parallel import pipeline

    devices = pipeline.parallel_devices()
    stages = FLAGS.stages or (None if FLAGS.stage_boundaries else len(devices))
    return pipeline.pipeline_parallel(
        model, num_stages=stages, boundaries=FLAGS.stage_boundaries or None, devices=devices,
        micro_batches=FLAGS.micro_batches,
        recompute=FLAGS.recompute if recompute is None else recompute,
        balance=FLAGS.stage_balance, batch_size=FLAGS.batch_size)


def write_stage_table(staged, logdir):
    """Prints the stage table and logs it to TensorBoard (text 'parallel/stages')."""
    from tfaccel import summaries

    text = staged.plan.table()
    print(f"--parallel={FLAGS.parallel} stages:\n{text}")
    summaries.write_text(logdir, "parallel/stages", text)
    return text
