"""What the recipes share for compiling and fitting: the optimizer, accumulation, callbacks.

Re-exported by recipes/common.py (a recipe calls `common.compile_from_flags`). Each
function serves models of either Keras (`tfaccel.keras.flavour_of`).
"""

import collections
import os

from flagkit import FLAGS


def compile_from_flags(model, learning_rate, policy="float32", jit_compile=False,
                       accum_steps=1, compile_fn=None):
    """Compiles `model` (`compile_fn`, default `training.compile_classifier`) with --optimizer
    (and --adam_beta2/--clip_norm/--weight_decay/--ema if defined) at `learning_rate`:
    loss scaling for mixed_float16, XLA, accumulation over `accum_steps`. In strategy scope."""
    from tfaccel.keras import flavour_of
    from tfaccel.performance import accumulate
    from tfaccel.train import precision, training

    tuned = ({"weight_decay": FLAGS.weight_decay, "beta_2": FLAGS.adam_beta2, "clip_norm":
              FLAGS.clip_norm, "ema_momentum": FLAGS.ema} if "clip_norm" in FLAGS else {})
    in_optimizer = _keras3_optimizer_accumulates(model)  # see fit_batch_size
    optimizer = training.make_optimizer(FLAGS.optimizer, learning_rate, **tuned,
                                        flavour=flavour_of(model),
                                        accumulation_steps=accum_steps if in_optimizer else None)
    (compile_fn or training.compile_classifier)(
        model, precision.wrap_optimizer(optimizer, policy), jit_compile=jit_compile)
    if accum_steps == 1 or in_optimizer:
        return model
    return accumulate.enable_gradient_accumulation(model, accum_steps)


def _keras3_optimizer_accumulates(model):
    """True when `model` accumulates in Keras 3's optimizer (`gradient_accumulation_steps`):
    a Keras 3 model on one replica. Under a `tf.distribute` strategy of several, Keras 3.15's
    accumulation fails (an all-reduce inside a `cond`), and tfaccel's micro-batches serve."""
    from tfaccel.keras import flavour_of

    return (flavour_of(model) == "keras3"
            and model.distribute_strategy.num_replicas_in_sync == 1)


def fit_batch_size(model, batch_size, accum_steps):
    """The batch `fit` is given for an update of `batch_size` examples over `accum_steps`.

    A model accumulating with tfaccel splits each batch itself
    (`tfaccel.performance.accumulate`); one accumulating in Keras 3's optimizer
    applies the mean gradient of `accum_steps` batches (`gradient_accumulation_steps`),
    so it is given batches of `batch_size / accum_steps`, `accum_steps` steps an update.
    """
    return batch_size // accum_steps if _keras3_optimizer_accumulates(model) else batch_size


FitCallbacks = collections.namedtuple("FitCallbacks", "callbacks backup throughput")


def memory_plan(model, batch_size, policy, replicas, grad_accum_steps=None):
    """The memory plan (`tfaccel.performance.plan`) of `model` trained with this run's flags,
    `batch_size` examples per device; the device is --device_memory or the default one."""
    from tfaccel.performance import plan

    memory = FLAGS.device_memory or plan.default_device_memory()[0]
    return plan.plan_memory(model, plan.PlanSettings(
        batch_size=batch_size, precision=policy, optimizer=FLAGS.optimizer,
        grad_accum_steps=grad_accum_steps or FLAGS.grad_accum_steps, replicas=replicas,
        device_memory=memory))


def auto_precision(model, dataset, strategy, precision_name, policy, jit_compile, compile_fn,
                   learning_rate, steps_per_epoch, replicas):
    """--precision=auto / --jit_compile=auto: timed trials of `model` on `dataset` (within
    --auto_budget_seconds), printed; (model under the chosen policy, policy, jit_compile,
    the trials' `AutoChoice`), or what was given (and None) when neither flag is 'auto'.

    `compile_fn(model, learning_rate, policy, jit_compile, grad_accum_steps)` compiles as the
    recipe does."""
    if "auto" not in (precision_name, jit_compile):
        return model, policy, jit_compile, None
    from tfaccel import summaries
    from tfaccel.performance import trials
    from tfaccel.train import precision

    candidates = precision.auto_candidates() if precision_name == "auto" else (policy,)
    if precision_name == "auto":
        for name in precision.PRECISIONS:
            if name not in candidates:
                print(f"precision trials skip {name}: {precision.precision_advice(name)[0]}")
    with strategy.scope():
        choice = trials.auto_select(
            model, dataset, FLAGS.batch_size, precisions=candidates,
            jit_options=(False, True) if jit_compile == "auto" else (jit_compile,),
            compile_fn=lambda m, p, j: compile_fn(m, learning_rate, p, j,
                                                  FLAGS.grad_accum_steps),
            budget_seconds=FLAGS.auto_budget_seconds or "default",
            steps_per_epoch=steps_per_epoch, batch_multiple=replicas * FLAGS.grad_accum_steps)
    policy, jit_compile = choice.precision, choice.jit_compile
    print(f"precision/XLA trials:\n{summaries.markdown_table(list(choice.table))}\n"
          f"auto chose precision {policy}, jit_compile {jit_compile} (trials "
          f"{choice.seconds:.1f} s of a {choice.budget_seconds:.0f} s budget)")
    precision.set_precision(policy)
    with strategy.scope():
        model = precision.apply_precision(model, policy)
    return model, policy, jit_compile, choice


