"""The memory planner against measured peaks: predicted vs TensorFlow's own allocator statistics.

    python benchmarks/bench_memory.py                       # every configuration below
    python benchmarks/bench_memory.py --configs=cnn_f32,resnet_bf16

For each configuration (model, input, batch, precision, optimizer, accumulation) it
runs, in --repeats fresh processes (an allocator that has served nothing else), a
tf_keras model's training steps under TensorFlow's pooled host allocator, and reads the
allocator's peak (`tf.config.experimental.get_memory_info('CPU:0')`, reset after two
warm-up steps, then --steps steps; on a GPU machine the same reading of 'GPU:0'). The
measured peak is the largest of the repeats: the order in which TensorFlow runs
independent ops differs from run to run, and so does the peak (9.2-11.8 MB for one
digits MLP configuration in five runs, 30-41 MB for one CNN); a plan must cover the
worst of them (the smallest is in the table too). Beside it,
`tfaccel.performance.plan.plan_memory` predicts the same step from the model's layers
alone, and the table gives both and their ratio. The plan's framework margin is not
added: it is kept free on a device, not used; and its input is one batch
(`input_batches=1`), since the measured steps read one constant batch
(`Dataset.from_tensors`), not a pipeline. Writes bench_memory.json, bench_memory.png
(predicted breakdown and measured peak per configuration) and both to TensorBoard under
--output_dir. Target (issue #16): every ratio within 0.85-1.15. Exit status 1 when one
is outside.

The `gpt_*` configurations are decoder-only Transformers (`tfaccel.train.gpt`, untied,
vocabulary 104 as `pydoc_data.topics` by character) at two sizes: `tiny` (the zoo's: 4
blocks, d_model 128, 4 heads, context 64) and `8x128` (8 blocks, d_model 128, 4 heads,
context 256, where activations dominate), trained on constant token windows with the
language model's loss; `_rc` ones recompute each block (`recompute=True`). Their plan
comes from `profile_transformer` (the size, not the built layers), as `tfaccel plan
--model=gpt` makes it.
"""

import os
import sys

import _cli
from absl import flags

CONFIGS = {  # name: (model, input shape, batch, precision, optimizer, accumulation steps)
    # (for gpt_* the shape is (blocks, d_model, heads, context) and a recompute flag follows)
    "mlp_f32": ("mlp", (8, 8, 1), 1024, "float32", "adam", 1),
    "cnn_f32": ("cnn", (8, 8, 1), 512, "float32", "adam", 1),
    "cnn_bf16": ("cnn", (8, 8, 1), 512, "mixed_bfloat16", "adam", 1),
    "cnn_accum4": ("cnn", (8, 8, 1), 1024, "float32", "adam", 4),
    "cnn_sgd": ("cnn", (8, 8, 1), 256, "float32", "sgd", 1),
    "resnet_f32": ("resnet", (96, 96, 3), 32, "float32", "adam", 1),
    "resnet_bf16": ("resnet", (96, 96, 3), 32, "mixed_bfloat16", "adam", 1),
    "mobilenet_v2_f32": ("mobilenet_v2", (96, 96, 3), 32, "float32", "adam", 1),
    "mobilenet_v2_bf16": ("mobilenet_v2", (96, 96, 3), 64, "mixed_bfloat16", "momentum", 1),
    "gpt_tiny_f32_b64": ("gpt", (4, 128, 4, 64), 64, "float32", "adam", 1, False),
    "gpt_tiny_f32_b256": ("gpt", (4, 128, 4, 64), 256, "float32", "adam", 1, False),
    "gpt_tiny_f32_b256_rc": ("gpt", (4, 128, 4, 64), 256, "float32", "adam", 1, True),
    "gpt_tiny_bf16_b256": ("gpt", (4, 128, 4, 64), 256, "mixed_bfloat16", "adam", 1, False),
    "gpt_tiny_f32_b256_accum4": ("gpt", (4, 128, 4, 64), 256, "float32", "adam", 4, False),
    "gpt_8x128_f32_b16": ("gpt", (8, 128, 4, 256), 16, "float32", "adam", 1, False),
    "gpt_8x128_f32_b32": ("gpt", (8, 128, 4, 256), 32, "float32", "adam", 1, False),
    "gpt_8x128_f32_b32_rc": ("gpt", (8, 128, 4, 256), 32, "float32", "adam", 1, True),
    "gpt_8x128_bf16_b32": ("gpt", (8, 128, 4, 256), 32, "mixed_bfloat16", "adam", 1, False),
    "gpt_8x128_bf16_b32_rc": ("gpt", (8, 128, 4, 256), 32, "mixed_bfloat16", "adam", 1, True),
}
GPT_VOCABULARY = 104
LOW, HIGH = 0.85, 1.15

FLAGS = flags.FLAGS
_cli.define_fresh_process_flags(CONFIGS, list(CONFIGS), repeats=5, steps=8)
_cli.define_output_dir("runs/bench_memory", "Where bench_memory.json, the chart and TensorBoard "
                       "logs go.")


