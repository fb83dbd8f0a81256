"""The recipes' flag machinery: absl flags whose every error is one line, before TensorFlow.

`parse_flags` is absl's flags_parser for the recipes: an unknown or malformed flag, a stray
argument, a value a registered check refuses (`check_flag`, `check_choice`, `require_ints`)
and a nan/inf float or a learning rate <= 0 each become one `error: <problem>: <fix>` line
on stderr and exit 2, in a fraction of a second, because nothing here imports TensorFlow.
`run` parses, runs the recipe's pre-flight check, imports TensorFlow quietly and calls the
recipe's `main`; `--help` lists the recipe's own flags, then each help group (`GROUPS`) of
the shared ones.

recipes/common.py defines the shared flags and turns them into tfaccel calls; the recipes
import that module, which re-exports what they use from here.
"""

import ast
import math
import os
import re
import sys

# Filters what TensorFlow's C++ code logs once loaded (errors and worse); tfaccel.quiet applies
# the same level to the lines its libraries print while they load, which this alone cannot.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging

from tfaccel.errors import ConfigError, TfaccelError

FLAGS = flags.FLAGS
EXIT_BAD_INPUT = 2

# Help groups: absl groups flags by the module that defines them, so the shared flags are
# defined under these names, and --help lists the recipe's own flags, then each group.
DATA, MODEL, TRAINING, DISTRIBUTION, PIPELINE, SCHEDULE, PERFORMANCE = GROUPS = (
    "data flags", "model flags", "training flags", "distribution flags", "input pipeline flags",
    "learning-rate schedule flags", "performance flags")
RECIPES_DIR = os.path.dirname(os.path.abspath(__file__))


class BatchSizeParser(flags.ArgumentParser):
    """A positive integer, or 'auto' when `allow_auto` (then FLAGS.batch_size is 'auto')."""

    def __init__(self, allow_auto=False):
        self.allow_auto = allow_auto

    def parse(self, argument):
        text = str(argument).strip().lower()
        if self.allow_auto and text == "auto":
            return "auto"
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1 or isinstance(argument, bool):
            raise ValueError(f"{argument!r} is not a batch size: use a positive integer, e.g. 64"
                             + (", or 'auto' to measure the fastest that fits" if self.allow_auto
                                else ""))
        return value

    def flag_type(self):
        return "int or 'auto'" if self.allow_auto else "int"


def int_list(values):
    """The integers of a list flag that `require_ints` checked when the flags were parsed."""
    return tuple(int(v) for v in values)


def recipe_path():
    """The running recipe as the messages name it, e.g. 'recipes/train.py'."""
    return f"recipes/{os.path.basename(sys.argv[0])}"


# --- Checks that run while the flags are parsed, before TensorFlow loads.

_CHECKS = []


def check_flag(name, check):
    """Runs `check(value)` on --name right after parsing; a ConfigError it raises is the line."""
    _CHECKS.append((name, check))


def check_in(value, what, options, lower=False):
    """Raises ConfigError unless `value` is one of `options` (`lower`: compared lower-cased);
    None passes."""
    key = str(value).strip().lower() if lower and value is not None else value
    if value is not None and key not in options:
        raise ConfigError(f"unknown {what} {value!r}: use one of {', '.join(options)}")


def check_choice(name, what, options, lower=False):
    """--name must be one of `options` (`lower`: compared lower-cased); None passes."""
    check_flag(name, lambda value: check_in(value, what, options, lower))


def require_ints(name, what, count=None, example=None, rule=None, allow_empty=False):
    """List flag --name must be positive integers (`count` of them, and `rule(ints)` true).

    `what` describes a valid value for the message, `example` is one (default: the flag's
    default).
    """

    def check(values):
        if allow_empty and not values:
            return
        try:
            ints = [int(v) for v in values]
        except ValueError:
            ints = []
        if (not ints or min(ints) < 1 or (count is not None and len(ints) != count)
                or (rule is not None and not rule(ints))):
            shown = example or ",".join(FLAGS[name].default or [])
            raise ConfigError(f"--{name}={','.join(values)} must be {what}"
                              + (f", e.g. --{name}={shown}" if shown else ""))

    check_flag(name, check)


