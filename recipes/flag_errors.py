"""What absl refused while parsing the recipes' flags, as one line: the problem and the fix.

`flag_error_message` writes the line from what absl's exception carries (its type, the
unknown flag's name, the OSError a flag file raised) and from the flag itself (its parser,
bounds and default), never from absl's wording: the value a parser refused is known by
flag, because `name_the_flag_in_parse_errors` makes each flag's `parse` raise a
`FlagValueError` naming it. recipes/flagkit.py calls it; tests/test_bad_inputs.py pins each
line, and the absl behaviours it relies on, so that an absl upgrade that changes them fails
there.
"""

import difflib

from absl import flags

from tfaccel.errors import TfaccelError

FLAGS = flags.FLAGS


class FlagValueError(flags.IllegalFlagValueError):
    """The parser of `flag` refused `value` (as given); `reason` is the parser's exception."""

    def __init__(self, flag, value, reason):
        super().__init__(f"--{flag.name}={value}: {reason}")
        self.flag, self.value, self.reason = flag, value, reason


_NAMED = set()  # ids of the flags whose parse raises FlagValueError


def name_the_flag_in_parse_errors():
    """Wraps each flag's `parse` (absl calls it with the value given) so that a refused value
    raises FlagValueError: absl's own error names the flag in its text only."""
    for name in list(FLAGS):
        flag = FLAGS[name]
        if id(flag) in _NAMED:
            continue
        _NAMED.add(id(flag))

        def parse(argument, flag=flag, parse=flag.parse):
            try:
                return parse(argument)
            except FlagValueError:
                raise
            except flags.IllegalFlagValueError as e:
                try:  # what the parser itself says of the value
                    flag.parser.parse(argument)
                    reason = None
                except (TypeError, ValueError) as refusal:
                    reason = refusal
                raise FlagValueError(flag, argument, reason) from e

        flag.parse = parse


_KINDS = ((flags.BooleanParser, "true or false"), (flags.IntegerParser, "an integer"),
          (flags.FloatParser, "a number"))


def number_hint(flag):
    """', e.g. --name=<default>' (a learning rate without one: --learning_rate's default)."""
    example = flag.default
    if example is None and flag.name.endswith("learning_rate") and "learning_rate" in FLAGS:
        example = FLAGS["learning_rate"].default
    return f", e.g. --{flag.name}={example:g}" if example is not None else ""


def _value_fix(flag):
    """'give an integer >= 1, e.g. --epochs=30' for `flag`."""
    kind = next((k for parser, k in _KINDS if isinstance(flag.parser, parser)), "a valid value")
    bounds = [f"{op} {bound:g}" for op, bound in ((">=", getattr(flag.parser, "lower_bound", None)),
                                                  ("<=", getattr(flag.parser, "upper_bound", None)))
              if bound is not None]
    example = flag.default
    if isinstance(example, bool):
        example = str(example).lower()
    elif isinstance(example, (list, tuple)):
        example = ",".join(map(str, example)) or None
    return (f"give {kind}{' ' + ' and '.join(bounds) if bounds else ''}"
            + (f", e.g. --{flag.name}={example}" if example is not None else ""))


def _outside_bounds(parser, value):
    """True when numeric `parser` reads `value` as a number outside its bounds."""
    try:
        return parser.is_outside_bounds(parser.convert(value))
    except (TypeError, ValueError):
        return False


def _bad_value(flag, value, reason):
    """The line for a value the parser of `flag` refused."""
    name = flag.name
    if str(value).startswith("--"):  # `--epochs --model_dir=x`: absl took the next flag as value
        return f"flag --{name} needs a value (it took {value!r} as one): write --{name}=VALUE"
    if isinstance(reason, TfaccelError):  # our own parser wrote the line
        return f"--{name}={value}: {reason}"
    if isinstance(flag.parser, flags.EnumParser):
        return f"--{name}={value}: use one of {', '.join(flag.parser.enum_values)}"
    if isinstance(flag.parser, (flags.IntegerParser, flags.FloatParser)) and \
            _outside_bounds(flag.parser, value):
        if name.endswith("learning_rate"):
            return f"--{name}={value}: a learning rate must be > 0{number_hint(flag)}"
        return f"--{name}={value} is out of range: {_value_fix(flag)}"
    kind = next((k for parser, k in _KINDS if isinstance(flag.parser, parser)), None)
    if kind is not None:
        return f"--{name}={value}: not {kind}: {_value_fix(flag)}"
    return f"--{name}={value}: {reason}: {_value_fix(flag)}"


def _unknown_flag(name):
    guesses = difflib.get_close_matches(name, [n for n in FLAGS if len(n) > 1], n=1)
    if guesses:
        return (f"unknown flag --{name}: did you mean --{guesses[0]}? (--helpshort lists every "
                "flag of this recipe)")
    return f"unknown flag --{name}: --helpshort lists every flag of this recipe"


def _unopened_flagfile(error):
    """The line for CantOpenFlagFileError: absl raises it while handling the OSError."""
    cause = error.__context__
    fix = "give an existing flag file, e.g. one in recipes/presets/"
    if isinstance(cause, OSError) and str(cause.filename).startswith("--"):  # `--flagfile --x`
        return (f"flag --flagfile needs a value (it took {cause.filename!r} as one): write "
                "--flagfile=VALUE")
    if isinstance(cause, OSError) and cause.filename:
        return f"cannot open --flagfile={cause.filename} ({cause.strerror}): {fix}"
    return f"cannot open a --flagfile: {fix}"


def _given_args(argv):
    """The arguments absl parses: argv's, with each --flagfile's lines in its place."""
    try:
        return FLAGS.read_flags_from_files(list(argv[1:]), force_gnu=False)
    except flags.Error:
        return list(argv[1:])


def _flag_without_value(args):
    """The flag absl ran out of arguments for: the last one, a known flag that takes a value
    (or --flagfile, which absl reads before the others)."""
    if not args or not args[-1].startswith("-") or "=" in args[-1]:
        return None
    name = args[-1].lstrip("-")
    return name if name == "flagfile" or (name in FLAGS and not FLAGS[name].boolean) else None


def _negated_with_value(args):
    """A `--noflag=value` (absl: a ValueError): the boolean flag's name, or None."""
    for arg in args:
        name, _, value = arg.lstrip("-").partition("=")
        if value and name.startswith("no") and name[2:] in FLAGS and FLAGS[name[2:]].boolean:
            return name[2:]
    return None


def flag_error_message(error, argv, refused=()):
    """The one line for a flag error absl raised while parsing `argv`; `refused`: the
    TfaccelErrors our validators raised meanwhile (absl rewrote their text)."""
    if refused:  # our validator refused a value: its own line, the first one
        return str(refused[0])
    if isinstance(error, FlagValueError):
        return _bad_value(error.flag, error.value, error.reason)
    if isinstance(error, flags.UnrecognizedFlagError):
        return _unknown_flag(error.flagname)
    if isinstance(error, flags.CantOpenFlagFileError):
        return _unopened_flagfile(error)
    args = _given_args(argv)
    if isinstance(error, flags.Error) and (name := _flag_without_value(args)):
        return f"flag --{name} needs a value: write --{name}=VALUE"
    if isinstance(error, ValueError) and (name := _negated_with_value(args)):
        return f"--no{name} takes no value: write --no{name}, or --{name}=false"
    return f"{' '.join(str(error).split())}: see --helpshort"
