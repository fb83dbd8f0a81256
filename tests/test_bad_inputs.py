"""A sweep of bad inputs across every recipe and the `tfaccel` command (issue #11).

Each case runs the real command in a subprocess, in its own empty working folder
with its own --model_dir inside it, and must give: a non-zero exit (2), no
traceback, exactly one line on stderr, `error: ...`, naming the problem and a
fix (both checked by substring), and no file written anywhere (the working
folder stays empty, the inputs unchanged). Flag errors must also come before
TensorFlow is imported (a wrapper reports `sys.modules` at exit) and in under
3 s. Errors found after TensorFlow loads must not be preceded by its start-up
lines (TF_CPP_MIN_LOG_LEVEL is left unset, as users have it).
"""

import concurrent.futures
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import RECIPES, ROOT

PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
if not os.path.exists(PYTHON):
    PYTHON = sys.executable
FLAG_ERROR_SECONDS = 3.0
TF_MARKER = "tensorflow-imported:"

# A recipe run through this wrapper prints, on stdout at exit, whether TensorFlow was imported.
_WRAPPER = textwrap.dedent(f"""
    import atexit, runpy, sys
    atexit.register(lambda: print("{TF_MARKER}", "tensorflow" in sys.modules, file=sys.__stdout__))
    target, sys.argv = sys.argv[1], sys.argv[1:]
    if target == "cli":
        from tfaccel.cli import main
        sys.exit(main(sys.argv[1:]))
    sys.path.insert(0, {RECIPES!r})
    runpy.run_path(target, run_name="__main__")
""")

USER_MODELS = textwrap.dedent("""
    import tf_keras as keras


    def raises(input_shape, num_classes):
        raise RuntimeError("layer sizes do not add up")


    def wrong_signature(shape):
        return None


    class Tiny(keras.Model):
        def __init__(self, num_classes):
            super().__init__()
            self.flat = keras.layers.Flatten()
            self.out = keras.layers.Dense(num_classes, activation="softmax")

        def call(self, x):
            return self.out(self.flat(x))


    def subclassed(input_shape, num_classes):
        return Tiny(num_classes)
""")


def _make_inputs(root):
    """Files the cases point at (read-only inputs; the sweep checks they stay unchanged)."""
    os.makedirs(root)
    with open(os.path.join(root, "usermodels.py"), "w") as f:
        f.write(USER_MODELS)
    np.savez(os.path.join(root, "string_labels.npz"), x=np.zeros((40, 8, 8), np.uint8),
             y=np.array(["cat", "dog"] * 20))
    np.savez(os.path.join(root, "data.npz"), x=np.zeros((40, 8, 8), np.uint8),
             y=np.array([0, 1] * 20))
    os.makedirs(os.path.join(root, "npz_folder"))
    for name in ("cats", "dogs"):
        os.makedirs(os.path.join(root, "images", name))
        with open(os.path.join(root, "images", name, f"{name}.png"), "wb") as f:
            f.write(b"\x89PNG\r\n\x1a\n" + b"\0" * 64 + b"IEND\xaeB`\x82")
    with open(os.path.join(root, "images", "cats", "notes.txt"), "w") as f:
        f.write("not an image\n")
    with open(os.path.join(root, "a_file"), "w") as f:
        f.write("a regular file\n")
    with open(os.path.join(root, "not_a_model.keras"), "w") as f:
        f.write("not a model\n")


def _snapshot(root):
    return sorted((os.path.relpath(os.path.join(d, n), root), os.path.getsize(os.path.join(d, n)))
                  for d, dirs, names in os.walk(root) for n in names + dirs)


# --- Ways to make a folder that root cannot write to (root ignores file modes).

def _ro_bind_prefix(folder):
    """Runs the command in a private mount namespace where `folder` is a read-only bind."""
    return ["unshare", "-m", "sh", "-c", f'mount --bind -o ro "{folder}" "{folder}" && exec "$@"',
            "sh"]


def _no_dac_prefix():
    """Runs the command without CAP_DAC_OVERRIDE, so that file modes apply to root too."""
    return ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
            "--bounding-set=-dac_override,-dac_read_search"]