def _measure(name):
    """Builds and trains configuration `name`; returns its plan and measured peak (bytes)."""
    from tfaccel.performance import memory

    memory.use_pooled_host_allocator()
    import numpy as np
    import tensorflow as tf

    from tfaccel.performance import accumulate, memory_profile, plan
    from tfaccel.train import gpt, language_model, models, precision, training

    model_name, shape, batch, policy, optimizer, accum, *recompute = CONFIGS[name]
    recompute = bool(recompute and recompute[0])
    precision.set_precision(policy)
    opt = precision.wrap_optimizer(training.make_optimizer(optimizer, 1e-3), policy)
    rng = np.random.default_rng(0)
    if model_name == "gpt":
        layers, d_model, heads, context = shape
        model = gpt.build_gpt(gpt.GPTConfig(vocab_size=GPT_VOCABULARY, context=context,
                                            layers=layers, heads=heads, d_model=d_model),
                              recompute=recompute)
        language_model.compile_language_model(model, opt)
        x, y = (rng.integers(0, GPT_VOCABULARY, (batch, context)).astype(np.int32)
                for _ in range(2))
        profile = memory_profile.profile_transformer(layers, d_model, heads, GPT_VOCABULARY,
                                                     context, tied=False,
                                                     half=policy != "float32")
    else:
        model = precision.apply_precision(models.build_model(model_name, shape, 10), policy)
        training.compile_classifier(model, opt)
        x = rng.random((batch, *shape), dtype=np.float32)
        y = rng.integers(0, 10, batch)
        profile = memory_profile.profile_keras_model(model)
    if accum > 1:
        accumulate.enable_gradient_accumulation(model, accum)
    ds = tf.data.Dataset.from_tensors((x, y)).repeat()
    device = "GPU:0" if tf.config.list_logical_devices("GPU") else "CPU:0"
    model.fit(ds, steps_per_epoch=2, epochs=1, verbose=0)
    tf.config.experimental.reset_memory_stats(device)
    model.fit(ds, steps_per_epoch=FLAGS.steps, epochs=1, verbose=0)
    peak = tf.config.experimental.get_memory_info(device)["peak"]
    settings = plan.PlanSettings(batch_size=batch, precision=policy, optimizer=optimizer,
                                 grad_accum_steps=accum, recompute=recompute,
                                 input_batches=1)  # one constant batch
    result = plan.plan_memory(profile, settings)
    return {"config": name, "model": model_name, "input_shape": list(shape), "batch": batch,
            "precision": policy, "optimizer": optimizer, "grad_accum_steps": accum,
            "recompute": recompute,
            "device": device, "parameters": profile.parameters,
            "count_params": model.count_params(), "measured_peak": int(peak),
            "predicted": int(result.total), "breakdown": result.breakdown,
            "ratio": result.total / peak}


def main(argv):
    del argv
    if FLAGS.measure_one:
        return _cli.print_result(_measure(FLAGS.measure_one))
    from tfaccel import doctor, plots, summaries

    rows = []
    for i, name in enumerate(FLAGS.configs):
        runs = [_cli.measure_in_fresh_process(__file__, name, f"--steps={FLAGS.steps}")
                for _ in range(FLAGS.repeats)]
        r = dict(runs[0], measured_peaks=[run["measured_peak"] for run in runs])
        r["measured_peak"] = max(r["measured_peaks"])
        r["ratio"] = r["predicted"] / r["measured_peak"]
        rows.append(r)
        print(f"[{i + 1}/{len(FLAGS.configs)}] {name}: predicted {r['predicted'] / 1e6:,.1f} MB, "
              f"measured {r['measured_peak'] / 1e6:,.1f} MB (largest of "
              + ", ".join(f"{p / 1e6:,.1f}" for p in r["measured_peaks"])
              + f"), ratio {r['ratio']:.3f}", flush=True)
    for r in rows:
        r["predicted MB"], r["measured MB"] = r["predicted"] / 1e6, r["measured_peak"] / 1e6
        r["smallest measured MB"] = min(r["measured_peaks"]) / 1e6
        r["within"] = LOW <= r["ratio"] <= HIGH
    table = summaries.markdown_table(rows, ["config", "model", "input_shape", "batch", "precision",
                                            "optimizer", "grad_accum_steps", "recompute",
                                            "predicted MB",
                                            "measured MB", "smallest measured MB", "ratio",
                                            "within"])
    met = all(r["within"] for r in rows)
    header = (f"memory plan vs measured peak ({rows[0]['device']} allocator, pooled); "
              f"{doctor.machine_summary()}")
    verdict = (f"{'PASS' if met else 'FAIL'}  {sum(r['within'] for r in rows)}/{len(rows)} "
               f"predictions within {LOW}-{HIGH} of the measured peak")
    print(f"\n{header}\n\n{table}\n\n{verdict}")
    bars = []
    for r in rows:
        bars += [(f"{r['config']} plan", r["breakdown"]),
                 (f"{r['config']} measured", {"measured peak": r["measured_peak"]})]
    png = plots.plot_memory(bars, os.path.join(FLAGS.output_dir, "bench_memory.png"),
                            "memory plan (stacked) vs measured peak per configuration")
    _cli.write_outputs("bench_memory", {"machine": doctor.machine_summary(), "rows": rows,
                                        "met": met, "command": " ".join(["python", *sys.argv])},
                       f"{header}\n\n{table}\n\n{verdict}", png,
                       {f"bench_memory/{r['config']}_ratio": r["ratio"] for r in rows})
    return 0 if met else 1


if __name__ == "__main__":
    _cli.run(main)
