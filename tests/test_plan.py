"""tfaccel.performance.plan and `tfaccel plan`: the breakdown, the verdict, the changes that fit."""

import json
import os
import subprocess
import sys
import time

import pytest

from tfaccel.errors import ConfigError
from tfaccel.performance import calibrate, memory_profile, plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GB = 10**9


def _13b():
    return memory_profile.profile_transformer(40, 5120, 40, 32000, 2048)


def _states(result):
    return sum(result.breakdown[k] for k in plan.MODEL_STATES)


def test_float32_adam_model_states_are_four_times_the_weights():
    profile = memory_profile.profile_transformer(4, 128, 4, 103, 64)
    result = plan.plan_memory(profile, plan.PlanSettings(batch_size=8))
    weights = 4 * profile.parameters
    assert result.breakdown["weights (float32)"] == weights
    assert _states(result) == 4 * weights  # accelerate's "x4 for training with Adam"


def test_mixed_precision_adam_is_zero_s_16_bytes_plus_keras_s_casts():
    profile = _13b()
    result = plan.plan_memory(profile, plan.PlanSettings(batch_size=1,
                                                         precision="mixed_bfloat16"))
    n = profile.parameters
    zero_paper = sum(result.breakdown[k] for k in
                     ("weights (float32)", "gradients (float32)", "optimizer slots"))
    assert zero_paper == 16 * n  # the ZeRO paper's 16 bytes per parameter
    assert result.breakdown["16-bit weight casts"] == 2 * n  # Keras keeps the casts as well
    assert 200 * GB < zero_paper < 210 * GB  # ~208 GB for "13B" (12.76e9 here)


@pytest.mark.parametrize("optimizer,slots", [("sgd", 0), ("momentum", 1), ("adam", 2)])
def test_optimizer_slots(optimizer, slots):
    profile = memory_profile.profile_transformer(2, 64, 2, 50, 16)
    result = plan.plan_memory(profile, plan.PlanSettings(batch_size=4, optimizer=optimizer))
    assert result.breakdown["optimizer slots"] == 4 * slots * profile.trainable


def test_the_13b_question_answers_fast_and_prices_a_pipeline():
    start = time.perf_counter()
    result = plan.plan_memory(_13b(), plan.PlanSettings(
        batch_size=1, precision="mixed_bfloat16", device_memory="24GB"))
    assert time.perf_counter() - start < 5
    assert result.fits is False and result.headroom < 0
    # 3 x 80 GiB hold the model states (229.7 GB) but not 4 micro-batches' float32 residual
    # streams kept under recomputation (`profile_transformer`'s block boundaries) beside them
    assert result.pipeline_devices[80] == 4 and result.pipeline_devices[24] > 8
    text = plan.format_plan(result)
    assert "DOES NOT FIT" in text and "4 x 80 GiB" in text
    assert all("stages" in x["settings"] for x in result.suggestions)
    assert "no change on one device makes it fit: TensorFlow has no ZeRO sharding" in text


def test_every_suggestion_fits_and_they_come_cheapest_first():
    profile = memory_profile.profile_transformer(12, 768, 12, 50257, 1024)
    settings = plan.PlanSettings(batch_size=32, device_memory="rtx4090")
    result = plan.plan_memory(profile, settings)
    assert result.fits is False and result.suggestions
    usable = int(plan.parse_device_memory("rtx4090") * (1 - plan.FRAMEWORK_MARGIN))
    for s in result.suggestions:
        assert s["total"] <= usable
        again = plan.plan_memory(profile, plan.PlanSettings(
            **{**settings.__dict__, **s["settings"]}))
        assert again.total == s["total"] and again.fits
    first = result.suggestions[0]["settings"]
    assert "stages" not in first  # a change on one device before buying more devices
    assert "no change on one device" not in plan.format_plan(result)


def test_accumulation_recomputation_and_stages_cut_activations():
    profile = memory_profile.profile_transformer(8, 256, 8, 256, 128)
    base = plan.breakdown(profile, plan.PlanSettings(batch_size=64))
    accum = plan.breakdown(profile, plan.PlanSettings(batch_size=64, grad_accum_steps=4))
    recompute = plan.breakdown(profile, plan.PlanSettings(batch_size=64, recompute=True))
    assert accum["activations"] == base["activations"] // 4
    assert accum["accumulated gradients"] == 2 * base["gradients (float32)"]  # and the sum
    assert recompute["activations"] < base["activations"] / 3
    staged = plan.breakdown(profile, plan.PlanSettings(batch_size=64, stages=2,
                                                       micro_batches=8))
    assert staged["weights (float32)"] < 0.7 * base["weights (float32)"]


