"""recipes/train_lm.py and recipes/generate.py: the language-model lane end to end.

A small decoder (2 blocks, d_model 32, context 32) trains for a few dozen steps on the
default corpus; what a real run writes (TensorBoard scalars and text, exports with their
vocabulary, TFLite files and their losses, metrics.json) is read back, and the generate
recipe continues a prompt from the export. Bad input is one line, exit 2, no traceback.
"""

import json
import os
import re
import signal
import subprocess

import pytest
from conftest import check_flag_error, run_recipe

from tfaccel import summaries
from tfaccel.train import resume

# An untrained SMALL model's validation loss is ln(104) = 4.64 (measured 4.64-4.67 over seeds);
# 60 steps take it to about 3.3.
TRAINED = 3.9
SMALL = ("--precision=float32", "--jit_compile=false",  # no timed trials (the default: auto)
         "--gpt_layers=2", "--gpt_d_model=32", "--gpt_context=32", "--steps_per_epoch=30",
         "--sample_tokens=40", "--monitor_every_n_steps=0")


def _train(model_dir, *extra, epochs=2, timeout=600):
    proc = run_recipe("train_lm", f"--model_dir={model_dir}", f"--epochs={epochs}", *SMALL,
                      *extra, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc, json.loads((model_dir / "metrics.json").read_text())


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("lm") / "run"
    return (model_dir, *_train(model_dir))


@pytest.mark.slow
def test_writes_exports_metrics_and_tflite_losses(short_run):
    model_dir, proc, metrics = short_run
    assert {"model.keras", "vocabulary.json", "model.tflite", "model_int8.tflite",
            "metrics.json", "flags.cfg", "logs", "checkpoints"} <= set(os.listdir(model_dir))
    assert not (model_dir / "backup").exists()  # removed once metrics.json is written
    assert metrics["steps"] == 60 and metrics["sequence_length"] == 32
    assert metrics["vocabulary_size"] == 104 and metrics["tokenizer"] == "char"
    assert metrics["model"]["layers"] == 2 and metrics["parameters"] > 0
    loss = metrics["validation_loss"]
    assert 0 < loss < TRAINED
    assert metrics["validation_bits_per_char"] == pytest.approx(loss / 0.6931471805599453)
    assert metrics["validation_perplexity"] == pytest.approx(2.718281828459045 ** loss)
    rows = {r["model"]: r for r in metrics["export_validation"]}
    assert rows["model.tflite"]["loss"] == pytest.approx(loss, rel=1e-3)
    assert rows["model_int8.tflite"]["loss"] == pytest.approx(loss, rel=0.05)
    assert rows["model_int8.tflite"]["size_mb"] < rows["model.tflite"]["size_mb"]
    assert metrics["tokens_per_sec"] > 0
    assert 0 < metrics["mfu"] < 1 and metrics["training_flops_per_example"] > 0
    assert len(metrics["samples_per_epoch"]) == 2
    assert re.search(r"validation loss [\d.]+ nats/char \([\d.]+ bits, perplexity", proc.stdout)


@pytest.mark.slow
def test_tensorboard_holds_language_model_scalars_and_samples(short_run):
    model_dir, _, metrics = short_run
    train = summaries.read_scalars(model_dir / "logs" / "train")
    validation = summaries.read_scalars(model_dir / "logs" / "validation")
    for tag in ("epoch_loss", "epoch_bits_per_char", "epoch_perplexity", "epoch_tokens_per_sec",
                "learning_rate", "memory/peak_rss_mb", "epoch_mfu"):
        assert tag in train, (tag, sorted(train))
    assert train["epoch_mfu"][-1][1] == pytest.approx(metrics["mfu"], rel=1e-5)
    assert [step for step, _ in train["epoch_bits_per_char"]] == [0, 1]
    assert validation["epoch_loss"][-1][1] == pytest.approx(metrics["validation_loss"], rel=1e-4)
    assert "epoch_bits_per_char" in validation and "epoch_perplexity" in validation
    texts = summaries.read_text_summaries(model_dir / "logs" / "train")
    assert {"samples/generated", "config/flags", "model/config",
            "export/validation_loss"} <= set(texts)
    # The learning rate warms up, then decays (warmup+cosine is the default here).
    rates = [v for _, v in train["learning_rate"]]
    peak = rates.index(max(rates))
    assert 0 < peak < len(rates) - 1 and rates[-1] < max(rates)


@pytest.mark.slow
def test_generate_recipe_continues_a_prompt_deterministically(short_run):
    model_dir = short_run[0]
    args = (f"--model_dir={model_dir}", "--prompt=The ", "--max_new_tokens=30", "--seed=3")
    first, second = run_recipe("generate", *args), run_recipe("generate", *args)
    assert first.returncode == 0, first.stderr[-2000:]
    assert first.stdout.startswith("The ") and first.stdout == second.stdout
    other = run_recipe("generate", *args[:-1], "--seed=4")
    assert other.returncode == 0 and other.stdout != first.stdout
    uncached = run_recipe("generate", *args, "--nouse_cache")  # the same text, the long way
    assert uncached.returncode == 0 and uncached.stdout == first.stdout
    bad = run_recipe("generate", f"--model_dir={model_dir}", "--prompt=naïve ☃")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1 and "--tokenizer=byte" in bad.stderr


@pytest.mark.slow
def test_rerun_of_a_finished_run_trains_nothing(short_run):
    model_dir = short_run[0]
    proc = run_recipe("train_lm", f"--model_dir={model_dir}", "--epochs=2", *SMALL)
    assert proc.returncode == 0
    assert "holds a finished run (validation loss" in proc.stdout
    assert "Epoch 1/2" not in proc.stdout


def _binary(tmp_path):
    path = tmp_path / "blob.txt"
    path.write_bytes(b"abc\x00\x01\x02" * 100)
    return path


@pytest.mark.parametrize("args,line", [
    (("--gpt_heads=3", "--gpt_d_model=32"), "--gpt_heads=3 does not divide --gpt_d_model=32: "
     "pick heads that divide it (e.g. 2) or another d_model"),
    (("--sequence_length=128",), "--sequence_length=128 is larger than the model's context 64: "
     "pass --sequence_length<=64, or --gpt_context>=128"),
    (("--model=cnn",), "--model=cnn: use one of gpt, gpt2"),
    (("--model=gpt2", "--recompute"), "--recompute cannot train --model=gpt2, a Keras 3 model "
     "(it recomputes tfaccel's GPT blocks): drop --recompute, or train tfaccel's GPT "
     "(--model=gpt)"),
    (("--model=gpt2", "--tie_embeddings"), "--tie_embeddings cannot train --model=gpt2, a "
     "Keras 3 model (KerasHub's GPT-2 always ties its embedding): drop --tie_embeddings, or "
     "train tfaccel's GPT (--model=gpt)"),
    (("--model_fn=user_lms:bigram", "--plan"), "--plan cannot train --model_fn=user_lms:bigram, a "
     "Keras 3 model (the plan reads the decoder's sizes from the GPT flags, which do not "
     "describe your model): drop --plan, or train tfaccel's GPT (--model=gpt)"),
    (("--model=gpt2", "--parallel=pipeline", "--stage_boundaries=block_1_ln_1"),
     "--parallel cannot train --model=gpt2, a Keras 3 model (train_lm's stages split "
     "tfaccel's GPT blocks; --strategy=mirrored with --grad_accum_steps trains it on several "
     "devices): drop --parallel, or train tfaccel's GPT (--model=gpt)"),
])
def test_bad_flag_one_line_before_tensorflow(tmp_path, args, line):
    check_flag_error("train_lm", f"--model_dir={tmp_path / 'run'}", *args, line=line)
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.parametrize("args,line", [
    (("--data_dir={binary}",), "{binary} is a binary file (a NUL byte at offset 3): give UTF-8 "
     "text"),
    pytest.param(("--data_dir={empty}",), "{empty} is empty: give --data_dir= a file with text "
                 "in it", marks=pytest.mark.slow),
    pytest.param(("--data_dir={short}",), "text shorter than one window: the training part of "
                 "{short} holds 11 tokens and one window of --sequence_length=64 needs 65: give "
                 "at least 645 characters of text (it has 12), or a smaller --sequence_length",
                 marks=pytest.mark.slow),
    pytest.param(("--prompt=☃",), "1 characters are not in the vocabulary: '☃': remove "
                 "them, or train with --tokenizer=byte", marks=pytest.mark.slow),
])
def test_bad_input_one_line_no_traceback(tmp_path, args, line):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    short = tmp_path / "short.txt"
    short.write_text("a short text")
    paths = {"empty": empty, "binary": _binary(tmp_path), "short": short}
    model_dir = tmp_path / "run"
    proc = run_recipe("train_lm", f"--model_dir={model_dir}",
                      *(a.format(**paths) for a in args), timeout=120)
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [f"error: {line.format(**paths)}"], proc.stderr
    assert not os.path.exists(model_dir / "metrics.json")


@pytest.mark.slow
def test_by_default_the_precision_and_xla_are_measured_and_the_winner_trains(tmp_path):
    model_dir = tmp_path / "run"
    proc = run_recipe("train_lm", f"--model_dir={model_dir}", "--epochs=1", "--notflite",
                      "--auto_budget_seconds=30", *SMALL[2:])  # without the pinned settings
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    match = re.search(r"auto chose precision (\S+), jit_compile (\S+) \(trials ([\d.]+) s of a "
                      r"30 s budget\)", proc.stdout)
    assert match, proc.stdout[-3000:]
    assert (metrics["precision"], str(metrics["jit_compile"])) == match.groups()[:2]
    assert "| float32 | False |" in proc.stdout  # the baseline's row of the trials' table
    texts = summaries.read_text_summaries(model_dir / "logs" / "train")
    assert "| status |" in texts["performance/auto_precision"]


@pytest.mark.slow
def test_byte_level_model_takes_any_prompt(tmp_path):
    model_dir = tmp_path / "run"
    _, metrics = _train(model_dir, "--tokenizer=byte", "--prompt=naïve ☃ ", "--notflite",
                        epochs=1)
    assert metrics["vocabulary_size"] == 256 and "bits_per_byte" in json.dumps(metrics)
    proc = run_recipe("generate", f"--model_dir={model_dir}", "--prompt=naïve ☃ ",
                      "--max_new_tokens=20")
    assert proc.returncode == 0 and proc.stdout.startswith("naïve ☃ "), proc.stderr[-2000:]


@pytest.mark.slow
def test_trains_mirrored_on_two_logical_cpus(tmp_path):
    _, metrics = _train(tmp_path / "run", "--strategy=mirrored", "--cpu_devices=2", "--notflite",
                        "--ema=0.9")  # the weights' average, kept per replica, ends the run
    assert metrics["distribution"]["replicas"] == 2 and metrics["ema"] == 0.9
    assert metrics["per_replica_batch_size"] == 6 and metrics["steps"] == 60
    assert metrics["validation_loss"] < TRAINED


@pytest.mark.slow
def test_trains_under_mixed_bfloat16_with_accumulation(tmp_path):
    _, metrics = _train(tmp_path / "run", "--precision=mixed_bfloat16", "--grad_accum_steps=4")
    assert metrics["precision"] == "mixed_bfloat16" and metrics["grad_accum_steps"] == 4
    assert metrics["steps"] == 60
    assert metrics["validation_loss"] < TRAINED
    rows = {r["model"]: r for r in metrics["export_validation"]}
    # The export is float32: its TFLite loss is the bf16 model's up to bf16 rounding.
    assert rows["model.tflite"]["loss"] == pytest.approx(metrics["validation_loss"], rel=0.02)


@pytest.mark.slow
def test_trains_under_mixed_float16_with_loss_scaling_and_accumulation(tmp_path):
    _, metrics = _train(tmp_path / "run", "--precision=mixed_float16", "--grad_accum_steps=4",
                        "--notflite")
    assert metrics["precision"] == "mixed_float16" and metrics["steps"] == 60
    assert metrics["validation_loss"] < TRAINED


@pytest.mark.slow
def test_a_backup_of_another_model_is_refused_in_one_line(tmp_path):
    from conftest import RECIPES
    from test_resume import _env, _Run

    model_dir = tmp_path / "run"
    command = [os.sys.executable, os.path.join(RECIPES, "train_lm.py"), f"--model_dir={model_dir}",
               "--epochs=4", "--backup_freq=epoch", "--notflite", *SMALL]
    first = _Run(command)
    try:
        assert first.wait_for(lambda: os.path.exists(model_dir / "backup" / "chief" / "checkpoint"))
    finally:
        first.kill()
    proc = subprocess.run([*command, "--recompute"], env=_env(), text=True,
                          capture_output=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    (line,) = proc.stderr.strip().splitlines()
    assert "is of another model (recompute=False -> True)" in line


@pytest.mark.slow
def test_resumes_after_kill_9_to_the_same_result(tmp_path):
    from conftest import RECIPES
    from test_resume import _env, _Run

    epochs, common_args = 4, ("--backup_freq=epoch", "--notflite", *SMALL)
    _, straight = _train(tmp_path / "straight", "--backup_freq=epoch", "--notflite",
                         epochs=epochs)
    model_dir = tmp_path / "killed"
    command = [os.sys.executable, os.path.join(RECIPES, "train_lm.py"),
               f"--model_dir={model_dir}", f"--epochs={epochs}", *common_args]
    first = _Run(command)
    try:
        assert first.wait_for(lambda: os.path.exists(model_dir / "backup" / "chief" / "checkpoint"))
    finally:
        assert first.kill() == -signal.SIGKILL, first.output[-3000:]
    backup = resume.read_backup(model_dir / "backup")
    assert backup is not None and 1 <= backup.epoch < epochs
    second = subprocess.run(command, env=_env(), text=True, capture_output=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resume: continuing from backup {backup.path} at epoch {backup.epoch + 1}/" \
        in second.stdout
    resumed = json.loads((model_dir / "metrics.json").read_text())
    assert resumed["resumed_at_epoch"] == backup.epoch + 1
    assert resumed["steps"] == straight["steps"] == epochs * 30
    # Same windows in each epoch, same optimizer state: the same model as the uninterrupted run.
    assert resumed["validation_loss"] == pytest.approx(straight["validation_loss"], rel=1e-4)


@pytest.mark.slow
def test_pipeline_stages_train_like_the_unsplit_model(tmp_path):
    """Issue #14 in the LM recipe: 2 stages cut at a block, 4 micro-batches, same losses."""
    results = {}
    for name, extra in (("unsplit", ("--cpu_devices=2", "--strategy=default")),
                        ("pipeline", ("--parallel=pipeline", "--stage_boundaries=block_1_ln_1",
                                      "--micro_batches=4", "--cpu_devices=2"))):
        if name == "unsplit":
            _, metrics = _train(tmp_path / name, "--tflite=false", *extra)
        else:  # the recipe's default precision/XLA (auto) becomes float32 without XLA
            proc = run_recipe("train_lm", f"--model_dir={tmp_path / name}", "--epochs=2",
                              *SMALL[2:], "--tflite=false", *extra, timeout=600)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
            assert ("--parallel=pipeline: --precision=float32 --jit_compile=false (the timed "
                    "trials and XLA run the unsplit model") in proc.stdout
            metrics = json.loads((tmp_path / name / "metrics.json").read_text())
            assert (metrics["precision"], metrics["jit_compile"]) == ("float32", False)
        results[name] = metrics
    # AdamW amplifies the float rounding of summing micro-batch gradients (measured: 3.0975
    # against 3.0984 after 60 steps); plain SGD is equal to 1e-7 (test_pipeline_parallel.py)
    assert results["pipeline"]["validation_loss"] == pytest.approx(
        results["unsplit"]["validation_loss"], rel=1e-3)
    assert results["pipeline"]["validation_loss"] < TRAINED
    stages = results["pipeline"]["stages"]["stages"]
    assert stages[1]["layers"][0] == "block_1_ln_1" and stages[1]["device"].endswith("CPU:1")
    logs = tmp_path / "pipeline" / "logs" / "train"
    table = summaries.read_text_summaries(logs)["parallel/stages"]
    assert "block_1_ln_1 .." in table


# ------------------------------------------------------------------ a model you bring



@pytest.fixture
def user_lms():
    """The environment in which --model_fn=user_lms:<name> imports tests/user_lms.py."""
    return {"PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}


def test_keras_hub_missing_is_one_line_before_tensorflow(tmp_path):
    hidden = tmp_path / "hide"
    hidden.mkdir()
    (hidden / "sitecustomize.py").write_text("import sys\nsys.modules['keras_hub'] = None\n")
    check_flag_error("train_lm", f"--model_dir={tmp_path / 'run'}", "--model=gpt2",
                     env={"PYTHONPATH": str(hidden)},
                     line="--model=gpt2 needs KerasHub, which is not installed: pip install "
                     "-e '.[hub]' (keras-hub 0.32), or train tfaccel's GPT (--model=gpt)")


@pytest.mark.parametrize("spec,line", [
    ("no_such_module:build", "--model_fn='no_such_module:build': cannot import "
     "'no_such_module' (no module named 'no_such_module'): put the folder holding it on "
     "PYTHONPATH, e.g. PYTHONPATH=/path/to/folder (the current folder is not searched)"),
    pytest.param("user_lms:pooled", "--model_fn='user_lms:pooled': the model maps token ids "
                 "[1, 32] to outputs of shape (1, 104), not logits (1, 32, 104): return a causal "
                 "LM whose last layer gives one logit per vocabulary entry at every position",
                 marks=pytest.mark.slow),
])
def test_bad_model_fn_one_line_before_training(tmp_path, user_lms, spec, line):
    model_dir = tmp_path / "run"
    proc = run_recipe("train_lm", f"--model_dir={model_dir}", f"--model_fn={spec}", *SMALL,
                      timeout=300, env=user_lms)
    assert proc.returncode == 2, proc.stdout[-1000:] + proc.stderr[-2000:]
    assert proc.stderr.splitlines() == [f"error: {line}"], proc.stderr[-2000:]
    assert "Epoch 1/" not in proc.stdout and not (model_dir / "metrics.json").exists()


HUB_SMALL = ("--model=gpt2", "--gpt_heads=2")  # with SMALL: 2 layers, d_model 32, context 32


@pytest.fixture(scope="module")
def hub_run(tmp_path_factory):
    pytest.importorskip("keras_hub")
    model_dir = tmp_path_factory.mktemp("hub") / "run"
    return (model_dir, *_train(model_dir, *HUB_SMALL, "--grad_accum_steps=2"))


@pytest.mark.slow
def test_keras_hub_gpt2_trains_exports_and_logs_like_the_gpt(hub_run):
    model_dir, proc, metrics = hub_run
    assert {"model.keras", "vocabulary.json", "model.tflite", "model_int8.tflite",
            "metrics.json", "logs", "checkpoints"} <= set(os.listdir(model_dir))
    assert metrics["keras"] == "keras3" and metrics["model"]["model"] == "keras_hub.GPT2CausalLM"
    assert metrics["model"]["layers"] == 2 and metrics["model"]["d_model"] == 32
    # Keras 3 accumulates in its optimizer: 2 micro-batches of 6 an update, 60 updates.
    assert metrics["steps"] == 60 and metrics["grad_accum_steps"] == 2
    loss = metrics["validation_loss"]
    assert 0 < loss < TRAINED
    rows = {r["model"]: r for r in metrics["export_validation"]}
    assert rows["model.tflite"]["loss"] == pytest.approx(loss, rel=1e-3)
    assert rows["model_int8.tflite"]["loss"] == pytest.approx(loss, rel=0.05)
    assert 0 < metrics["mfu"] < 1 and metrics["tokens_per_sec"] > 0
    assert len(metrics["samples_per_epoch"]) == 2
    train = summaries.read_scalars(model_dir / "logs" / "train")
    validation = summaries.read_scalars(model_dir / "logs" / "validation")
    for tag in ("epoch_loss", "epoch_bits_per_char", "epoch_tokens_per_sec", "learning_rate"):
        assert tag in train, (tag, sorted(train))
    assert validation["epoch_loss"][-1][1] == pytest.approx(loss, rel=1e-4)
    assert "samples/generated" in summaries.read_text_summaries(model_dir / "logs" / "train")
    assert "KerasHub GPT2CausalLM 2 layers x 2 heads x d_model 32" in proc.stdout


@pytest.mark.slow
def test_generate_recipe_samples_the_keras_hub_model_cached_or_not(hub_run):
    model_dir = hub_run[0]
    args = (f"--model_dir={model_dir}", "--prompt=The ", "--max_new_tokens=40",
            "--temperature=0")
    cached, uncached = run_recipe("generate", *args), run_recipe("generate", *args,
                                                                 "--nouse_cache")
    assert cached.returncode == 0, cached.stderr[-2000:]
    assert cached.stdout.startswith("The ") and len(cached.stdout.rstrip("\n")) == 44
    assert uncached.returncode == 0 and uncached.stdout == cached.stdout


@pytest.mark.slow
def test_model_fn_language_model_trains_and_generates(tmp_path, user_lms):
    model_dir = tmp_path / "run"
    proc = run_recipe("train_lm", f"--model_dir={model_dir}", "--epochs=1",
                      "--model_fn=user_lms:bigram", "--learning_rate=0.01", *SMALL, env=user_lms)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["model"]["model_fn"] == "user_lms:bigram" and metrics["keras"] == "keras3"
    assert metrics["steps"] == 30 and metrics["validation_loss"] < 4.5  # ln(104) = 4.64
    sample = run_recipe("generate", f"--model_dir={model_dir}", "--max_new_tokens=10",
                        env=user_lms)
    assert sample.returncode == 0 and sample.stdout.startswith("The "), sample.stderr[-2000:]


@pytest.mark.slow
def test_keras_hub_gpt2_resumes_after_kill_9_to_the_same_result(tmp_path):
    pytest.importorskip("keras_hub")
    from conftest import RECIPES
    from test_resume import _env, _Run

    epochs, common_args = 3, ("--backup_freq=epoch", "--notflite", *SMALL, *HUB_SMALL)
    _, straight = _train(tmp_path / "straight", *common_args[:2], *HUB_SMALL, epochs=epochs)
    model_dir = tmp_path / "killed"
    command = [os.sys.executable, os.path.join(RECIPES, "train_lm.py"),
               f"--model_dir={model_dir}", f"--epochs={epochs}", *common_args]
    first = _Run(command)
    try:
        assert first.wait_for(lambda: resume.read_backup(model_dir / "backup") is not None)
    finally:
        assert first.kill() == -signal.SIGKILL, first.output[-3000:]
    backup = resume.read_backup(model_dir / "backup")
    assert backup is not None and 1 <= backup.epoch < epochs
    second = subprocess.run(command, env=_env(), text=True, capture_output=True, timeout=600)
    assert second.returncode == 0, second.stderr[-3000:]
    resumed = json.loads((model_dir / "metrics.json").read_text())
    assert resumed["resumed_at_epoch"] == backup.epoch + 1
    assert resumed["steps"] == straight["steps"] == epochs * 30
    assert resumed["validation_loss"] == pytest.approx(straight["validation_loss"], rel=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [
    ("--strategy=mirrored", "--cpu_devices=2", "--grad_accum_steps=2"),  # tfaccel's micro-batches
    ("--precision=mixed_bfloat16",),
])
def test_keras_hub_gpt2_trains_mirrored_and_in_bfloat16(tmp_path, extra):
    pytest.importorskip("keras_hub")
    _, metrics = _train(tmp_path / "run", *HUB_SMALL, "--notflite", *extra)
    assert metrics["keras"] == "keras3" and metrics["steps"] == 60
    assert metrics["validation_loss"] < TRAINED
    if "--strategy=mirrored" in extra:
        assert metrics["distribution"]["replicas"] == 2
    else:
        assert metrics["precision"] == "mixed_bfloat16"
