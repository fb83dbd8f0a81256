"""recipes/train.py end to end: files, TensorBoard contents, and bad input."""

import ast
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import FLAVOURS, RECIPES, ROOT, check_flag_error, run_recipe

from tfaccel import summaries
from tfaccel.keras import flavour_of
from tfaccel.parallel.stages import UNSPLITTABLE_ADVICE
from tfaccel.train.models import load_model_file


@pytest.fixture(scope="module", params=FLAVOURS)
def short_run(tmp_path_factory, request):
    """The default job for 3 epochs, with --keras=tf_keras and with --keras=keras3."""
    model_dir = tmp_path_factory.mktemp("train") / "run"
    proc = run_recipe("train", "--epochs=3", f"--model_dir={model_dir}",
                      f"--keras={request.param}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return model_dir, proc, request.param


def test_writes_model_checkpoints_and_metrics(short_run):
    model_dir, proc, flavour = short_run
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["epochs"] == 3 and metrics["dataset"] == "digits"
    assert metrics["keras"] == flavour
    assert 0.5 < metrics["test_accuracy"] <= 1.0
    assert metrics["examples_per_sec"] > 0
    # MFU: the last epoch's examples/s x the traced step's FLOPs per example / the peak
    assert metrics["training_flops_per_example"] > 1e5 and "FLOP/cycle" in metrics["peak"]
    assert 0 < metrics["mfu"] < 1
    assert f"utilization: {metrics['mfu']:.1%} MFU of" in proc.stdout
    assert (model_dir / "saved_model" / "saved_model.pb").exists()
    # Weights at each backup: by default (--backup_freq=60s) at most once a minute, and the
    # last epoch always (these epochs are far shorter than a minute).
    checkpoints = sorted(os.listdir(model_dir / "checkpoints"))
    assert checkpoints[-1] == "ckpt-003.weights.h5"
    assert set(checkpoints) <= {f"ckpt-{e:03d}.weights.h5" for e in (1, 2, 3)}
    assert "--epochs=3" in (model_dir / "flags.cfg").read_text()
    assert f"test accuracy {metrics['test_accuracy']:.4f}" in proc.stdout
    # The exported model scores what metrics.json says.
    from tfaccel.data import load_digits
    test = load_digits().test.batch(512)
    model = load_model_file(str(model_dir / "model.keras"), compile=True)
    assert flavour_of(model) == flavour  # saved by, and loaded back in, the Keras it trained in
    _, acc = model.evaluate(test, verbose=0)
    assert acc == pytest.approx(metrics["test_accuracy"], abs=1e-6)
    assert not [f for f in os.listdir(model_dir) if ".tmp-" in f]


def test_tensorboard_event_files_hold_scalars_and_flags(short_run):
    model_dir, _, _ = short_run
    train = summaries.read_scalars(model_dir / "logs" / "train")
    for tag in ("epoch_loss", "epoch_accuracy", "learning_rate", "epoch_examples_per_sec",
                "epoch_mfu"):
        assert tag in train, sorted(train)
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert train["epoch_mfu"][-1][1] == pytest.approx(metrics["mfu"], rel=1e-5)
    assert [step for step, _ in train["epoch_loss"]] == [0, 1, 2]
    assert train["epoch_loss"][-1][1] < train["epoch_loss"][0][1]
    assert all(v == pytest.approx(1e-3) for _, v in train["learning_rate"])
    validation = summaries.read_scalars(model_dir / "logs" / "validation")
    assert {"epoch_loss", "epoch_accuracy"} <= set(validation)
    flags_text = summaries.read_text_summaries(model_dir / "logs" / "train")["config/flags"]
    assert "| epochs | 3 |" in flags_text and "| dataset | digits |" in flags_text
    test = summaries.read_scalars(model_dir / "logs" / "test")
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert test["test_accuracy"][0][1] == pytest.approx(metrics["test_accuracy"], abs=1e-6)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_real_tensorboard_server_serves_the_run(short_run):
    model_dir, _, flavour = short_run
    if flavour != "tf_keras":  # both runs' event files are read back above; one server suffices
        pytest.skip("the real server is checked on the tf_keras run")
    port = _free_port()
    exe = os.path.join(os.path.dirname(sys.executable), "tensorboard")
    server = subprocess.Popen([exe, "--logdir", str(model_dir / "logs"), "--host", "127.0.0.1",
                               "--port", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 90
        tags = None
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
                    tags = json.loads(r.read())
                if tags.get("train"):
                    break
            except OSError:
                pass
            time.sleep(1)
        assert tags and "epoch_accuracy" in tags["train"] and "learning_rate" in tags["train"]
        assert "epoch_accuracy" in tags["validation"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/text/tags",
                                    timeout=5) as r:
            assert "config/flags" in json.loads(r.read())["train"]
    finally:
        server.kill()
        server.wait(timeout=30)


@pytest.mark.slow
def test_default_job_reaches_readme_accuracy(tmp_path):
    """README command (a): the default flags reach >= 0.97 test accuracy on digits."""
    proc = run_recipe("train", f"--model_dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "metrics.json").read_text())["test_accuracy"] >= 0.97


# Refused as the flags are parsed, before TensorFlow loads (recipes/flagkit.py): each in well
# under a second, so all of them stay in the quick loop.
PARALLEL_UNSUPPORTED = "with --parallel={} is not supported: "


@pytest.mark.parametrize("args,line", [
    (["--dataset=imagenet"],
     "--dataset=imagenet: use one of digits, synthetic, image_dir, npz, tfrecord, tfds"),
    (["--batch_size=0"], "--batch_size=0: '0' is not a batch size: use a positive integer, e.g. "
     "64, or 'auto' to measure the fastest that fits"),
    (["--epochs=-1"], "--epochs=-1 is out of range: give an integer >= 1, e.g. --epochs=30"),
    (["--optimizer=adamax"], "--optimizer=adamax: use one of sgd, momentum, adam, adamw, rmsprop"),
    (["stray_argument"],
     "unexpected arguments 'stray_argument': every option is a --flag (see --helpshort)"),
    (["--host_allocator=jemalloc"], "--host_allocator=jemalloc: use one of pooled, malloc"),
    (["--data_ram_budget_mb=64"], "--data_ram_budget_mb=64 is tf.data autotune's RAM budget: add "
     "--data_autotune, or drop it"),
    (["--device_memory=rtx9090"], "device memory 'rtx9090' is neither a size (24GB, 24GiB, "
     "16000MB) nor a card (rtx3060, rtx3080, rtx3090, rtx4080, rtx4090, rtx5090, t4, v100-16gb, "
     "v100-32gb, a10, l4, a6000, l40s, a100-40gb, a100-80gb, h100-80gb, h200)"),
    (["--parallel=pipeline", "--micro_batches=5"], "--micro_batches=5 does not divide "
     "--batch_size=64: use a divisor of the batch (or another batch)"),
    (["--micro_batches=4"], "--micro_batches apply to --parallel=model|pipeline: add "
     "--parallel=pipeline (or model), or drop them"),
    (["--parallel=pipeline", "--strategy=mirrored"], "--strategy=mirrored "
     + PARALLEL_UNSUPPORTED.format("pipeline") + "the stages use the devices one process sees: "
     "drop --strategy"),
    (["--parallel=model", "--micro_batches=2"], "--micro_batches=2 "
     + PARALLEL_UNSUPPORTED.format("model") + "--parallel=model runs whole batches: use "
     "--parallel=pipeline"),
    (["--parallel=pipeline", "--grad_accum_steps=2"], "--grad_accum_steps=2 "
     + PARALLEL_UNSUPPORTED.format("pipeline") + "the pipeline already sums the gradients of "
     "--micro_batches: use those"),
    (["--parallel=model", "--jit_compile=true"], "--jit_compile=true "
     + PARALLEL_UNSUPPORTED.format("model") + "XLA would compile the whole step for one device: "
     "use --jit_compile=false"),
    (["--parallel=pipeline", "--stages=3", "--stage_boundaries=dense"], "--stage_boundaries "
     "names 1 boundaries (2 stages) but --stages=3: give one or the other"),
    (["--keras=keras4"], "--keras=keras4: use one of tf_keras, keras3"),
    (["--keras=keras3", "--strategy=multi_worker"], "--strategy=multi_worker needs a tf_keras "
     "model, and this one is a Keras 3 model: drop the flag, or pass --keras=tf_keras (see "
     "docs/keras3.md)"),
])
def test_bad_flag_one_line_before_tensorflow_no_files(tmp_path, args, line):
    model_dir = tmp_path / "run"
    check_flag_error("train", *args, f"--model_dir={model_dir}", "--epochs=1", line=line)
    assert not model_dir.exists()


# Found once TensorFlow has loaded (the model, the data, the devices): each starts a Python with
# TensorFlow (~10 s), so a few stay in the quick loop.
slow = pytest.mark.slow


@pytest.mark.parametrize("args,line", [
    (["--model=vgg99"], "unknown model 'vgg99': use one of mlp, cnn, resnet, mobilenet_v2, or "
     "give a .keras/.h5 file or a SavedModel directory"),
    (["--model=missing/model.keras"], "model file 'missing/model.keras' does not exist: give a "
     ".keras/.h5 file or a SavedModel directory, or one of mlp, cnn, resnet, mobilenet_v2"),
    pytest.param(["--model_fn=no_such_package.models:build"],
                 "--model_fn='no_such_package.models:build': cannot import "
                 "'no_such_package.models' (no module named 'no_such_package'): put the folder "
                 "holding it on PYTHONPATH, e.g. PYTHONPATH=/path/to/folder (the current folder "
                 "is not searched)", marks=slow),
    pytest.param(["--dataset=image_dir", "--data_dir=/no/such/folder"],
                 "image folder '/no/such/folder' does not exist: pass a folder with one "
                 "subfolder per class", marks=slow),
    pytest.param(["--dataset=npz"], "dataset 'npz' needs a file: pass --data_dir=/path/to/"
                 "data.npz holding x_train, y_train (and optionally x_val, y_val, x_test, y_test) "
                 "or x, y", marks=slow),
    pytest.param(["--parallel=pipeline", "--stages=3", "--cpu_devices=2"],
                 "stages=3 but only 2 device(s): use at most 2 stages, or more devices "
                 "(--cpu_devices=N on CPU)", marks=slow),
    pytest.param(["--parallel=pipeline", "--stages=12", "--cpu_devices=2"],
                 "stages=12 is more than the model's 9 layers: use at most one stage per layer",
                 marks=slow),
    pytest.param(["--parallel=pipeline", "--stage_boundaries=dense,nope", "--cpu_devices=2"],
                 "stage boundary 'nope' is not a layer of the model: use layer names, in order, "
                 "from: conv_1, pool, flatten, dropout, dense, dropout_1, logits, probabilities",
                 marks=slow),
])
def test_bad_input_one_line_no_traceback_no_files(tmp_path, args, line):
    model_dir = tmp_path / "run"
    proc = run_recipe("train", *args, f"--model_dir={model_dir}", "--epochs=1", timeout=180)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 2, proc.stderr
    # one line, no TensorFlow start-up lines either
    assert proc.stderr.splitlines() == [f"error: {line}"], proc.stderr
    assert not model_dir.exists()


@pytest.mark.slow
def test_plan_is_printed_logged_and_bounds_the_batch_size_search(tmp_path):
    """--plan shows the run's memory plan (stdout, TensorBoard text and chart, a PNG), and
    --batch_size=auto does not measure sizes the plan says exceed --device_memory."""
    model_dir = tmp_path / "run"
    # oneDNN's kernels, as on this CPU or not: TensorFlow's own (an AVX2-only CPU's) keep
    # 28 MB of convolution buffers whatever the batch, so no batch fits 4 MB there
    proc = run_recipe("train", "--batch_size=auto", "--device_memory=4MB", "--plan",
                      "--epochs=1", f"--model_dir={model_dir}",
                      env={"TF_ENABLE_ONEDNN_OPTS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line for line in proc.stdout.splitlines() if "does not fit (plan)" in line]
    assert rows and "| 32 |" in rows[0]  # 16 fits 4 MB (2.4 MB of model states), 32 does not
    assert "--batch_size=auto chose 16" in proc.stdout
    assert "memory plan:" in proc.stdout and "batch 16 per device" in proc.stdout
    assert "FITS" in proc.stdout
    logdir = str(model_dir / "logs" / "train")
    assert "| **total** |" in summaries.read_text_summaries(logdir)["memory/plan"]
    assert "memory/plan_chart" in summaries.read_image_tags(logdir)
    assert (model_dir / "memory_plan.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_a_keras3_model_file_trains_in_keras3(tmp_path):
    import keras as keras3

    path = tmp_path / "k3.keras"
    inputs = keras3.Input((8, 8, 1))
    keras3.Model(inputs, keras3.layers.Dense(10, activation="softmax")(
        keras3.layers.Flatten()(inputs))).save(path)
    proc = run_recipe("train", f"--model={path}", f"--model_dir={tmp_path / 'run'}",
                      "--epochs=2", "--learning_rate=0.01", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["keras"] == "keras3" and metrics["test_accuracy"] > 0.8
    assert flavour_of(load_model_file(str(tmp_path / "run" / "model.keras"))) == "keras3"


USER_MODELS = {"PYTHONPATH": os.path.dirname(os.path.abspath(__file__))}


@pytest.mark.parametrize("model_fn, expected", [
    ("with_custom_layer", "my_doubler (Doubler: a custom layer class)"),
    ("subclassed", "subclassed Classifier"),
])
def test_a_keras3_model_that_cannot_become_tf_keras_gets_one_line(tmp_path, model_fn, expected):
    proc = run_recipe("train", f"--model_fn=user_models_keras3:{model_fn}", "--keras=tf_keras",
                      f"--model_dir={tmp_path / 'run'}", env=USER_MODELS, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and expected in ours[0] and "cannot become a tf_keras" in ours[0], ours
    assert not (tmp_path / "run").exists()


PIPELINE_ON_TWO_CPUS = ("--parallel=pipeline", "--micro_batches=2", "--cpu_devices=2")


@pytest.mark.slow  # 21-31 s under load 8: TensorFlow, Keras 3 and the model load first
def test_a_keras3_model_the_pipeline_cannot_split_gets_its_one_line(tmp_path):
    """The recipe lets tfaccel.pipeline_parallel decide on a Keras 3 model: a custom layer is
    refused in the library's one line (what works instead), exit 2, before any training."""
    proc = run_recipe("train", "--model_fn=user_models_keras3:with_custom_layer",
                      "--keras=keras3", *PIPELINE_ON_TWO_CPUS, f"--model_dir={tmp_path / 'run'}",
                      env=USER_MODELS, timeout=300)
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        "error: the pipeline cannot split 'custom' at my_doubler (Doubler): tfaccel's stages "
        "rebuild standard Keras layers of a functional graph on their devices, not custom or "
        "subclassed ones; " + UNSPLITTABLE_ADVICE], proc.stderr[-3000:]
    assert "Epoch 1" not in proc.stdout and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_pipelines_a_keras3_functional_model_fn_and_exports_it_as_keras3(tmp_path):
    """--parallel=pipeline on a user's Keras 3 functional model (no --keras flag: its own
    Keras): trained as its verified tf_keras translation on two logical CPUs, split at the
    boundary named, and exported as Keras 3 with the trained weights."""
    model_dir = tmp_path / "run"
    proc = run_recipe("train", "--model_fn=user_models_keras3:residual_cnn",
                      *PIPELINE_ON_TWO_CPUS, "--stage_boundaries=flatten", "--epochs=2",
                      f"--model_dir={model_dir}", env=USER_MODELS, timeout=600)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["keras"] == "keras3" and metrics["parallel"] == "pipeline"
    stages = metrics["stages"]["stages"]
    assert [s["device"][-5:] for s in stages] == ["CPU:0", "CPU:1"]
    assert stages[1]["layers"][0] == "flatten"
    assert sum(s["parameters"] for s in stages) == metrics["parameters"]
    assert metrics["test_accuracy"] > 0.8  # chance: 0.1
    model = load_model_file(str(model_dir / "model.keras"), compile=True)
    assert flavour_of(model) == "keras3" and model.name == "residual_k3"
    from tfaccel.data import load_digits
    _, acc = model.evaluate(load_digits().test.batch(512), verbose=0)
    assert acc == pytest.approx(metrics["test_accuracy"], abs=1e-6)


# Flags each recipe shares through recipes/common.py, by help group; absl's own flags
# (--verbosity, --logtostderr, ...) belong in --helpfull only.
SHARED_GROUPS = {
    "train": {"data flags": "--dataset", "model flags": "--model_fn", "training flags": "--epochs",
              "distribution flags": "--strategy", "input pipeline flags": "--cache",
              "learning-rate schedule flags": "--lr_schedule",
              "performance flags": "--precision"},
    "prune": {"data flags": "--data_dir", "model flags": "--model",
              "training flags": "--learning_rate", "distribution flags": "--backup_dir",
              "input pipeline flags": "--standardize"},
    "optimize": {"data flags": "--image_size", "training flags": "--batch_size",
                 "distribution flags": "--scale_lr", "input pipeline flags": "--shuffle_buffer",
                 "learning-rate schedule flags": "--warmup_epochs"},
    "bench_input": {"data flags": "--on_bad_example", "input pipeline flags": "--shuffle_buffer",
                    "performance flags": "--host_allocator"},
    "train_lm": {"data flags": "--tokenizer", "model flags": "--gpt_size",
                 "training flags": "--clip_norm", "distribution flags": "--strategy",
                 "learning-rate schedule flags": "--lr_schedule",
                 "performance flags": "--recompute"},
}
RECIPE_NAMES = ("train", "prune", "optimize", "bench_input", "train_lm")
OWN_FLAG = {"train": "--diagnose_input", "prune": "--m_by_n", "optimize": "--variants",
            "bench_input": "--num_batches", "train_lm": "--tflite"}


@pytest.mark.parametrize("name", sorted(SHARED_GROUPS))
@pytest.mark.parametrize("help_flag", ["--helpshort", "--help"])
def test_help_lists_every_tfaccel_flag_grouped(name, help_flag):
    proc = run_recipe(name, help_flag, timeout=60)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    out = proc.stdout.replace("--[no]", "--")  # how absl shows a bool flag
    headers = [line[:-1] for line in out.splitlines() if line.endswith(":")
               and not line.startswith(" ")]
    own = next(h for h in headers if h.endswith(f"{name}.py"))
    sections = {h: out.split(f"\n{h}:\n", 1)[1].split("\n\n", 1)[0] for h in headers
                if f"\n{h}:\n" in out}
    assert OWN_FLAG[name] in sections[own]
    for group, flag in SHARED_GROUPS[name].items():
        assert f"  {flag}" in sections[group], (group, flag)
    assert "--verbosity" not in out and "--logtostderr" not in out  # absl's stay in --helpfull
    # Every flag the recipe reads is listed (none only in --helpfull).
    full = run_recipe(name, "--helpfull", timeout=60).stdout
    absl_modules = ("absl.", "tensorflow")
    listed = {line.split(":")[0].strip() for line in out.splitlines() if line.startswith("  --")}
    for module_block in full.split("\n\n"):
        title = module_block.strip().splitlines()[0] if module_block.strip() else ""
        if title.startswith(absl_modules):
            continue
        for line in module_block.splitlines():
            if line.startswith("  --"):
                assert line.split(":")[0].strip().replace("--[no]", "--") in listed, line


# --- Every recipe acts on each flag it accepts, and reads its input through one pipeline.

def _defined_flags(name):
    """The flags recipes/<name>.py defines (absl's own left out), from its definitions alone."""
    path = os.path.join(RECIPES, f"{name}.py")
    code = ("import json, runpy, sys\n"
            f"sys.path.insert(0, {RECIPES!r}); sys.argv = [{path!r}]\n"
            f"runpy.run_path(sys.argv[0], run_name={name!r})\n"
            "import flagkit; print(json.dumps(sorted(flagkit.flag_values())))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=dict(os.environ, PYTHONPATH=ROOT))
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout))


def _reads(tree):
    """Flags read (not assigned) as FLAGS.<name> or FLAGS["<name>"] in an AST."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, ast.Load) \
                and isinstance(node.value, ast.Name) and node.value.id == "FLAGS":
            key = node.attr if isinstance(node, ast.Attribute) else getattr(node.slice, "value", 0)
            names.add(key)
    return names


def _flags_acted_on(name):
    """Flags read by recipes/<name>.py and by the recipes/common.py (and lm_common.py,
    parallel_flags.py, fit_setup.py) functions it reaches.

    Reads inside check_* functions do not count: checking a flag is not acting on it (a
    --backup_dir only checked writable would still be ignored).
    """
    recipe = ast.parse(open(os.path.join(RECIPES, f"{name}.py")).read())
    functions = {}
    for module in ("common", "lm_common", "shared_flags", "parallel_flags", "fit_setup"):
        tree = ast.parse(open(os.path.join(RECIPES, f"{module}.py")).read())
        functions.update({(module, f.name): f for f in tree.body
                          if isinstance(f, ast.FunctionDef)})
        if module == "fit_setup":  # re-exported by common: recipes call common.<name>
            functions.update({("common", f.name): f for f in tree.body
                              if isinstance(f, ast.FunctionDef)})

    def called(tree, module=None):
        calls = [(n.value.id, n.attr) for n in ast.walk(tree) if isinstance(n, ast.Attribute)
                 and isinstance(n.value, ast.Name)
                 and n.value.id in ("common", "lm_common", "parallel_flags")]
        if module is not None:  # a module's own (or imported shared) functions, by name
            calls += [(m, n.id) for n in ast.walk(tree) if isinstance(n, ast.Name)
                      for m in (module, "shared_flags")]
        return calls

    reached, todo = set(), called(recipe)
    while todo:
        key = todo.pop()
        if key in functions and key not in reached and not key[1].startswith("check_"):
            reached.add(key)
            todo += called(functions[key], key[0])
    return _reads(recipe).union(*(_reads(functions[key]) for key in reached))


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_every_flag_a_recipe_accepts_is_acted_on(name):
    defined = _defined_flags(name)
    assert {"dataset", "model", "batch_size", "seed"} <= defined  # the shared ones are found
    assert not defined - _flags_acted_on(name), f"{name}.py accepts flags it ignores"


def test_the_flag_check_catches_an_ignored_flag():
    # optimize.py acts on --scale_lr through common.scaled_learning_rate; the closure sees it,
    # and a recipe that never reaches that function (bench_input) does not read it.
    assert "scale_lr" in _flags_acted_on("optimize")
    assert "scale_lr" not in _flags_acted_on("bench_input")
    assert {"backup_dir", "backup_freq"} <= _flags_acted_on("prune")
    assert not {"backup_dir", "backup_freq", "epochs"} & _flags_acted_on("bench_input")


@pytest.mark.parametrize("name", RECIPE_NAMES)
def test_every_recipe_reads_its_input_through_input_from_flags(name):
    source = open(os.path.join(RECIPES, f"{name}.py")).read()
    assert ("lm_common.lm_inputs(splits" if name == "train_lm"
            else "common.input_from_flags(splits") in source
    assert "batch_dataset" not in source and "build_splits" not in source


def test_trains_and_exports_a_subclassed_model_fn(tmp_path):
    # A subclassed model has no input_shape until called; the fit check calls it instead.
    model_dir = tmp_path / "run"
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    proc = run_recipe("train", "--model_fn=user_models:subclassed", "--epochs=3",
                      f"--model_dir={model_dir}", env={"PYTHONPATH": tests_dir})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["model"] == "subclassed" and metrics["test_accuracy"] > 0.25  # chance: 0.1
    assert (model_dir / "saved_model" / "saved_model.pb").exists()


@pytest.mark.slow
def test_pipeline_run_matches_the_unsplit_accuracy_and_logs_its_stages(tmp_path):
    """Issue #14: --parallel=pipeline on 2 logical CPUs, 4 micro-batches, the default job."""
    accuracy = {}
    for name, extra in (("unsplit", ["--cpu_devices=2", "--strategy=default"]),
                        ("pipeline", ["--parallel=pipeline", "--stages=2", "--micro_batches=4",
                                      "--cpu_devices=2"])):
        proc = run_recipe("train", *extra, f"--model_dir={tmp_path / name}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        metrics = json.loads((tmp_path / name / "metrics.json").read_text())
        accuracy[name] = metrics["test_accuracy"]
    assert abs(accuracy["pipeline"] - accuracy["unsplit"]) <= 0.01, accuracy
    stages = metrics["stages"]
    assert [s["device"][-5:] for s in stages["stages"]] == ["CPU:0", "CPU:1"]
    assert stages["micro_batches"] == 4 and stages["bubble_fraction"] == pytest.approx(0.2)
    assert sum(s["parameters"] for s in stages["stages"]) == metrics["parameters"]
    logs = tmp_path / "pipeline" / "logs" / "train"
    table = summaries.read_text_summaries(logs)["parallel/stages"]
    assert "| 1 | /device:CPU:1 |" in table and "bubble (K-1)/(M+K-1) = 0.200" in table
    assert table.splitlines()[0] in proc.stdout  # printed at the start as well
    # the exported model is the plain functional model, and scores what metrics.json says
    model = load_model_file(str(tmp_path / "pipeline" / "model.keras"), compile=True)
    from tfaccel.data import load_digits
    _, acc = model.evaluate(load_digits().test.batch(512), verbose=0)
    assert acc == pytest.approx(accuracy["pipeline"], abs=1e-6)


@pytest.mark.slow
def test_a_subclassed_model_cannot_be_split_one_line(tmp_path):
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    proc = run_recipe("train", "--model_fn=user_models:subclassed", "--parallel=pipeline",
                      "--cpu_devices=2", "--epochs=1", f"--model_dir={tmp_path / 'run'}",
                      env={"PYTHONPATH": tests_dir}, timeout=180)
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "is a subclassed" in proc.stderr and "functional or Sequential" in proc.stderr
    assert not (tmp_path / "run").exists()