def test_bubble_fraction_is_gpipes():
    assert plan.bubble_fraction(1, 8) == 0
    assert plan.bubble_fraction(4, 16) == pytest.approx(3 / 19)


@pytest.mark.parametrize("text,expected", [
    ("24GB", 24 * 2**30), ("24 GiB", 24 * 2**30), ("16000MB", 16000 * 2**20),
    ("rtx4090", 24 * 2**30), ("a100-80gb", 80 * 2**30), ("12", 12 * 2**30)])
def test_device_memory(text, expected):
    assert plan.parse_device_memory(text) == expected


@pytest.mark.parametrize("text", ["rtx9090", "24XB", "-3GB", "0", "lots"])
def test_bad_device_memory_is_one_clear_error(text):
    with pytest.raises(ConfigError, match="neither a size .* nor a card"):
        plan.parse_device_memory(text)


@pytest.mark.parametrize("change,message", [
    ({"batch_size": 0}, "batch_size=0: must be a positive integer"),
    ({"stages": 99}, "stages=99 is more than the model's"),
    ({"grad_accum_steps": 64}, "grad_accum_steps=64 is larger than batch_size=8"),
    ({"precision": "float8"}, "precision 'float8'"),
])
def test_bad_settings(change, message):
    profile = memory_profile.profile_transformer(2, 64, 2, 50, 16)
    with pytest.raises(ConfigError, match=message):
        plan.plan_memory(profile, plan.PlanSettings(**{"batch_size": 8, **change}))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tfaccel.cli", "plan", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)


