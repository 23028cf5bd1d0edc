"""Convolution forward, data gradient and weight gradient: clnn on every OpenCL device
beside PyTorch CPU (and cuDNN through PyTorch CUDA, TF32 off, on a machine with an
NVIDIA GPU) in the same run.

    python benchmarks/bench_conv.py [--device SPEC] [--repeats 5] [--layers depthwise,...]
                                    [--tile-direct on,off]

Layers: LeNet-5's C1, C3 and C5 at batch 64, three ResNet-like 3x3 layers (N=32, C=M=64
at 56x56, 128 at 28x28 and 256 at 14x14, padding 1) and a ResNet stem (N=8, 3
channels, 224x224, 64 filters of 7x7, stride 2, padding 3), a MobileNet-like depthwise
3x3 layer (N=32, C=256, 56x56, groups=256), a dilated 3x3 layer (dilation 2, as
DeepLab's), two CIFAR-like 3x3 layers at batch 64 (the 3-channel 32x32 input layer
with 32 filters, and 32 to 32 channels at 32x32) and a ResNet stage's two
downsampling layers at batch 32 (3x3 stride 2 from 64 to 128 channels, and the 1x1
stride-2 projection from 256 to 512, both 56x56 to 28x28), and two of a ResNet-50
bottleneck's 1x1 layers at batch 32 (64 to 256 channels at 56x56, 512 to 128 at
28x28). Each clnn result is checked
against PyTorch (or, without it, the float64 loops of tests/reference.py) before
timing. Writes benchmarks/results/bench_conv.json.
"""

import contextlib
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import _common  # noqa: E402

import clnn  # noqa: E402
from clnn.tuner import median_kernel_time  # noqa: E402

# (name, N, C, H, W, M, R, S, padding, stride[, dilation, groups])
LAYERS = [("LeNet C1", 64, 1, 32, 32, 6, 5, 5, 0, 1), ("LeNet C3", 64, 6, 14, 14, 16, 5, 5, 0, 1),
          ("LeNet C5", 64, 16, 5, 5, 120, 5, 5, 0, 1),
          ("56x56x64 3x3", 32, 64, 56, 56, 64, 3, 3, 1, 1),
          ("28x28x128 3x3", 32, 128, 28, 28, 128, 3, 3, 1, 1),
          ("14x14x256 3x3", 32, 256, 14, 14, 256, 3, 3, 1, 1),
          ("224x224 7x7 s2 stem", 8, 3, 224, 224, 64, 7, 7, 3, 2),
          ("depthwise 56x56x256 3x3", 32, 256, 56, 56, 256, 3, 3, 1, 1, 1, 256),
          ("dilated 28x28x64 3x3 d2", 16, 64, 28, 28, 64, 3, 3, 2, 1, 2, 1),
          ("CIFAR 32x32x3 3x3", 64, 3, 32, 32, 32, 3, 3, 1, 1),
          ("CIFAR 32x32x32 3x3", 64, 32, 32, 32, 32, 3, 3, 1, 1),
          ("3x3 s2 56->28 64->128", 32, 64, 56, 56, 128, 3, 3, 1, 2),
          ("1x1 s2 56->28 256->512", 32, 256, 56, 56, 512, 1, 1, 0, 2),
          ("1x1 56x56 64->256", 32, 64, 56, 56, 256, 1, 1, 0, 1),
          ("1x1 28x28 512->128", 32, 512, 28, 28, 128, 1, 1, 0, 1)]


@contextlib.contextmanager
def _tile_direct(setting):
    """conv.TILE_DIRECT_MAXM as ``setting`` says ("on": 16, "off": 0, None: as it is):
    convt.cl's forward passes and data gradients and convw.cl's weight gradients, or
    the tiled GEMM for all three."""
    conv = sys.modules["clnn.ops.conv"]
    old = conv.TILE_DIRECT_MAXM
    if setting:
        conv.TILE_DIRECT_MAXM = 16 if setting == "on" else 0
    try:
        yield
    finally:
        conv.TILE_DIRECT_MAXM = old


def references(torch, x, w, dy, pad, st, dl=1, g=1):
    if torch is not None:
        X = torch.from_numpy(x).requires_grad_(True)
        Wt = torch.from_numpy(w).requires_grad_(True)
        y = torch.nn.functional.conv2d(X, Wt, padding=pad, stride=st, dilation=dl, groups=g)
        y.backward(torch.from_numpy(dy))
        return y.detach().numpy(), X.grad.numpy(), Wt.grad.numpy()
    from reference import conv2d_general_ref
    y, backward = conv2d_general_ref(x, w, None, (st, st), (pad, pad), (dl, dl), g)
    return (y,) + tuple(backward(dy))


def torch_ops(torch, x, w, dy, pad, st, dl=1, g=1, cuda=False):
    tx, tw, tdy = (torch.from_numpy(v) for v in (x, w, dy))
    if cuda:
        tx, tw, tdy = tx.cuda(), tw.cuda(), tdy.cuda()
    F = torch.nn.functional
    kw = dict(padding=pad, stride=st, dilation=dl, groups=g)
    return {"forward": lambda: F.conv2d(tx, tw, **kw),
            "data grad": lambda: torch.nn.grad.conv2d_input(x.shape, tw, tdy, **kw),
            "weight grad": lambda: torch.nn.grad.conv2d_weight(tx, w.shape, tdy, **kw)}


