"""The benchmarks' command line: the recipes' flag machinery (recipes/flagkit.py), one output flag.

`run(main)` is the recipes' `flagkit.run`: --help and --helpshort print the
benchmark's docstring and its flags and exit 0 (absl's exit 1); a bad flag
value, an unknown flag or a stray argument is one `error: ...` line on stderr
and exit 2 before TensorFlow loads, as is a `TfaccelError` from `main`; `main`'s
return value is the exit status. Benchmarks have no --model_dir, so there is no
pre-flight check of it. `define_output_dir` is the one output-folder flag of
every benchmark: --output_dir, with --out_dir (its old name in bench_data and
bench_prune) as an alias.
"""

import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _path in (ROOT, os.path.join(ROOT, "recipes")):  # tfaccel, and the recipes' flag machinery
    if _path not in sys.path:
        sys.path.insert(0, _path)

import flagkit  # noqa: E402
from absl import flags  # noqa: E402


def define_output_dir(default, help_text):
    """Defines --output_dir and its alias --out_dir, listed with the calling benchmark's flags."""
    caller = inspect.currentframe().f_back.f_globals.get("__name__")
    module = sys.argv[0] if caller == "__main__" else caller  # as absl names a script's flags
    flags.DEFINE_string("output_dir", default, help_text, module_name=module)
    flags.DEFINE_alias("out_dir", "output_dir", module_name=module)


def run(main):
    """Parses the flags the recipes' way, imports TensorFlow quietly, then runs `main(argv)`."""
    flagkit.run(main)