def _number_hint(flag):
    """', e.g. --name=<default>' (a learning rate without one: --learning_rate's default)."""
    example = flag.default
    if example is None and flag.name.endswith("learning_rate") and "learning_rate" in FLAGS:
        example = FLAGS["learning_rate"].default
    return f", e.g. --{flag.name}={example:g}" if example is not None else ""


def _check_numbers():
    """Every float flag finite; every learning rate > 0 (nan, inf or 0 only waste a run)."""
    for flag in _recipe_flags():
        value = flag.value
        if not isinstance(flag.parser, flags.FloatParser) or value is None:
            continue
        if not math.isfinite(value):
            raise ConfigError(f"--{flag.name}={value} is not a finite number: give a number"
                              + _number_hint(flag))
        if flag.name.endswith("learning_rate") and value <= 0:
            raise ConfigError(f"--{flag.name}={value:g}: a learning rate must be > 0"
                              + _number_hint(flag))


# --- The recipe's own flags (absl's left out), for checks and reports.

def _is_recipe_module(module_name):
    if module_name in GROUPS or module_name == "__main__":
        return True
    if os.path.abspath(module_name) == os.path.abspath(sys.argv[0]):
        return True
    leaf = module_name.rpartition(".")[2]
    return os.path.exists(os.path.join(RECIPES_DIR, leaf + ".py"))


def _recipe_flags():
    return [flag for module, module_flags in FLAGS.flags_by_module_dict().items()
            if _is_recipe_module(module) for flag in module_flags]


def flag_values():
    """{flag: value} of the flags the recipes define (absl's own left out), for reports."""
    return {flag.name: flag.value for flag in _recipe_flags()}


def command_line():
    """The command that reproduces this run."""
    return " ".join(["python", *sys.argv])


def reject_extra_args(argv):
    if len(argv) > 1:
        raise ConfigError(f"unexpected arguments {' '.join(argv[1:])!r}: every option is a "
                          "--flag (see --helpshort)")


# --- absl's flag errors as one line that names the flag and what to give instead.

_UNKNOWN = re.compile(r"Unknown command line flag '([^']+)'(?:\. Did you mean: (.+?) \?)?$")
_MISSING = re.compile(r"Missing value for flag (-+[^\s]+)")
_FLAGFILE = re.compile(r"Unable to open flagfile: (?:\[Errno \d+\] )?([^:]+): '(.*)'")
_ILLEGAL = re.compile(r"flag --([A-Za-z0-9_.-]+)=(.*?): (.*)$", re.DOTALL)
_REASONS = ((re.compile(r"invalid literal for int\(\)"), "not an integer"),
            (re.compile(r"could not convert string to float"), "not a number"),
            (re.compile(r"Non-boolean argument"), "not true or false"))
_KINDS = {"IntegerParser": "an integer", "FloatParser": "a number",
          "BooleanParser": "true or false"}


def _shown_value(text):
    if text.startswith("["):  # a list flag's value as absl prints it
        try:
            return ",".join(map(str, ast.literal_eval(text)))
        except (ValueError, SyntaxError):
            pass
    return text


def _value_fix(name):
    """'give an integer >= 1, e.g. --epochs=30' for the flag `name`."""
    if name not in FLAGS:
        return "see --helpshort"
    flag = FLAGS[name]
    kind = _KINDS.get(type(flag.parser).__name__, "a valid value")
    bounds = [f"{op} {bound:g}" for op, bound in ((">=", getattr(flag.parser, "lower_bound", None)),
                                                  ("<=", getattr(flag.parser, "upper_bound", None)))
              if bound is not None]
    example = flag.default
    if isinstance(example, bool):
        example = str(example).lower()
    elif isinstance(example, (list, tuple)):
        example = ",".join(map(str, example)) or None
    return (f"give {kind}{' ' + ' and '.join(bounds) if bounds else ''}"
            + (f", e.g. --{name}={example}" if example is not None else ""))