def close(name, got, ref):
    err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
    if not err < 1e-4:
        raise SystemExit(f"{name}: clnn differs from the reference (relative error {err:.1e})")


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    ap.add_argument("--layers", help="comma-separated words: only layers whose name has "
                    "one (e.g. depthwise,LeNet)")
    ap.add_argument("--tile-direct", default="",
                    help="on,off: time clnn with the GPU path's direct kernels (convt.cl, "
                         "convw.cl: conv.TILE_DIRECT_MAXM) and without, each also in "
                         "kernel time")
    args = ap.parse_args(argv)
    settings = [v for v in args.tile_direct.split(",") if v] or [None]
    if any(v not in ("on", "off", None) for v in settings):
        raise SystemExit(f"--tile-direct takes on and off, got {args.tile_direct!r}")
    torch = _common.torch_or_none()
    rows = []
    cuda = _common.torch_cuda()
    words = args.layers.split(",") if args.layers else None
    for name, N, C, H, W, M, R, S, pad, st, *rest in LAYERS:
        if words and not any(wd in name for wd in words):
            continue
        dl, g = rest if rest else (1, 1)
        rng = np.random.default_rng(0)
        P = (H + 2 * pad - dl * (R - 1) - 1) // st + 1
        Q = (W + 2 * pad - dl * (S - 1) - 1) // st + 1
        x = rng.standard_normal((N, C, H, W), dtype=np.float32)
        w = rng.standard_normal((M, C // g, R, S), dtype=np.float32)
        dy = rng.standard_normal((N, M, P, Q), dtype=np.float32)
        flops = 2.0 * N * M * P * Q * (C // g) * R * S
        y_ref, dx_ref, dw_ref = references(torch, x, w, dy, pad, st, dl, g)
        row = {"layer": name, "shape": [N, C, H, W, M, R, S, pad, st, dl, g], "ms": {}}
        for dev in _common.devices(args.device):
            X, Wd, DY = (clnn.asarray(v, device=dev) for v in (x, w, dy))
            kw = dict(padding=pad, stride=st, dilation=dl, groups=g)
            ops = {"forward": lambda: clnn.conv2d(X, Wd, **kw),
                   "data grad": lambda: clnn.conv2d_backward_data(DY, Wd, x.shape, **kw),
                   "weight grad": lambda: clnn.conv2d_backward_weight(DY, X, w.shape,
                                                                      **kw)}
            for setting in settings:
                with _tile_direct(setting):
                    for op, ref in zip(ops, (y_ref, dx_ref, dw_ref)):
                        close(f"{name} {op}", ops[op]().get(), ref)
                    key = f"clnn ({dev.name})" + (f" [direct tiles {setting}]" if setting
                                                  else "")
                    row["ms"][key] = {op: 1e3 * _common.median_time(fn, args.repeats,
                                                                    sync=dev.finish)
                                      for op, fn in ops.items()}
                    if setting:
                        row["ms"][key + " kernels"] = {
                            op: 1e3 * median_kernel_time(fn, dev, args.repeats)
                            for op, fn in ops.items()}
        if torch is not None:
            tops = torch_ops(torch, x, w, dy, pad, st, dl, g)
            row["ms"]["PyTorch CPU"] = {op: 1e3 * _common.median_time(fn, args.repeats)
                                        for op, fn in tops.items()}
        if cuda is not None:
            tops = torch_ops(cuda, x, w, dy, pad, st, dl, g, cuda=True)
            for op, ref in zip(tops, (y_ref, dx_ref, dw_ref)):
                close(f"{name} {op} (cuDNN)", tops[op]().cpu().numpy(), ref)
            row["ms"]["cuDNN (PyTorch CUDA)"] = {
                op: 1e3 * _common.cuda_time(cuda, fn, args.repeats) for op, fn in tops.items()}
        rows.append(row)
        for lib, t in row["ms"].items():
            total = sum(t.values())
            print(f"{name:<14} {lib:<45} fwd {t['forward']:8.2f} ms  dgrad "
                  f"{t['data grad']:8.2f} ms  wgrad {t['weight grad']:8.2f} ms  total "
                  f"{total:8.2f} ms ({3 * flops / total / 1e6:6.1f} GFLOP/s)")
        for peer in ("PyTorch CPU", "cuDNN (PyTorch CUDA)"):
            if peer not in row["ms"]:
                continue
            ref_total = sum(row["ms"][peer].values())
            for lib, t in row["ms"].items():
                if lib.startswith("clnn"):
                    print(f"{'':<14} {lib} at {ref_total / sum(t.values()):.2f}x {peer}'s "
                          "speed (forward + both gradients)")
    print(f"results: {_common.write_json('bench_conv', {'rows': rows}, args.json)}")


if __name__ == "__main__":
    main()
