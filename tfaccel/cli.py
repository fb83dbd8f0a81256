"""The `tfaccel` command: `tfaccel doctor [--json]`, `tfaccel launch ...`.

A bad argument is one `error: ...` line on stderr and exit code 2, before
TensorFlow is imported, as in the recipes.
"""

import argparse
import json
import os
import sys

EXIT_BAD_INPUT = 2


class _OneLineParser(argparse.ArgumentParser):
    """argparse with its usage block replaced by one 'error:' line that says where help is."""

    def error(self, message):
        print(f"error: {message}: see {self.prog} --help", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _doctor(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfaccel.quiet import import_tensorflow

    import_tensorflow()  # without its start-up lines, which would precede the report
    from tfaccel import doctor

    facts = doctor.collect()
    advice = doctor.advise(facts)
    if args.json:
        print(json.dumps({**facts, "advice": advice}, indent=2))
    else:
        print(doctor.format_report(facts, advice))
    return 0


def _parser():
    parser = _OneLineParser(prog="tfaccel", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    doc = sub.add_parser("doctor", help="versions, devices, driver, XLA/oneDNN, and advice")
    doc.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("launch", help="run N local workers: tfaccel launch --workers N -- "
                   "recipes/train.py ...")
    return parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "launch":
        from tfaccel.distribute import launch

        return launch.main(argv[1:])
    args = _parser().parse_args(argv)
    return _doctor(args)


if __name__ == "__main__":
    sys.exit(main())
