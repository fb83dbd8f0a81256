"""A sweep of bad inputs across every recipe and the `tfaccel` command (issues #11, #26).

Each case runs the real command in a subprocess, in its own empty working folder
with its own --model_dir inside it, and must give: a non-zero exit (2), no
traceback, exactly one line on stderr, `error: ...`, and no file written anywhere
(the working folder stays empty, the inputs unchanged). A flag error's line is
checked whole; it must come before TensorFlow is imported (a wrapper reports
`sys.modules` at exit) and within `conftest.FLAG_ERROR_CPU_SECONDS` of CPU. The other lines
are checked for the problem and the fix they name. Errors found after TensorFlow loads must
not be preceded by its start-up lines (TF_CPP_MIN_LOG_LEVEL is left unset, as users have it).
"""

import concurrent.futures
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from absl import flags
from conftest import FLAG_ERROR_CPU_SECONDS, RECIPES, ROOT, run_with_cpu_seconds

PYTHON = os.path.join(ROOT, ".venv", "bin", "python")
if not os.path.exists(PYTHON):
    PYTHON = sys.executable
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


# The lines of the flag errors absl finds while it parses (recipes/flagkit.py,
# recipes/flag_errors.py), each written by us, not by absl.
HELP = "(--helpshort lists every flag of this recipe)"
PRESETS = "give an existing flag file, e.g. one in recipes/presets/"
CACHE_FIX = ("pass a prefix in an existing folder you can write to (e.g. "
             "--cache=/tmp/train_cache), or --cache=memory")
NO_CPU_DEVICES = ("cpu_devices=0 must be at least 1 (1 keeps the CPU whole, 2 or more split it "
                  "into logical devices for mirrored training)")

