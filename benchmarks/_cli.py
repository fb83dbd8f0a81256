"""The benchmarks' command line (the recipes' recipes/flagkit.py), output folder and files.

`run(main)` is the recipes' `flagkit.run`: --help and --helpshort print the
benchmark's docstring and its flags and exit 0 (absl's exit 1); a bad flag
value, an unknown flag or a stray argument is one `error: ...` line on stderr
and exit 2 before TensorFlow loads, as is a `TfaccelError` from `main`; `main`'s
return value is the exit status. Benchmarks have no --model_dir, so there is no
pre-flight check of it. `define_output_dir` is the one output-folder flag of
every benchmark: --output_dir, with --out_dir (its old name in bench_data and
bench_prune) as an alias. A benchmark that measures each case in fresh processes
(bench_memory, bench_recompute) defines its flags with `define_fresh_process_flags`,
runs a case with `measure_in_fresh_process`, and the case's process prints its
result with `print_result`. `write_outputs` writes what a benchmark leaves in
--output_dir: its JSON, and its report and chart in TensorBoard.
"""

import inspect
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "recipes")):  # tfaccel, and the recipes' flag machinery
    if _path not in sys.path:
        sys.path.insert(0, _path)

import flagkit  # noqa: E402
from absl import flags  # noqa: E402

from tfaccel.errors import ConfigError  # noqa: E402


def _benchmark_module():
    """The name absl files the calling benchmark's flags under (for --helpshort)."""
    caller = inspect.currentframe().f_back.f_back.f_globals.get("__name__")
    return sys.argv[0] if caller == "__main__" else caller  # as absl names a script's flags


def define_output_dir(default, help_text):
    """Defines --output_dir and its alias --out_dir, listed with the calling benchmark's flags."""
    module = _benchmark_module()
    flags.DEFINE_string("output_dir", default, help_text, module_name=module)
    flags.DEFINE_alias("out_dir", "output_dir", module_name=module)


def define_fresh_process_flags(configs, default, repeats, steps, case="configuration"):
    """--configs (some of `configs`, checked while parsing), --repeats, --steps and the
    internal --measure_one of a benchmark that measures each `case` in fresh processes: see
    `measure_in_fresh_process`."""
    module = _benchmark_module()
    flags.DEFINE_list("configs", default, f"Configurations to measure: some of "
                      f"{', '.join(configs)}.", module_name=module)
    flags.DEFINE_integer("repeats", repeats, f"Processes per {case}; the largest peak counts.",
                         lower_bound=1, module_name=module)
    flags.DEFINE_integer("steps", steps, "Training steps measured in each process.",
                         lower_bound=1, module_name=module)
    flags.DEFINE_string("measure_one", None, f"Internal: measure this {case} in this process "
                        "and print its JSON.", module_name=module)

    def check(names):
        unknown = [name for name in names if name not in configs]
        if unknown:
            raise ConfigError(f"--configs: unknown {', '.join(unknown)}; use some of "
                              f"{', '.join(configs)}")

    flagkit.check_flag("configs", check)


def print_result(result):
    """What `--measure_one` prints for `measure_in_fresh_process` to read; exit status 0."""
    print("RESULT " + json.dumps(result), flush=True)
    return 0


def measure_in_fresh_process(script, case, *args):
    """Runs `script --measure_one=case *args` in a new Python process (its allocator has served
    nothing else) and returns the dict it printed with `print_result`; exits with its error
    output when it failed."""
    proc = subprocess.run([sys.executable, os.path.abspath(script), f"--measure_one={case}",
                           *args], capture_output=True, text=True, check=False,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{case} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def write_outputs(name, result, text, png, scalars=None, tags=None, also=()):
    """Writes what a benchmark leaves in --output_dir, and prints the line saying so.

    `name`.json (`result`, atomically), and in TensorBoard (logs/) `text` and the chart
    `png` (a PNG file already written) under `tags` (text tag, image tag; default
    'bench/<name without bench_>' and the same with '_plot'), and `scalars` if any. `also`
    names other files the benchmark wrote there, for the line.
    """
    from tfaccel import io, summaries

    out = flags.FLAGS.output_dir
    io.write_json(os.path.join(out, f"{name}.json"), result)
    text_tag, image_tag = tags or (f"bench/{name.removeprefix('bench_')}",
                                   f"bench/{name.removeprefix('bench_')}_plot")
    logdir = os.path.join(out, "logs")
    summaries.write_text(logdir, text_tag, text)
    if scalars:
        summaries.write_scalars(logdir, scalars)
    summaries.write_png(logdir, image_tag, png)
    files = [f"{name}.json", os.path.basename(png), *also, "logs/"]
    print(f"\nwrote {out}: {', '.join(files)} (tensorboard --logdir {logdir})")


def run(main):
    """Parses the flags the recipes' way, imports TensorFlow quietly, then runs `main(argv)`."""
    flagkit.run(main)