def flag_error_message(error):
    """absl's flag error as one line that names the flag and what to give instead."""
    text = " ".join(str(error).split())
    if match := _UNKNOWN.search(text):
        name, guesses = match.groups()
        if guesses:
            return (f"unknown flag --{name}: did you mean --{guesses.split(',')[0].strip()}? "
                    "(--helpshort lists every flag of this recipe)")
        return f"unknown flag --{name}: --helpshort lists every flag of this recipe"
    if match := _MISSING.search(text):
        return f"flag {match.group(1)} needs a value: write {match.group(1)}=VALUE"
    if match := _FLAGFILE.search(text):
        reason, path = match.groups()
        return (f"cannot open --flagfile={path} ({reason.strip()}): give an existing flag file, "
                "e.g. one in recipes/presets/")
    if match := _ILLEGAL.match(text):
        name, value, reason = match.groups()
        value = _shown_value(value)
        if value.startswith("--"):  # `--epochs --model_dir=x`: absl took the next flag as value
            return (f"flag --{name} needs a value (it took {value!r} as one): write "
                    f"--{name}=VALUE")
        if enum := re.match(r"value should be one of <(.*)>$", reason):
            return f"--{name}={value}: use one of {', '.join(enum.group(1).split('|'))}"
        if name.endswith("learning_rate") and "non-negative" in reason:
            return f"--{name}={value}: a learning rate must be > 0{_number_hint(FLAGS[name])}"
        for pattern, plain in _REASONS:
            if pattern.search(reason):
                reason = plain
        if "use " in reason or "e.g." in reason:
            return f"--{name}={value}: {reason}"
        return f"--{name}={value}: {reason}: {_value_fix(name)}"
    return f"{text}: see --helpshort"


def _fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def parse_flags(argv):
    """absl's flags_parser for the recipes: every bad flag is one 'error:' line and exit 2.

    Also rejects stray arguments, runs the checks registered with `check_flag`, and rejects
    nan/inf floats and learning rates <= 0, all before TensorFlow is imported.
    """
    try:
        argv = FLAGS(argv)
        reject_extra_args(argv)
        for name, check in _CHECKS:
            if name in FLAGS:
                check(FLAGS[name].value)
        _check_numbers()
    except flags.Error as e:
        _fail(flag_error_message(e))
    except TfaccelError as e:
        _fail(str(e))
    return argv


# --- --help, and running a recipe's main.

def recipe_help():
    """--help: the recipe's docstring, its own flags, then each group of shared flags."""
    doc = (sys.modules["__main__"].__doc__ or f"USAGE: {sys.argv[0]} [flags]\n").rstrip()
    sections = "\n".join(FLAGS.module_help(module) for module in (sys.argv[0], *GROUPS))
    return (f"{doc}\n\nflags:{sections}\n\n--flagfile=FILE reads flags from a file (see "
            "recipes/presets/); --helpfull also lists absl's own flags.")


class _HelpFlag(flags.BooleanFlag):
    """--help / --helpshort / -?: `recipe_help` on stdout, exit 0."""

    def __init__(self, name, short_name=None):
        super().__init__(name, False, "show this recipe's flags, grouped", short_name=short_name,
                         allow_hide_cpp=True, allow_override=True)

    def parse(self, argument):
        if self._parse(argument):
            try:
                print(recipe_help(), flush=True)
            except BrokenPipeError:  # `--help | head`
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(0)


def _define_help_flags():
    app.define_help_flags()  # absl's (--helpfull, --helpxml); ours replace --help, --helpshort
    flags.DEFINE_flag(_HelpFlag("help", short_name="?"), module_name="absl.app")
    flags.DEFINE_flag(_HelpFlag("helpshort"), module_name="absl.app")


def run(main, preflight=None):
    """Runs `main` under absl: flag errors and a TfaccelError become one 'error:' line, exit 2.

    Once the flags are parsed and checked, `preflight()` runs (still without TensorFlow:
    e.g. the check that the output folders are writable), then TensorFlow is imported
    (without its start-up chatter), then `main(argv)`.
    """

    def guarded(argv):
        try:
            if preflight is not None:
                preflight()
            from tfaccel.quiet import import_tensorflow

            import_tensorflow()
            return main(argv)
        except TfaccelError as e:
            _fail(str(e))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)

    logging.set_verbosity(logging.WARNING)
    _define_help_flags()
    app.run(guarded, flags_parser=parse_flags)
