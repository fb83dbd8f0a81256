"""Single-sample inference latency, measured alike for every runtime: TFLite files, Keras models.

`compare_latencies` takes the models and a function that prepares, for one
model, a call running one batch (one `.tflite` invocation, one call of a
compiled Keras model); it warms each up, then times them interleaved: each
runs `num_runs / rounds` timed calls per round, in turn, so that load from
other processes on a shared machine falls on all of them alike and their
ratios are fair even when the absolute times are noisy. Each call is timed by
`tfaccel.monitor.time_steps`; `latency_stats` gives the fields of every
latency table here (mean, p50, p90 in microseconds, number of runs).
`tflite_eval.compare_latency` and `keras3_quantize.compare_keras_latency` are
this harness around their runtime.

Example:

    from tfaccel.compress import latency

    def one_call(model):  # one batch of `model`, traced once
        x = tf.zeros((1, *model.input_shape[1:]))
        return tf.function(lambda: model(x, training=False))

    stats = latency.compare_latencies({"float": model, "int8": small}, one_call)
    stats["float"]["p50_us"] / stats["int8"]["p50_us"]   # speed-up of int8
"""

from tfaccel import monitor
from tfaccel.errors import ConfigError


def latency_stats(times):
    """{'mean_us', 'p50_us', 'p90_us', 'num_runs'} of a `monitor.StepTimes`."""
    return {"mean_us": 1e6 * times.mean, "p50_us": 1e6 * times.percentile(50),
            "p90_us": 1e6 * times.percentile(90), "num_runs": len(times.seconds)}


def compare_latencies(models, one_call, num_runs=200, warmup=20, rounds=5):
    """Latencies of several models' single-batch calls after warm-up, in interleaved rounds.

    Args:
      models: {name: model}.
      one_call: `fn(model) -> fn()` running one batch of `model` (called once per
        model, after the arguments are checked).
      num_runs: timed calls per function in total (each round runs
        `max(1, num_runs // rounds)` of them).
      warmup: untimed calls per function first, all before the first round.
      rounds: how many interleaved rounds `num_runs` is split into.

    Returns:
      {name: `latency_stats` of its timed calls}.

    Raises:
      ConfigError: `num_runs` < 1, `warmup` < 0 or `rounds` < 1.
    """
    if num_runs < 1 or warmup < 0 or rounds < 1:
        raise ConfigError(f"num_runs={num_runs}, warmup={warmup}, rounds={rounds}: need "
                          "num_runs >= 1, warmup >= 0, rounds >= 1")
    runs = {name: one_call(model) for name, model in models.items()}
    for run in runs.values():
        monitor.time_steps(run, steps=0, warmup=warmup)
    per_round = max(1, num_runs // rounds)
    seconds = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            seconds[name] += monitor.time_steps(run, per_round).seconds
    return {name: latency_stats(monitor.StepTimes(tuple(s))) for name, s in seconds.items()}