def model_flops(model, policy, sequence_length=None, printer=print):
    """(training FLOPs per example of `model`'s traced step, the `doctor.Peak` of `policy`) for
    the throughput logger's MFU; (None, peak) with a line saying why when the step cannot be
    traced (MFU is a report: it never stops a run)."""
    from tfaccel import doctor
    from tfaccel.errors import TfaccelError
    from tfaccel.performance import utilization

    peak = doctor.peak(policy, measure=True)
    try:
        flops = utilization.training_flops_per_example(model, sequence_length=sequence_length)
    except TfaccelError as e:
        printer(f"utilization: no MFU for this run ({e})")
        return None, peak
    return flops, peak


def utilization_metrics(throughput, flops):
    """metrics.json's utilization fields: the last epoch's MFU, the FLOPs it counts and the
    peak it divides by (and how that peak was worked out)."""
    flops_per_example, peak = flops
    last = throughput.history[-1] if throughput.history else {}
    return {"mfu": last.get("mfu"), "training_flops_per_example": flops_per_example,
            "peak_flops_per_second": peak.flops_per_second, "peak": peak.how}


def print_utilization(metrics):
    """The run's `utilization:` line (MFU and the peak it divides by), when it has one."""
    if metrics.get("mfu") is not None:
        print(f"utilization: {metrics['mfu']:.1%} MFU of {metrics['peak']}")


def fit_callbacks(model_dir, logdir, backup_dir, backup_freq, data_epoch=None, printer=print,
                  extra=(), flavour="tf_keras", batch_size=None, flops=None):
    """The train recipe's callbacks for `fit`, in the order they must run; what
    benchmarks/bench_overhead.py times against a bare `fit`.

    The NaN/Inf stop first (nothing backs up or logs a non-finite step); the backup (which
    saves the weights to `model_dir`/checkpoints/ at each backup) and the resume line before
    the others (they then see the restored state), kept after `fit` (removed once
    metrics.json is written: a kill while exporting loses nothing); `data_epoch`
    (`resume.EpochCounter`); learning rate, throughput, Keras's epoch scalars, peak memory,
    hardware load every --monitor_every_n_steps steps; `extra` (a language model's metrics and
    samples) after throughput, before TensorBoard (which writes what they add to the logs).
    Unless --backup_freq is a number of steps, none of them reads a tensor at every step.
    `flavour` is the model's Keras (the backup is that Keras's); `batch_size` the examples in
    one of `fit`'s steps (default --batch_size); `flops` what `model_flops` returns, for the
    model FLOP utilization (`epoch_mfu`) beside the throughput.

    Returns:
      `FitCallbacks(callbacks, backup, throughput)`: the list for `fit`, the backup callbacks
      (the last one's `resumed_at`) and the throughput logger (its `history`).
    """
    from tfaccel import monitor, summaries
    from tfaccel.performance import memory
    from tfaccel.train import resume, training

    train_logdir = os.path.join(logdir, "train")
    backup = resume.backup_callbacks(
        backup_dir, backup_freq, epochs=FLAGS.epochs, printer=printer, delete_after_fit=False,
        weights_path=os.path.join(model_dir, "checkpoints", "ckpt-{epoch:03d}.weights.h5"),
        flavour=flavour)
    flops_per_example, peak = flops or (None, None)
    throughput = summaries.ThroughputLogger(
        train_logdir, batch_size or FLAGS.batch_size, flops_per_example=flops_per_example,
        peak_flops=peak.flops_per_second if peak else None)
    callbacks = [training.StopOnNonFiniteLoss(), *backup,
                 *([data_epoch] if data_epoch is not None else []),
                 summaries.LearningRateLogger(train_logdir, every_n_steps=10), throughput,
                 *extra,
                 summaries.TensorBoard(logdir, update_freq="epoch"),  # no learning_rate copy
                 memory.PeakMemoryLogger(train_logdir)]
    if FLAGS.monitor_every_n_steps:
        callbacks.append(monitor.HardwareMonitor(train_logdir, FLAGS.monitor_every_n_steps))
    return FitCallbacks(callbacks, backup, throughput)
