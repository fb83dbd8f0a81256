"""The recipes' flag machinery: absl flags whose every error is one line, before TensorFlow.

absl checks every value while it parses the flags: the flag's own parser (`DEFINE_integer`
with `lower_bound`, `DEFINE_enum`, `BatchSizeParser`...) and the validators the flag modules
register with `check_flag` and `check_flags` (absl's `register_validator` and
`register_multi_flags_validator`), which call the same TensorFlow-free checks as the tfaccel
helpers (`tfaccel.choices`); every float flag must also be finite, every learning rate > 0.
`parse_flags`, absl's flags_parser for the recipes, turns whatever absl refuses and a stray
argument into one `error: <problem>: <fix>` line on stderr and exit 2, in a fraction of a
second, because nothing here imports TensorFlow (recipes/flag_errors.py writes the line from
what absl's exception carries, not from its wording). `run` parses, runs the recipe's
pre-flight check, imports TensorFlow quietly and calls the recipe's `main`; `--help` lists
the recipe's own flags, then each help group (`GROUPS`) of the shared ones.

recipes/shared_flags.py defines the shared flags (recipes/lm_common.py the language model's),
recipes/common.py turns them into tfaccel calls; the recipes import that module, which
re-exports what they use from here.
"""

import math
import os
import sys

# Filters what TensorFlow's C++ code logs once loaded (errors and worse); tfaccel.quiet applies
# the same level to the lines its libraries print while they load, which this alone cannot.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging
from flag_errors import flag_error_message, name_the_flag_in_parse_errors, number_hint

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
            raise ConfigError(f"{argument!r} is not a batch size: use a positive integer, e.g. 64"
                              + (", or 'auto' to measure the fastest that fits"
                                 if self.allow_auto else ""))
        return value

    def flag_type(self):
        return "int or 'auto'" if self.allow_auto else "int"


def int_list(values):
    """The integers of a list flag that `require_ints` checked when the flags were parsed."""
    return tuple(int(v) for v in values)


def recipe_path():
    """The running recipe as the messages name it, e.g. 'recipes/train.py'."""
    return f"recipes/{os.path.basename(sys.argv[0])}"


# --- Validators: absl runs them once the flags are parsed (and again when a recipe sets a
# flag), before TensorFlow loads.

_refused = []  # the TfaccelErrors our validators raised since the flags were last parsed


def _validator(check):
    """An absl checker running `check`: its TfaccelError becomes absl's ValidationError, and
    is kept for the error line (absl prefixes the flags and their values to the text)."""

    def checker(value):
        try:
            check(value)
        except TfaccelError as e:
            _refused.append(e)
            raise flags.ValidationError(str(e)) from e
        return True

    return checker


def check_flag(name, check):
    """absl validates --name with `check(value)`; a ConfigError it raises is the error line."""
    flags.register_validator(name, _validator(check))


def check_flags(names, check):
    """absl validates the flags `names` together: `check(name=value, ...)` with those of them
    the recipe defines (so `check` gives the others defaults); a ConfigError is the line."""
    defined = [name for name in names if name in FLAGS]
    flags.register_multi_flags_validator(defined, _validator(lambda values: check(**values)))


def check_in(value, what, options):
    """Raises ConfigError unless `value` is one of `options`; None passes."""
    if value is not None and value not in options:
        raise ConfigError(f"unknown {what} {value!r}: use one of {', '.join(options)}")


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


def _check_number(flag, value):
    """A float flag is finite; a learning rate > 0 (nan, inf or 0 only waste a run)."""
    if value is None:
        return
    if not math.isfinite(value):
        raise ConfigError(f"--{flag.name}={value} is not a finite number: give a number"
                          + number_hint(flag))
    if flag.name.endswith("learning_rate") and value <= 0:
        raise ConfigError(f"--{flag.name}={value:g}: a learning rate must be > 0"
                          + number_hint(flag))


_NUMBERS_CHECKED = set()


def _check_numbers():
    """Registers `_check_number` as the validator of each float flag of the recipe (once)."""
    for flag in _recipe_flags():
        if isinstance(flag.parser, flags.FloatParser) and flag.name not in _NUMBERS_CHECKED:
            _NUMBERS_CHECKED.add(flag.name)
            check_flag(flag.name, lambda value, flag=flag: _check_number(flag, value))


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


def _fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(EXIT_BAD_INPUT)


def parse_flags(argv):
    """absl's flags_parser for the recipes: every bad flag is one 'error:' line and exit 2.

    absl parses and validates (the validators registered with `check_flag`/`check_flags`,
    finite floats, learning rates > 0); stray arguments are refused too, all before
    TensorFlow is imported.
    """
    name_the_flag_in_parse_errors()
    _check_numbers()
    _refused.clear()
    try:
        args = FLAGS(argv)
        reject_extra_args(args)
    except TfaccelError as e:
        _fail(str(e))
    except (flags.Error, ValueError) as e:  # absl raises ValueError for `--noflag=value`
        _fail(flag_error_message(e, argv, _refused))
    return args


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
        except flags.IllegalFlagValueError as e:  # a value a recipe set, refused by a validator
            _fail(flag_error_message(e, sys.argv, _refused))
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            sys.exit(130)

    logging.set_verbosity(logging.WARNING)
    _define_help_flags()
    app.run(guarded, flags_parser=parse_flags)