def test_cli_13b_json_without_tensorflow():
    proc = _cli("--model=gpt", "--gpt_layers=40", "--gpt_d_model=5120", "--gpt_heads=40",
                "--vocab_size=32000", "--sequence_length=2048", "--batch_size=1",
                "--precision=mixed_bfloat16", "--device_memory=24GB", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["fits"] is False and out["parameters"] == _13b().parameters
    assert out["pipeline_devices"]["80"] == 4


@pytest.mark.parametrize("args,message", [
    (["--device_memory=rtx9090"], "device memory 'rtx9090' is neither a size"),
    (["--device_memory=12XB"], "device memory '12XB' is neither a size"),
    (["--batch_size=0"], "0 must be a positive integer"),
    (["--model=gpt", "--stages=99"], "stages=99 is more than the model's"),
    (["--model=/nonexistent/model.keras"], "--model=/nonexistent/model.keras: not gpt"),
    (["--model=gpt", "--onednn=off"], "--onednn=off applies to a traced model"),
])
def test_cli_bad_input_is_one_line(args, message):
    proc = _cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


def test_cli_a_model_file_that_does_not_load(tmp_path):
    bad = tmp_path / "broken.keras"
    bad.write_bytes(b"not a zip file")
    proc = _cli(f"--model={bad}")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and proc.stderr.startswith("error: ")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_cli_context_is_the_models_maximum_and_sequence_length_what_a_step_trains_on():
    proc = _cli("--model=gpt", "--context=256", "--sequence_length=64", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    at_64 = memory_profile.profile_transformer(4, 128, 4, 256, 64, context=256, half=False)
    short = plan.plan_memory(at_64, plan.PlanSettings(batch_size=32))
    assert out["parameters"] == at_64.parameters  # 256 rows of position embedding
    assert out["breakdown"]["activations"] == short.breakdown["activations"]  # 64 tokens
    long = memory_profile.profile_transformer(4, 128, 4, 256, 256, half=False)
    assert long.parameters == at_64.parameters and long.activation_bytes() > \
        3 * at_64.activation_bytes()
    assert "closed form" in out["method"]
    proc = _cli("--model=gpt", "--context=64", "--sequence_length=128")
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("error: --sequence_length=128 is longer than --context=64: "
                                   "a step trains on at most the model's context")


def test_an_encoder_keeps_no_language_model_logits():
    vocab, s = 30000, 128
    decoder = memory_profile.profile_transformer(2, 128, 4, vocab, s, half=False)
    encoder = memory_profile.profile_transformer(2, 128, 4, vocab, s, half=False, encoder=True,
                                                 num_classes=3)
    assert decoder.activation_bytes() - encoder.activation_bytes() > 4 * s * vocab - 4096
    assert encoder.parameters == decoder.parameters + 128 * 128 + 128 + 128 * 3 + 3
    assert "encoder" in encoder.method
    proc = _cli("--model=bert", "--sequence_length=64", "--json")
    assert proc.returncode == 0 and "encoder" in json.loads(proc.stdout)["method"]


def test_cli_a_zoo_model_is_planned_from_its_traced_step_and_says_so():
    proc = _cli("--model=mlp", "--batch_size=64")
    assert proc.returncode == 0, proc.stderr
    assert "activations from: graph (the traced train step at batches 2 and 4)" in proc.stdout


@pytest.mark.parametrize("onednn", [False, True])
def test_a_plan_for_tensorflows_own_cpu_kernels_counts_their_workspaces(onednn):
    # the zoo CNN at batch 256: with oneDNN off (an AVX2-only CPU) its convolution gradients
    # keep two 14.2 MB column buffers at once, and its pooling gradient an int64 argmax
    result = plan.plan_memory("cnn", batch_size=256, optimizer="sgd", input_shape=(8, 8, 1),
                              num_classes=10, onednn=onednn)
    workspaces = result.breakdown["kernel workspaces (oneDNN off)"]
    assert result.onednn is onednn and json.loads(json.dumps(result.to_json()))["onednn"] is onednn
    text = plan.format_plan(result)
    if onednn:
        assert workspaces == 0 and "host CPU kernels: oneDNN's" in text
    else:
        assert 20e6 < workspaces <= 2 * 192 * 64 * 288 * 4 + 256 * 4 * 4 * 64 * 8
        assert "host CPU kernels: TensorFlow's own, oneDNN off" in text
    assert "| **total** | **" in text and " GB" not in text  # 45 MB reads in MB


@pytest.mark.parametrize("replayed_peak, expected", [
    (0, 30_000),  # no recomputation: the kernels' buffers stand beside the transient
    (100 * 64 + 2_000 + 50 * 64, 30_000),  # the replay holds all the rows allow: no overlap
    (100 * 64 + 2_000 + 50 * 64 - 10_000, 20_000),  # the rows allow 10 kB more than the replay
    (100 * 64 + 2_000 + 50 * 64 - 40_000, 0),  # ... more than the kernels' buffers
])
def test_a_recomputing_steps_kernel_buffers_count_beyond_what_its_transient_row_allows(
        replayed_peak, expected):
    # a traced step (64 examples: 100 B kept and 50 B transient each, 2 kB fixed) with 30 kB
    # of kernel buffers; a recomputing step's transient row holds a whole recomputed block,
    # which the replay (`recomputed_step_peak_bytes`) frees as the block's gradient runs
    step = memory_profile.LayerMemory("traced step", 1_000, 100, 50)
    profile = memory_profile.MemoryProfile(
        "m", (step,), 1_000, 0, 4, recompute_unit="step", fixed_activation_bytes=2_000,
        kernel_workspace_bytes=30_000, recomputed_step_peak_bytes=replayed_peak)
    parts = plan.breakdown(profile, plan.PlanSettings(batch_size=64, input_batches=1))
    assert parts["kernel workspaces (oneDNN off)"] == expected
    assert (parts["activations"], parts["backward transients"]) == (100 * 64 + 2_000, 50 * 64)


@pytest.mark.slow
def test_cli_plans_either_kind_of_host_kernels():
    on, off = (json.loads(_cli("--model=cnn", "--batch_size=256", f"--onednn={v}", "--json")
                          .stdout) for v in ("on", "off"))
    assert (on["onednn"], off["onednn"]) == (True, False)
    assert off["total"] - on["total"] > 20e6


def test_cli_measure_needs_a_model_to_run():
    proc = _cli("--model=gpt", "--measure")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "--measure needs a model to run" in proc.stderr


@pytest.mark.slow
def test_measure_returns_the_measured_and_the_planned_number_with_their_methods():
    result = plan.plan_memory("mlp", batch_size=256, input_shape=(8, 8, 1), num_classes=10,
                              input_batches=1, measure=True)
    c = result.measured
    assert set(c.peaks) == {32, 64, 128} and min(c.peaks.values()) > 0 and c.per_example >= 0
    per_example, fixed = calibrate.fit_line(c.peaks)
    assert (c.per_example, c.fixed) == (per_example, fixed)
    assert c.line == round(c.fixed + 256 * c.per_example)
    # the graph's plan at 256 shifted by the measured peak's distance from its plan at 128
    at_128 = plan.plan_memory("mlp", batch_size=128, input_shape=(8, 8, 1), num_classes=10,
                              input_batches=1).total
    assert c.graph_shifted == result.total + c.peaks[128] - at_128
    assert c.predicted == max(c.line, c.graph_shifted)
    assert c.method.startswith("measured") and result.method.startswith("graph")
    assert c.spread >= 0
    text = plan.format_plan(result)
    assert "measured:" in text and "activations from: graph" in text
