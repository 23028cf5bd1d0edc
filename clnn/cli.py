"""The ``clnn`` command: devices, render, selfcheck, train, tune, bench."""

import argparse
import sys


def _devices(args):
    from .device import print_devices
    return 0 if print_devices(extensions=args.extensions) else 1


def _parse_value(text):
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    return text


def _render(args):
    from . import programs
    templates = programs.registered()
    if args.template not in templates:
        print(f"unknown template {args.template!r}; templates: {', '.join(sorted(templates))}",
              file=sys.stderr)
        return 2
    params = {}
    for item in args.param:
        name, _, value = item.partition("=")
        if not value:
            print(f"--param takes NAME=VALUE, got {item!r}", file=sys.stderr)
            return 2
        params[name] = _parse_value(value)
    params["dtype"] = args.dtype
    sys.stdout.write(programs.render(args.template, programs.complete(args.template, params)))
    return 0


def _selfcheck(args):
    from .selfcheck import main
    return main(quick=args.quick)


def _train(args):
    from . import train
    job = {"mnist": train.mnist, "lenet5": train.lenet5}[args.task]
    kw = {} if args.epochs is None else {"epochs": args.epochs}
    if args.lr is not None:
        kw["lr"] = args.lr
    job(seed=args.seed, out=args.out, device=args.device, optimizer=args.optimizer,
        progress=False if args.no_progress else None, resume=args.resume,
        precision=args.precision, **kw)
    return 0


def _bench(args):
    """Run benchmarks/bench_{gemm,mlp,lenet,conv,tutorial,ops,host,engines}.py and report.py
    from a checkout."""
    import importlib.util
    import os
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "benchmarks")
    if not os.path.isdir(folder):
        print("clnn bench runs the scripts in a source checkout's benchmarks/ folder, "
              "which this installation lacks", file=sys.stderr)
        return 2
    from tqdm.auto import tqdm
    names = ["bench_gemm", "bench_mlp", "bench_lenet", "bench_conv", "bench_tutorial",
             "bench_ops", "bench_host",
             "bench_engines"]     # (the last says so and returns where no device has engines)
    dev = ["--device", args.device] if args.device else []
    quick = {"bench_gemm": ["--sizes", "512,1024", "--no-dense", "--repeats", "3"],
             "bench_mlp": ["--repeats", "3"], "bench_lenet": ["--repeats", "3"],
             "bench_conv": ["--repeats", "3"], "bench_tutorial": ["--repeats", "2"],
             "bench_ops": ["--scale", "0.25", "--repeats", "3"],
             "bench_host": ["--repeats", "3", "--calls", "50"],
             "bench_engines": ["--sizes", "1024,2048", "--repeats", "3"]}
    sys.path.insert(0, folder)
    for name in tqdm(names + ["report"], unit="benchmark", disable=args.no_progress):
        spec = importlib.util.spec_from_file_location(name, os.path.join(folder, name + ".py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.main([] if name == "report" else dev + (quick[name] if args.quick else []))
    return 0


def _tune(args):
    from .tuner import tune
    kernels = ("gemm", "conv") if args.what == "all" else (args.what,)
    tune(kernels, device=args.device, quick=args.quick,
         progress=not args.no_progress, formats=args.format)
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="clnn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("devices", help="list every OpenCL platform and device with its facts")
    p.add_argument("--extensions", action="store_true",
                   help="also list each device's OpenCL extensions")
    p = sub.add_parser("render", help="print the OpenCL source a template renders to")
    p.add_argument("template", help="template stem, e.g. elementwise, reduce, gemm")
    p.add_argument("--dtype", default="float32",
                   choices=["float32", "float64", "float16", "bfloat16"])
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="set a template parameter (repeatable); for gemm, uppercase "
                        "names (MWG=64) set tile parameters")
    p = sub.add_parser("selfcheck", help="check every op against numpy, with timings")
    p.add_argument("--quick", action="store_true", help="small sizes only")
    p = sub.add_parser("train", help="train a network on real data: mnist (dense), "
                                     "lenet5 (convolutional)")
    p.add_argument("task", choices=["mnist", "lenet5"])
    p.add_argument("--epochs", type=int, help="default: 20 for mnist, 15 for lenet5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw"],
                   help="SGD with momentum 0.9 (default), or Adam/AdamW (lr 1e-3)")
    p.add_argument("--lr", type=float, help="learning rate (default: 0.1 for mnist, 0.02 "
                   "for lenet5 with SGD; 1e-3 with Adam)")
    p.add_argument("--out", default="results", help="folder for the model and the PNG")
    p.add_argument("--device", help="device spec (default: CLNN_DEVICE, else GPU, else PoCL)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--resume", metavar="NPZ", help="continue from a checkpoint this job "
                   "saved (it saves one after every epoch): the same batches and updates "
                   "as a run that never stopped")
    p.add_argument("--precision", default="float32",
                   choices=["float32", "float16", "bfloat16"],
                   help="float16: mixed precision (float16 activations and weight copies, "
                        "float32 master weights, dynamic loss scaling); bfloat16: the "
                        "same in bfloat16, without loss scaling")
    p = sub.add_parser("tune", help="search GEMM/convolution tile parameters for this "
                                    "device and store them in the user's tuning database")
    p.add_argument("what", nargs="?", default="all", choices=["gemm", "conv", "all"])
    p.add_argument("--device", help="device spec (default: CLNN_DEVICE, else GPU, else PoCL)")
    p.add_argument("--quick", action="store_true", help="fewer candidates, smaller problems")
    p.add_argument("--format", action="append",
                   choices=["float32", "tf32", "float16", "bfloat16"],
                   help="tune this format only (repeatable; default: float32, and tf32 "
                        "and float16 where the device has matrix engines; bfloat16 "
                        "takes float16's winners unless tuned itself)")
    p.add_argument("--no-progress", action="store_true")
    p = sub.add_parser("bench", help="run the GEMM, MLP, LeNet-5 and convolution "
                                     "benchmarks and write JSON, a Markdown table and "
                                     "PNG plots")
    p.add_argument("--device", help="one device (default: every device found)")
    p.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    p.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    handler = {"devices": _devices, "render": _render, "selfcheck": _selfcheck,
               "train": _train, "tune": _tune, "bench": _bench}[args.command]
    from .errors import ClnnError
    try:
        return handler(args)
    except ClnnError as exc:
        print(f"clnn: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