def _works(prefix, folder):
    probe = os.path.join(folder, "probe")
    proc = subprocess.run([*prefix, "touch", probe], capture_output=True, check=False)
    made = os.path.exists(probe)
    if made:
        os.remove(probe)
    return proc.returncode != 0 and not made


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("bad_inputs") / "inputs")
    _make_inputs(root)
    read_only = os.path.join(root, "read_only")
    os.makedirs(os.path.join(read_only, "existing"))
    ro_bind = _ro_bind_prefix(read_only) if shutil.which("unshare") else None
    if ro_bind and not _works(ro_bind, read_only):
        ro_bind = None
    locked = os.path.join(root, "locked")  # mode 555, for a process without CAP_DAC_OVERRIDE
    os.makedirs(locked)
    os.chmod(locked, 0o555)
    no_dac = _no_dac_prefix() if shutil.which("setpriv") else None
    if no_dac and os.geteuid() == 0 and not _works(no_dac, locked):
        no_dac = None
    if os.geteuid() != 0:
        no_dac = []  # an ordinary user is refused by the mode alone
    yield {"root": root, "ro_bind": ro_bind, "no_dac": no_dac,
           "snapshot": _snapshot(root)}
    os.chmod(locked, 0o755)


# (id, command, args, problem, fix); command is a recipe name or "cli". {in} is the inputs
# folder, {cwd} the case's own working folder. A run gets --model_dir={cwd}/run unless its
# args name one.
FLAG_CASES = [
    ("epochs_not_int", "train", ["--epochs=x"], "--epochs=x: not an integer", "e.g. --epochs="),
    ("epochs_zero", "train", ["--epochs=0"], "--epochs=0", "give an integer >= 1"),
    ("misspelt_flag", "train", ["--epoch=3"], "unknown flag --epoch", "did you mean --epochs"),
    ("unknown_flag", "train", ["--colour=red"], "unknown flag --colour", "--helpshort"),
    ("lr_nan", "train", ["--learning_rate=nan"], "--learning_rate=nan is not a finite number",
     "e.g. --learning_rate="),
    ("lr_inf", "train", ["--learning_rate=inf"], "--learning_rate=inf is not a finite number",
     "give a number"),
    ("lr_zero", "train", ["--learning_rate=0"], "a learning rate must be > 0",
     "e.g. --learning_rate="),
    ("lr_negative", "train", ["--learning_rate=-0.1"], "--learning_rate=-0.1",
     "e.g. --learning_rate="),
    ("unknown_dataset", "train", ["--dataset=mnist"], "--dataset=mnist", "use one of digits"),
    ("unknown_precision", "train", ["--precision=fp8"], "unknown precision 'fp8'",
     "use one of float32"),
    ("bad_jit", "train", ["--jit_compile=maybe"], "unknown jit_compile 'maybe'", "use one of"),
    ("unknown_strategy", "train", ["--strategy=horovod"], "unknown strategy 'horovod'",
     "use one of"),
    ("unknown_schedule", "train", ["--lr_schedule=triangle"],
     "unknown learning-rate schedule 'triangle'", "use one of constant"),
    ("image_size_letters", "train", ["--image_size=a,b"], "--image_size=a,b",
     "e.g. --image_size=64,64"),
    ("image_size_one_value", "train", ["--image_size=64"], "--image_size=64 must be height,width",
     "e.g. --image_size=64,64"),
    ("synthetic_shape_zero", "train", ["--synthetic_shape=8,0,1"], "--synthetic_shape=8,0,1",
     "e.g. --synthetic_shape=8,8,1"),
    ("batch_size_text", "train", ["--batch_size=abc"], "'abc' is not a batch size",
     "use a positive integer"),
    ("missing_flagfile", "train", ["--flagfile={in}/missing.cfg"], "cannot open --flagfile=",
     "give an existing flag file"),
    ("bool_not_bool", "train", ["--random_flip=maybe"], "--random_flip=maybe: not true or false",
     "give true or false"),
    ("stray_argument", "train", ["stray"], "unexpected arguments 'stray'", "--flag"),
    ("warmup_nan", "train", ["--warmup_epochs=nan"], "--warmup_epochs=nan", "give a number"),
    ("unknown_optimizer", "train", ["--optimizer=adamax"], "--optimizer=adamax",
     "use one of sgd"),
    ("unknown_host_allocator", "train", ["--host_allocator=jemalloc"],
     "--host_allocator=jemalloc", "use one of pooled"),
    ("missing_value", "train", ["--epochs"], "flag --epochs needs a value", "--epochs=VALUE"),
    ("model_dir_is_file", "train", ["--model_dir={in}/a_file"], "is a file, not a folder",
     "give a folder path"),
    ("model_dir_under_file", "train", ["--model_dir={in}/a_file/run"],
     "a_file is a file, not a folder", "whose parents are folders"),
    ("m_by_n_reversed", "prune", ["--m_by_n=4,2"],
     "--m_by_n=4,2 must be m,n: integers with 0 < m < n", "e.g. --m_by_n=2,4"),
    ("m_by_n_letters", "prune", ["--m_by_n=a,b"], "--m_by_n=a,b", "e.g. --m_by_n=2,4"),
    ("block_size_one_value", "prune", ["--block_size=2"], "--block_size=2 must be rows,cols",
     "e.g. --block_size=1,1"),
    ("sparsity_nan", "prune", ["--sparsity=nan"], "--sparsity=nan is not a finite number",
     "e.g. --sparsity=0.8"),
    ("prune_lr_nan", "prune", ["--prune_learning_rate=nan"], "--prune_learning_rate=nan",
     "give a number"),
    ("prune_lr_zero", "prune", ["--prune_learning_rate=0"], "a learning rate must be > 0",
     "e.g. --prune_learning_rate="),
    ("prune_precision", "prune", ["--precision=fp16"], "unknown precision 'fp16'", "use one of"),
    ("backup_dir_under_file", "train", ["--backup_dir={in}/a_file/backup"],
     "a_file is a file, not a folder", "whose parents are folders"),
    ("backup_dir_is_file", "prune", ["--backup_dir={in}/a_file"], "--backup_dir=",
     "give a folder path"),
    ("qat_lr_inf", "optimize", ["--qat_learning_rate=inf"], "--qat_learning_rate=inf",
     "give a number"),
    ("prune_block_one_value", "optimize", ["--prune_block_size=16"],
     "--prune_block_size=16 must be rows,cols", "e.g. --prune_block_size=16,1"),
    ("optimize_sparsity_inf", "optimize", ["--sparsity=inf"], "--sparsity=inf", "give a number"),
    ("optimize_unknown_flag", "optimize", ["--variant=int8"], "unknown flag --variant",
     "did you mean --variants"),
    ("optimize_unknown_variant", "optimize", ["--variants=float,int4"], "unknown int4",
     "choose from float"),
    # No recipe drives parameter servers; each says so before TensorFlow loads (issue #12).
    *[(f"{name}_parameter_server", name, ["--strategy=parameter_server"],
       f"--strategy=parameter_server needs parameter-server and coordinator tasks that "
       f"recipes/{name}.py does not run", "use --strategy=multi_worker")
      for name in ("train", "prune", "optimize")],
    # No recipe accepts a flag it would ignore: optimize keeps no backup, bench_input no epochs.
    ("optimize_backup_dir", "optimize", ["--backup_dir={cwd}/backup"], "unknown flag --backup_dir",
     "--helpshort"),
    ("optimize_backup_freq", "optimize", ["--backup_freq=10"], "unknown flag --backup_freq",
     "--helpshort"),
    ("bench_epochs", "bench_input", ["--epochs=3"], "unknown flag --epochs", "--helpshort"),
    # The input pipeline flags are every recipe's, checked alike.
    *[(f"{name}_ram_budget_without_autotune", name, ["--data_ram_budget_mb=64"],
       "--data_ram_budget_mb=64 is tf.data autotune's RAM budget", "add --data_autotune")
      for name in ("train", "prune", "optimize", "bench_input")],
    ("prune_unknown_schedule", "prune", ["--pruning_schedule=cubic"],
     "unknown pruning schedule 'cubic'", "use one of polynomial, constant"),
    ("prune_unknown_pooling", "prune", ["--block_pooling=MIN"], "unknown block pooling 'MIN'",
     "use one of AVG, MAX"),
    ("prune_unknown_policy", "prune", ["--pruning_policy=tpu"], "unknown pruning policy 'tpu'",
     "use one of xnnpack"),
    ("bench_batches_zero", "bench_input", ["--num_batches=0"], "--num_batches=0",
     "give an integer >= 1"),
    ("bench_repeats_text", "bench_input", ["--repeats=x"], "--repeats=x: not an integer",
     "e.g. --repeats=3"),
    ("bench_model_dir_is_file", "bench_input", ["--model_dir={in}/a_file"],
     "is a file, not a folder", "give a folder path"),
    ("cli_unknown_command", "cli", ["bogus"], "invalid choice: 'bogus'", "see tfaccel --help"),
    ("cli_no_command", "cli", [], "required: command", "see tfaccel --help"),
    ("cli_doctor_bad_option", "cli", ["doctor", "--verbose"], "unrecognized arguments: --verbose",
     "see tfaccel --help"),
]

