"""The `tfaccel` command: `tfaccel doctor [--json]`, `tfaccel launch ...`."""

import argparse
import json
import os
import sys


def _doctor(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfaccel import doctor

    facts = doctor.collect()
    advice = doctor.advise(facts)
    if args.json:
        print(json.dumps({**facts, "advice": advice}, indent=2))
    else:
        print(doctor.format_report(facts, advice))
    return 0


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "launch":
        from tfaccel import launch

        return launch.main(argv[1:])
    parser = argparse.ArgumentParser(prog="tfaccel", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    doc = sub.add_parser("doctor", help="versions, devices, driver, XLA/oneDNN, and advice")
    doc.add_argument("--json", action="store_true", help="machine-readable output")
    sub.add_parser("launch", help="run N local workers: tfaccel launch --workers N -- recipes/train.py ...")
    args = parser.parse_args(argv)
    return _doctor(args)


if __name__ == "__main__":
    sys.exit(main())