# (id, command, args, the exact stderr line after 'error: '); command is a recipe name or
# "cli". {in} is the inputs folder, {cwd} the case's own working folder. A run gets
# --model_dir={cwd}/run unless its args name one.
FLAG_CASES = [
    ("epochs_not_int", "train", ["--epochs=x"],
     "--epochs=x: not an integer: give an integer >= 1, e.g. --epochs=30"),
    ("epochs_zero", "train", ["--epochs=0"],
     "--epochs=0 is out of range: give an integer >= 1, e.g. --epochs=30"),
    ("misspelt_flag", "train", ["--epoch=3"],
     f"unknown flag --epoch: did you mean --epochs? {HELP}"),
    ("unknown_flag", "train", ["--colour=red"],
     "unknown flag --colour: --helpshort lists every flag of this recipe"),
    ("lr_nan", "train", ["--learning_rate=nan"],
     "--learning_rate=nan is not a finite number: give a number, e.g. --learning_rate=0.001"),
    ("lr_inf", "train", ["--learning_rate=inf"],
     "--learning_rate=inf is not a finite number: give a number, e.g. --learning_rate=0.001"),
    ("lr_zero", "train", ["--learning_rate=0"],
     "--learning_rate=0: a learning rate must be > 0, e.g. --learning_rate=0.001"),
    ("lr_negative", "train", ["--learning_rate=-0.1"],
     "--learning_rate=-0.1: a learning rate must be > 0, e.g. --learning_rate=0.001"),
    ("unknown_dataset", "train", ["--dataset=mnist"],
     "--dataset=mnist: use one of digits, synthetic, image_dir, npz, tfrecord, tfds"),
    ("unknown_precision", "train", ["--precision=fp8"],
     "--precision=fp8: use one of float32, mixed_float16, mixed_bfloat16, auto"),
    ("bad_jit", "train", ["--jit_compile=maybe"],
     "--jit_compile=maybe: use one of false, true, auto"),
    ("unknown_strategy", "train", ["--strategy=horovod"], "unknown strategy 'horovod': use one of "
     "auto, default, one_device, mirrored, multi_worker, tpu"),
    ("unknown_schedule", "train", ["--lr_schedule=triangle"],
     "--lr_schedule=triangle: use one of constant, step, piecewise, exponential, polynomial, "
     "cosine, cosine_restarts, one_cycle, epoch_exponential"),
    ("image_size_letters", "train", ["--image_size=a,b"],
     "--image_size=a,b must be height,width: two positive integers, e.g. --image_size=64,64"),
    ("image_size_one_value", "train", ["--image_size=64"],
     "--image_size=64 must be height,width: two positive integers, e.g. --image_size=64,64"),
    ("synthetic_shape_zero", "train", ["--synthetic_shape=8,0,1"],
     "--synthetic_shape=8,0,1 must be comma-separated positive sizes, e.g. "
     "--synthetic_shape=8,8,1"),
    ("batch_size_text", "train", ["--batch_size=abc"],
     "--batch_size=abc: 'abc' is not a batch size: use a positive integer, e.g. 64, or 'auto' to "
     "measure the fastest that fits"),
    ("missing_flagfile", "train", ["--flagfile={in}/missing.cfg"],
     f"cannot open --flagfile={{in}}/missing.cfg (No such file or directory): {PRESETS}"),
    ("flagfile_without_value", "train", ["--model_dir={cwd}/run", "--flagfile"],
     "flag --flagfile needs a value: write --flagfile=VALUE"),
    ("bool_not_bool", "train", ["--random_flip=maybe"],
     "--random_flip=maybe: not true or false: give true or false, e.g. --random_flip=false"),
    ("negated_bool_with_value", "train", ["--norandom_flip=1"],
     "--norandom_flip takes no value: write --norandom_flip, or --random_flip=false"),
    ("stray_argument", "train", ["stray"],
     "unexpected arguments 'stray': every option is a --flag (see --helpshort)"),
    ("warmup_nan", "train", ["--warmup_epochs=nan"],
     "--warmup_epochs=nan is not a finite number: give a number, e.g. --warmup_epochs=0"),
    ("unknown_optimizer", "train", ["--optimizer=adamax"],
     "--optimizer=adamax: use one of sgd, momentum, adam, adamw, rmsprop"),
    ("unknown_host_allocator", "train", ["--host_allocator=jemalloc"],
     "--host_allocator=jemalloc: use one of pooled, malloc"),
    ("missing_value", "train", ["--model_dir={cwd}/run", "--epochs"],
     "flag --epochs needs a value: write --epochs=VALUE"),
    ("value_is_next_flag", "train", ["--epochs", "--model_dir={cwd}/run"],
     "flag --epochs needs a value (it took '--model_dir={cwd}/run' as one): write --epochs=VALUE"),
    ("model_dir_is_file", "train", ["--model_dir={in}/a_file"], "--model_dir={in}/a_file is a "
     "file, not a folder: give a folder path (it is created if missing)"),
    ("model_dir_under_file", "train", ["--model_dir={in}/a_file/run"], "--model_dir={in}/a_file/"
     "run: {in}/a_file is a file, not a folder: give a path whose parents are folders"),
    # Checked when the flags are parsed (issue #26), by the rules the tfaccel helpers apply.
    ("cpu_devices_zero", "train", ["--cpu_devices=0"], NO_CPU_DEVICES),
    ("grad_accum_zero", "train", ["--grad_accum_steps=0"],
     "grad_accum_steps=0 must be an integer >= 1 (1 means no accumulation)"),
    ("grad_accum_does_not_split_batch", "train", ["--batch_size=65", "--grad_accum_steps=2"],
     "batch_size=65 does not split into grad_accum_steps=2 micro-batches: use a batch size that "
     "is a multiple of 2"),
    ("backup_freq_hourly", "train", ["--backup_freq=hourly"], "backup_freq='hourly' must be "
     "'epoch', a positive number of steps (e.g. 50) or of seconds between epoch-end backups "
     "(e.g. 60s)"),
    ("gpu_memory_limit_zero", "train", ["--gpu_memory_limit=0"],
     "GPU memory limit 0 MB must be positive (or unset for no limit)"),
    ("gpu_growth_and_limit", "train", ["--memory_growth", "--gpu_memory_limit=512"],
     "memory growth and a memory limit (512 MB) cannot be combined: choose growth (allocate on "
     "demand) or a limit (fixed cap)"),
    ("cache_in_missing_folder", "train", ["--cache=/nonexistent_dir/cache"],
     f"cache='/nonexistent_dir/cache': folder /nonexistent_dir does not exist: {CACHE_FIX}"),
    ("lr_boundaries_not_numbers", "train", ["--lr_schedule=piecewise", "--lr_boundaries=a"],
     "--lr_boundaries=a must be comma-separated numbers"),
    ("piecewise_without_multipliers", "train", ["--lr_schedule=piecewise", "--lr_boundaries=5"],
     "piecewise schedule: 1 boundaries need 2 multipliers, got 0"),
    ("warmup_as_long_as_training", "train", ["--warmup_epochs=3", "--epochs=2"],
     "warmup of 3.0 epochs is not shorter than training (2 epochs): use --warmup_epochs below "
     "--epochs"),
    ("decay_epochs_zero", "train", ["--lr_schedule=step", "--decay_epochs=0"],
     "decay_epochs=0.0 must be > 0"),
    ("search_below_its_start", "train", ["--batch_size=auto", "--max_batch_size=8"],
     "--max_batch_size=8 is below the smallest size --batch_size=auto tries (16): give "
     "--max_batch_size>=16, or a --batch_size"),
    ("monitor_period_negative", "train", ["--monitor_every_n_steps=-1"],
     "--monitor_every_n_steps=-1 is out of range: give an integer >= 0, e.g. "
     "--monitor_every_n_steps=50"),
    ("keras3_multi_worker", "train", ["--keras=keras3", "--strategy=multi_worker"],
     "--strategy=multi_worker needs a tf_keras model, and this one is a Keras 3 model: drop the "
     "flag, or pass --keras=tf_keras (see docs/keras3.md)"),
    ("micro_batches_without_parallel", "train", ["--micro_batches=4"],
     "--micro_batches apply to --parallel=model|pipeline: add --parallel=pipeline (or model), or "
     "drop them"),
    ("micro_batches_do_not_divide", "train", ["--parallel=pipeline", "--micro_batches=5"],
     "--micro_batches=5 does not divide --batch_size=64: use a divisor of the batch (or another "
     "batch)"),
    ("pipeline_with_mirrored", "train", ["--parallel=pipeline", "--strategy=mirrored"],
     "--strategy=mirrored with --parallel=pipeline is not supported: the stages use the devices "
     "one process sees: drop --strategy"),
    ("m_by_n_reversed", "prune", ["--m_by_n=4,2"], "--m_by_n=4,2 must be m,n: integers with 0 < m "
     "< n (at least m zeros in every n consecutive weights), e.g. --m_by_n=2,4"),
    ("m_by_n_letters", "prune", ["--m_by_n=a,b"], "--m_by_n=a,b must be m,n: integers with 0 < m "
     "< n (at least m zeros in every n consecutive weights), e.g. --m_by_n=2,4"),
    ("m_by_n_with_blocks", "prune", ["--m_by_n=2,4", "--block_size=2,2"],
     "m_by_n and block_size cannot be combined: pick one pattern"),
    ("block_size_one_value", "prune", ["--block_size=2"],
     "--block_size=2 must be rows,cols: two positive integers, e.g. --block_size=1,1"),
    ("sparsity_above_one", "prune", ["--sparsity=1.5"],
     "--sparsity=1.5 must be in [0, 1), e.g. 0.8 for 80% zeros"),
    ("sparsity_one", "prune", ["--sparsity=1.0"],
     "--sparsity=1.0 must be in [0, 1), e.g. 0.8 for 80% zeros"),
    ("sparsity_nan", "prune", ["--sparsity=nan"],
     "--sparsity=nan must be in [0, 1), e.g. 0.8 for 80% zeros"),
    ("pruning_begins_after_the_end", "prune", ["--begin_epoch=20"],
     "begin_epoch=20 must be in [0, epochs=20): pruning must start during the fine-tuning"),
    ("pruning_ends_before_it_begins", "prune", ["--begin_epoch=2", "--end_epoch=1"],
     "end_epoch=1 is before begin_epoch=2: pruning must end after it begins"),
    ("pruning_ends_after_the_last_epoch", "prune", ["--end_epoch=25"], "end_epoch=25 is after the "
     "last epoch (20): the target would never be reached; lower it or add epochs"),
    ("pruning_frequency_zero", "prune", ["--pruning_frequency=0"],
     "frequency=0 must be a positive number of steps"),
    ("prune_lr_nan", "prune", ["--prune_learning_rate=nan"], "--prune_learning_rate=nan is not a "
     "finite number: give a number, e.g. --prune_learning_rate=0.001"),
    ("prune_lr_zero", "prune", ["--prune_learning_rate=0"],
     "--prune_learning_rate=0: a learning rate must be > 0, e.g. --prune_learning_rate=0.001"),
    ("prune_lr_negative", "prune", ["--prune_learning_rate=-1"],
     "--prune_learning_rate=-1: a learning rate must be > 0, e.g. --prune_learning_rate=0.001"),
    ("prune_precision", "prune", ["--precision=fp16"],
     "--precision=fp16: use one of float32, mixed_float16, mixed_bfloat16"),
    ("prune_cpu_devices_zero", "prune", ["--cpu_devices=0"], NO_CPU_DEVICES),
    ("backup_dir_under_file", "train", ["--backup_dir={in}/a_file/backup"], "--backup_dir={in}/"
     "a_file/backup: {in}/a_file is a file, not a folder: give a path whose parents are folders"),
    ("backup_dir_is_file", "prune", ["--backup_dir={in}/a_file"], "--backup_dir={in}/a_file is a "
     "file, not a folder: give a folder path (it is created if missing)"),
    ("qat_lr_inf", "optimize", ["--qat_learning_rate=inf"], "--qat_learning_rate=inf is not a "
     "finite number: give a number, e.g. --qat_learning_rate=0.001"),
    ("prune_block_one_value", "optimize", ["--prune_block_size=16"],
     "--prune_block_size=16 must be rows,cols: two positive integers, e.g. "
     "--prune_block_size=16,1"),
    ("optimize_sparsity_inf", "optimize", ["--sparsity=inf"],
     "--sparsity=inf must be in [0, 1), e.g. 0.8 for 80% zeros"),
    ("optimize_sparsity_above_one", "optimize", ["--sparsity=1.5"],
     "--sparsity=1.5 must be in [0, 1), e.g. 0.8 for 80% zeros"),
    ("optimize_unknown_flag", "optimize", ["--variant=int8"],
     f"unknown flag --variant: did you mean --variants? {HELP}"),
    ("optimize_unknown_variant", "optimize", ["--variants=float,int4"],
     "--variants=float,int4: unknown int4; choose from float, dynamic, int8, float16, int16x8, "
     "qat_int8, pruned_qat_int8, keras3_int8, keras3_int4, keras3_int4_per_channel"),
    # No recipe drives parameter servers; each says so before TensorFlow loads (issue #12).
    *[(f"{name}_parameter_server", name, ["--strategy=parameter_server"],
       f"--strategy=parameter_server needs parameter-server and coordinator tasks that "
       f"recipes/{name}.py does not run: use --strategy=multi_worker, or "
       "tfaccel.distribute.make_strategy in your own code")
      for name in ("train", "prune", "optimize")],
    # No recipe accepts a flag it would ignore: optimize keeps no backup, bench_input no epochs.
    ("optimize_backup_dir", "optimize", ["--backup_dir={cwd}/backup"],
     "unknown flag --backup_dir: --helpshort lists every flag of this recipe"),
    ("optimize_backup_freq", "optimize", ["--backup_freq=10"],
     "unknown flag --backup_freq: --helpshort lists every flag of this recipe"),
    ("bench_epochs", "bench_input", ["--epochs=3"],
     "unknown flag --epochs: --helpshort lists every flag of this recipe"),
    # The input pipeline flags are every recipe's, checked alike.
    *[(f"{name}_ram_budget_without_autotune", name, ["--data_ram_budget_mb=64"],
       "--data_ram_budget_mb=64 is tf.data autotune's RAM budget: add --data_autotune, or drop it")
      for name in ("train", "prune", "optimize", "bench_input")],
    *[(f"{name}_cache_in_missing_folder", name, ["--cache=/nonexistent_dir/c"],
       f"cache='/nonexistent_dir/c': folder /nonexistent_dir does not exist: {CACHE_FIX}")
      for name in ("bench_input", "prune", "optimize")],
    ("prune_unknown_schedule", "prune", ["--pruning_schedule=cubic"],
     "--pruning_schedule=cubic: use one of polynomial, constant"),
    ("prune_unknown_pooling", "prune", ["--block_pooling=MIN"],
     "--block_pooling=MIN: use one of AVG, MAX"),
    ("prune_unknown_policy", "prune", ["--pruning_policy=tpu"],
     "--pruning_policy=tpu: use one of xnnpack"),
    ("bench_batches_zero", "bench_input", ["--num_batches=0"],
     "--num_batches=0 is out of range: give an integer >= 1, e.g. --num_batches=20"),
    ("bench_repeats_text", "bench_input", ["--repeats=x"],
     "--repeats=x: not an integer: give an integer >= 1, e.g. --repeats=3"),
    ("bench_model_dir_is_file", "bench_input", ["--model_dir={in}/a_file"], "--model_dir={in}/"
     "a_file is a file, not a folder: give a folder path (it is created if missing)"),
    # The language-model recipes: their own flags, and the shared ones checked alike.
    ("lm_heads_do_not_divide", "train_lm", ["--gpt_heads=3", "--gpt_d_model=32"],
     "--gpt_heads=3 does not divide --gpt_d_model=32: pick heads that divide it (e.g. 2) or "
     "another d_model"),
    ("lm_window_longer_than_context", "train_lm", ["--sequence_length=128"],
     "--sequence_length=128 is larger than the model's context 64: pass --sequence_length<=64, "
     "or --gpt_context>=128"),
    ("lm_cpu_devices_zero", "train_lm", ["--cpu_devices=0"], NO_CPU_DEVICES),
    ("lm_grad_accum_zero", "train_lm", ["--grad_accum_steps=0"],
     "grad_accum_steps=0 must be an integer >= 1 (1 means no accumulation)"),
    ("lm_pipeline_with_accumulation", "train_lm", ["--parallel=pipeline", "--grad_accum_steps=2"],
     "--grad_accum_steps=2 with --parallel=pipeline is not supported: the pipeline already sums "
     "the gradients of --micro_batches: use those"),
    ("generate_negative_temperature", "generate", ["--temperature=-1"],
     "--temperature=-1 is out of range: give a number >= 0, e.g. --temperature=0.8"),
    # The tfaccel command's lines quote argparse, whose wording differs between Python
    # versions: checked for the problem and the fix they name.
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
    ("model_file_not_a_model", "train", ["--model={in}/not_a_model.keras"], "cannot load model",
     "give a .keras/.h5 file"),
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
    ("missing_model_file", "prune", ["--model={in}/missing.keras"], "does not exist",
     "give a .keras/.h5 file"),
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
    proc, seconds = run_with_cpu_seconds([*prefix, PYTHON, "-c", _WRAPPER, target, *args],
                                         cwd=cwd, env=env, capture_output=True, text=True,
                                         timeout=300, check=False)
    return proc, seconds, cwd


def _problems(case, proc, cwd, inputs):
    """What is wrong with one case's outcome (empty when it behaved): a flag case's line must
    be `error: ` and its line exactly; another's must name its problem and fix."""
    found = []
    lines = proc.stderr.splitlines()
    if proc.returncode != 2:
        found.append(f"exit code {proc.returncode}, not 2")
    if "Traceback" in proc.stderr:
        found.append("a traceback")
    if len(lines) != 1 or not lines[0].startswith("error: "):
        found.append(f"{len(lines)} stderr lines, not one 'error:' line")
    elif case in FLAG_CASES and len(case) == 4:
        expected = "error: " + case[3].format(**{"in": inputs["root"], "cwd": cwd})
        if lines[0] != expected:
            found.append(f"the line is not\n  {expected}")
    elif case[-2] not in lines[0] or case[-1] not in lines[0]:
        found.append(f"the line lacks {case[-2]!r} or {case[-1]!r}")
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
    assert seconds < FLAG_ERROR_CPU_SECONDS, f"{case[0]} used {seconds:.2f} s of CPU"


@pytest.mark.parametrize("case", DIR_CASES, ids=[c[0] for c in DIR_CASES])
def test_unwritable_model_dir_is_one_line_before_tensorflow(case, inputs, tmp_path):
    prefix = inputs[case[3]]
    if prefix is None:
        pytest.skip(f"no way to make a folder root cannot write here ({case[3]})")
    proc, seconds, cwd = _run_case(case, inputs, str(tmp_path), prefix=prefix)
    assert not _problems(case, proc, cwd, inputs), _problems(case, proc, cwd, inputs)
    assert f"{TF_MARKER} False" in proc.stdout, proc.stdout
    assert seconds < FLAG_ERROR_CPU_SECONDS, f"{case[0]} used {seconds:.2f} s of CPU"


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
    assert {c[1] for c in cases} == {"train", "prune", "optimize", "bench_input", "train_lm",
                                     "generate", "cli"}


# --- What recipes/flag_errors.py relies on in absl (it reads no absl message): if an absl
# upgrade changes one of these, this test says which, and the lines above say what broke.

def _absl_flags(tmp_path):
    values = flags.FlagValues()
    flags.DEFINE_integer("epochs", 3, "", lower_bound=1, flag_values=values)
    flags.DEFINE_bool("flip", False, "", flag_values=values)
    return values


def test_the_absl_behaviours_the_error_lines_rest_on(tmp_path):
    # An unknown flag: UnrecognizedFlagError carries its name.
    with pytest.raises(flags.UnrecognizedFlagError) as unknown:
        _absl_flags(tmp_path)(["prog", "--epoch=3"])
    assert unknown.value.flagname == "epoch"
    # A value: absl hands it to the flag's own parse(), as given, which raises
    # IllegalFlagValueError for a value its parser refuses.
    values, given = _absl_flags(tmp_path), []
    parse = values["epochs"].parse
    values["epochs"].parse = lambda argument: (given.append(argument), parse(argument))
    with pytest.raises(flags.IllegalFlagValueError):
        values(["prog", "--epochs=0"])
    assert given == ["0"]
    assert values["epochs"].parser.is_outside_bounds(values["epochs"].parser.convert("0"))
    # A flag without its value, last: a bare flags.Error; --noflag=value: a ValueError.
    with pytest.raises(flags.Error) as missing:
        _absl_flags(tmp_path)(["prog", "--epochs"])
    assert type(missing.value) is flags.Error
    with pytest.raises(ValueError) as negated:
        _absl_flags(tmp_path)(["prog", "--noflip=1"])
    assert not isinstance(negated.value, flags.Error)
    # A flag file that does not open: CantOpenFlagFileError, raised while handling the OSError.
    with pytest.raises(flags.CantOpenFlagFileError) as unopened:
        _absl_flags(tmp_path)(["prog", f"--flagfile={tmp_path}/missing.cfg"])
    assert isinstance(unopened.value.__context__, OSError)
    assert unopened.value.__context__.filename == f"{tmp_path}/missing.cfg"
    # A validator's ValidationError: IllegalFlagValueError once all flags are parsed, and a
    # validator runs again when a program sets its flag.
    values, seen = _absl_flags(tmp_path), []

    def checker(value):
        seen.append(value)
        if value == 5:
            raise flags.ValidationError("five")
        return True

    flags.register_validator("epochs", checker, flag_values=values)
    with pytest.raises(flags.IllegalFlagValueError):
        values(["prog", "--epochs=5"])
    assert seen == [5]
    values(["prog", "--epochs=4"])
    with pytest.raises(flags.IllegalFlagValueError):
        values.epochs = 5