# Output folders root cannot write: need a read-only bind or a dropped capability.
DIR_CASES = [
    ("model_dir_read_only", "train", ["--model_dir={in}/read_only/existing"], "ro_bind",
     "Read-only file system", "give a folder you can write to"),
    ("model_dir_read_only_parent", "optimize", ["--model_dir={in}/read_only/new"], "ro_bind",
     "cannot write to", "give a folder you can write to"),
    ("model_dir_locked_parent", "bench_input", ["--model_dir={in}/locked/run"], "no_dac",
     "Permission denied", "give a folder you can write to"),
    ("model_dir_locked", "prune", ["--model_dir={in}/locked"], "no_dac", "Permission denied",
     "give a folder you can write to"),
]

# Found once TensorFlow is loaded (files, data, models): ~5-10 s each (more on a busy machine),
# run three at a time; the fast suite keeps four of them.
LATE_CASES = [
    ("npz_without_data_dir", "train", ["--dataset=npz"], "dataset 'npz' needs a file",
     "pass --data_dir=/path/to/data.npz"),
    ("npz_string_labels", "train", ["--dataset=npz", "--data_dir={in}/string_labels.npz"],
     "labels such as 'cat'", "map them to integers"),
    ("cache_in_missing_folder", "train", ["--cache=/nonexistent_dir/cache"],
     "folder /nonexistent_dir does not exist", "or --cache=memory"),
    ("model_fn_raises", "train", ["--model_fn=usermodels:raises"],
     "your function raises(", "fix that function"),
]
SLOW_LATE_CASES = [
    ("npz_given_a_folder", "train", ["--dataset=npz", "--data_dir={in}/npz_folder"],
     "is a folder, not a file", "pass --data_dir=/path/to/data.npz"),
    ("image_dir_given_npz", "train", ["--dataset=image_dir", "--data_dir={in}/data.npz"],
     "is a file, not a folder", "read by --dataset=npz"),
    ("model_fn_wrong_signature", "train", ["--model_fn=usermodels:wrong_signature"],
     "cannot be called as wrong_signature(input_shape=..., num_classes=...)",
     "define it as def wrong_signature(input_shape, num_classes)"),
    ("image_dir_with_text_file", "train", ["--dataset=image_dir", "--data_dir={in}/images"],
     "notes.txt: not an image", "names starting with '.' are ignored"),
    ("model_fn_not_importable", "train", ["--model_fn=no_such_module:build"],
     "cannot import 'no_such_module'", "PYTHONPATH"),
    ("prune_subclassed_model", "prune", ["--model_fn=usermodels:subclassed", "--epochs=1"],
     "subclassed", "functional"),
    ("model_file_not_a_model", "train", ["--model={in}/not_a_model.keras"], "cannot load model",
     "give a .keras/.h5 file"),
    ("missing_model_file", "prune", ["--model={in}/missing.keras"], "does not exist",
     "give a .keras/.h5 file"),
    ("bench_cache_in_missing_folder", "bench_input", ["--cache=/nonexistent_dir/c"],
     "folder /nonexistent_dir does not exist", "or --cache=memory"),
    *[(f"{name}_cache_in_missing_folder", name, ["--cache=/nonexistent_dir/c"],
       "folder /nonexistent_dir does not exist", "or --cache=memory")
      for name in ("prune", "optimize")],
]


