"""The `tfaccel` command: `tfaccel doctor [--json]`, `tfaccel plan ...`, `tfaccel launch ...`.

A bad argument is one `error: ...` line on stderr and exit code 2, before
TensorFlow is imported, as in the recipes.
"""

import argparse
import json
import os
import sys

from tfaccel import doctor
from tfaccel.choices import GPT_SIZES, MODELS, OPTIMIZERS, PRECISIONS
from tfaccel.distribute import launch
from tfaccel.errors import ConfigError, TfaccelError
from tfaccel.performance import memory_profile, plan
from tfaccel.quiet import import_tensorflow

EXIT_BAD_INPUT = 2


class _OneLineParser(argparse.ArgumentParser):
    """argparse with its usage block replaced by one 'error:' line that says where help is."""

    def error(self, message):
        print(f"error: {message}: see {self.prog} --help", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def _doctor(args):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import_tensorflow()  # without its start-up lines, which would precede the report

    facts = doctor.collect()
    advice = doctor.advise(facts)
    if args.json:
        print(json.dumps({**facts, "advice": advice}, indent=2))
    else:
        print(doctor.format_report(facts, advice))
    return 0


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def _shape(text):
    try:
        dims = tuple(int(d) for d in text.split(","))
    except ValueError:
        dims = ()
    if not dims or min(dims) <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape such as 8,8,1")
    return dims


def _device_memory(text):
    try:
        plan.parse_device_memory(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


_ONEDNN = {"auto": None, "on": True, "off": False}


def _plan_profile(args):
    """What --model names: a `MemoryProfile` for gpt and bert (by size, nothing built, in
    milliseconds), else the zoo name or file the plan builds and traces."""

    if args.model in ("gpt", "bert"):
        if args.measure:
            raise ConfigError(f"--measure needs a model to run: --model={args.model} is planned "
                              "from its size (give a zoo name or a .keras file to measure)")
        if args.onednn != "auto":
            raise ConfigError(f"--onednn={args.onednn} applies to a traced model: --model="
                              f"{args.model} is planned from its size, without the host's "
                              "kernels (give a zoo name or a .keras file)")
        layers, heads, d_model, context = memory_profile.GPT_SIZES[args.gpt_size]
        # without --context, a --sequence_length sets it too (a model made for that length)
        context = args.context or args.sequence_length or context
        length = args.sequence_length or context
        if length > context:
            raise ConfigError(f"--sequence_length={length} is longer than --context={context}: "
                              "a step trains on at most the model's context")
        return memory_profile.profile_transformer(
            args.gpt_layers or layers, args.gpt_d_model or d_model, args.gpt_heads or heads,
            args.vocab_size, length, tied=not args.untied, half=args.precision != "float32",
            context=context, encoder=args.model == "bert", num_classes=args.num_classes,
            name=args.model)
    if args.model not in MODELS and not os.path.isfile(args.model):
        raise SystemExit(_bad(f"--model={args.model}: not gpt, bert, a zoo model "
                              f"({', '.join(MODELS)}) or an existing .keras/.h5 file"))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    import_tensorflow()
    return args.model


def _bad(message):
    print(f"error: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _plan(args):
    settings = plan.PlanSettings(
        batch_size=args.batch_size, precision=args.precision, optimizer=args.optimizer,
        grad_accum_steps=args.grad_accum_steps, recompute=args.recompute,
        replicas=args.replicas, stages=args.stages, micro_batches=args.micro_batches,
        device_memory=args.device_memory)
    try:
        settings.checked()
        result = plan.plan_memory(_plan_profile(args), settings, input_shape=args.input_shape,
                                  num_classes=args.num_classes,
                                  sequence_length=args.sequence_length, method=args.method,
                                  measure=args.measure, onednn=_ONEDNN[args.onednn])
    except TfaccelError as e:
        return _bad(str(e))
    print(json.dumps(result.to_json(), indent=2) if args.json else plan.format_plan(result))
    return 0


def _add_plan_parser(sub):
    p = sub.add_parser("plan", help="will this model train on this device? memory per device, "
                       "verdict, changes that fit")
    p.add_argument("--model", default="cnn", help="gpt or bert (a decoder or an encoder "
                   "described by size), a zoo model, or a .keras/.h5 file (traced)")
    p.add_argument("--input_shape", type=_shape, default=(8, 8, 1),
                   help="a zoo model's input (default: digits, 8,8,1)")
    p.add_argument("--num_classes", type=_positive_int, default=10)
    p.add_argument("--gpt_size", default="tiny", choices=tuple(GPT_SIZES),
                   help="a named size for gpt/bert; --gpt_* and --context override it")
    for name in ("gpt_layers", "gpt_heads", "gpt_d_model"):
        p.add_argument(f"--{name}", type=_positive_int, default=None)
    p.add_argument("--context", type=_positive_int, default=None,
                   help="gpt/bert: the model's maximum length (its position embedding)")
    p.add_argument("--sequence_length", type=_positive_int, default=None,
                   help="the length a step trains on (gpt/bert: default the context); a "
                   "model file's variable-length input is traced at it")
    p.add_argument("--method", default="graph", choices=("graph", "layers"),
                   help="a built model's activations: from the traced train step (graph) or "
                   "its layers' output shapes")
    p.add_argument("--measure", action="store_true",
                   help="also run 1/8, 1/4 and 1/2 of the batch in 3 fresh processes "
                   "and scale the peaks")
    p.add_argument("--onednn", default="auto", choices=tuple(_ONEDNN),
                   help="a traced model's host CPU kernels: off plans (and --measure runs) "
                   "TensorFlow's own, as an AVX2-only CPU runs them; auto: this machine's")
    p.add_argument("--vocab_size", type=_positive_int, default=256)
    p.add_argument("--untied", action="store_true", help="a separate output projection")
    p.add_argument("--batch_size", type=_positive_int, default=32, help="examples per device")
    p.add_argument("--precision", default="float32", choices=PRECISIONS)
    p.add_argument("--optimizer", default="adam", choices=OPTIMIZERS)
    p.add_argument("--grad_accum_steps", type=_positive_int, default=1)
    p.add_argument("--recompute", action="store_true")
    p.add_argument("--replicas", type=_positive_int, default=1)
    p.add_argument("--stages", type=_positive_int, default=1)
    p.add_argument("--micro_batches", type=_positive_int, default=1)
    p.add_argument("--device_memory", type=_device_memory, default=None,
                   help="24GB, 16000MB, or a card: rtx4090, a100-80gb, ...")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _parser():
    parser = _OneLineParser(prog="tfaccel", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    doc = sub.add_parser("doctor", help="versions, devices, driver, XLA/oneDNN, and advice")
    doc.add_argument("--json", action="store_true", help="machine-readable output")
    _add_plan_parser(sub)
    sub.add_parser("launch", help="run N local workers: tfaccel launch --workers N -- "
                   "recipes/train.py ...")
    return parser


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "launch":
        return launch.main(argv[1:])
    args = _parser().parse_args(argv)
    return _plan(args) if args.command == "plan" else _doctor(args)


if __name__ == "__main__":
    sys.exit(main())