def _run_case(case, inputs, workdir, prefix=()):
    name, command, args = case[:3]
    cwd = os.path.join(workdir, name)
    os.makedirs(cwd)
    args = [a.format(**{"in": inputs["root"], "cwd": cwd}) for a in args]
    if command != "cli" and not any(a.startswith("--model_dir=") for a in args):
        args.append(f"--model_dir={cwd}/run")
    target = "cli" if command == "cli" else os.path.join(RECIPES, f"{command}.py")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, inputs["root"]])
    start = time.perf_counter()
    proc = subprocess.run([*prefix, PYTHON, "-c", _WRAPPER, target, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    return proc, time.perf_counter() - start, cwd


def _problems(case, proc, cwd, inputs):
    """What is wrong with one case's outcome (empty when it behaved)."""
    problem, fix = case[-2:]
    found = []
    lines = proc.stderr.splitlines()
    if proc.returncode != 2:
        found.append(f"exit code {proc.returncode}, not 2")
    if "Traceback" in proc.stderr:
        found.append("a traceback")
    if len(lines) != 1 or not lines[0].startswith("error: "):
        found.append(f"{len(lines)} stderr lines, not one 'error:' line")
    elif problem not in lines[0] or fix not in lines[0]:
        found.append(f"the line lacks {problem!r} or {fix!r}")
    if os.listdir(cwd):
        found.append(f"wrote {os.listdir(cwd)} in its working folder")
    if _snapshot(inputs["root"]) != inputs["snapshot"]:
        found.append("changed the inputs folder")
    return [f"{case[0]}: {p}\n  stderr: {proc.stderr.strip()[-1500:]}" for p in found]


@pytest.mark.parametrize("case", FLAG_CASES, ids=[c[0] for c in FLAG_CASES])
def test_flag_error_is_one_line_fast_and_before_tensorflow(case, inputs, tmp_path):
    proc, seconds, cwd = _run_case(case, inputs, str(tmp_path))
    assert not _problems(case, proc, cwd, inputs), _problems(case, proc, cwd, inputs)
    assert f"{TF_MARKER} False" in proc.stdout, proc.stdout  # TensorFlow never imported
    assert seconds < FLAG_ERROR_SECONDS, f"{case[0]} took {seconds:.1f} s"


@pytest.mark.parametrize("case", DIR_CASES, ids=[c[0] for c in DIR_CASES])
def test_unwritable_model_dir_is_one_line_before_tensorflow(case, inputs, tmp_path):
    prefix = inputs[case[3]]
    if prefix is None:
        pytest.skip(f"no way to make a folder root cannot write here ({case[3]})")
    proc, seconds, cwd = _run_case(case, inputs, str(tmp_path), prefix=prefix)
    assert not _problems(case, proc, cwd, inputs), _problems(case, proc, cwd, inputs)
    assert f"{TF_MARKER} False" in proc.stdout, proc.stdout
    assert seconds < FLAG_ERROR_SECONDS, f"{case[0]} took {seconds:.1f} s"


def _sweep(cases, inputs, workdir):
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda c: (c, *_run_case(c, inputs, workdir)), cases))
    problems = [p for case, proc, _, cwd in results for p in _problems(case, proc, cwd, inputs)]
    assert not problems, "\n".join(problems)
    return results


@pytest.mark.slow
def test_errors_found_after_tensorflow_loads_are_one_line(inputs, tmp_path):
    for case, proc, _, _ in _sweep(LATE_CASES, inputs, str(tmp_path)):
        assert f"{TF_MARKER} True" in proc.stdout, case[0]  # these do load TensorFlow ...
        # ... and none of its start-up lines came through (checked by the one-line rule).


@pytest.mark.slow
def test_more_errors_found_after_tensorflow_loads_are_one_line(inputs, tmp_path):
    _sweep(SLOW_LATE_CASES, inputs, str(tmp_path))


def test_the_sweep_covers_every_recipe_and_the_cli():
    cases = FLAG_CASES + DIR_CASES + LATE_CASES + SLOW_LATE_CASES
    assert len(cases) >= 40
    assert {c[1] for c in cases} == {"train", "prune", "optimize", "bench_input", "cli"}
