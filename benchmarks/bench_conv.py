"""Convolution forward, data gradient and weight gradient: clnn on every OpenCL device
beside PyTorch CPU in the same run.

    python benchmarks/bench_conv.py [--device SPEC] [--repeats 5]

Layers: LeNet-5's C1, C3 and C5 at batch 64, and a bigger 3x3 layer (N=32, C=64,
56x56, M=64, padding 1). Each clnn result is checked against PyTorch (or, without it,
the float64 loops of tests/reference.py for the LeNet layers) before timing. Writes
benchmarks/results/bench_conv.json.
"""

import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import _common  # noqa: E402

import clnn  # noqa: E402

LAYERS = [("LeNet C1", 64, 1, 32, 32, 6, 5, 5, 0), ("LeNet C3", 64, 6, 14, 14, 16, 5, 5, 0),
          ("LeNet C5", 64, 16, 5, 5, 120, 5, 5, 0), ("56x56x64 3x3", 32, 64, 56, 56, 64, 3, 3, 1)]


def references(torch, x, w, dy, pad):
    if torch is not None:
        X = torch.from_numpy(x).requires_grad_(True)
        Wt = torch.from_numpy(w).requires_grad_(True)
        y = torch.nn.functional.conv2d(X, Wt, padding=pad)
        y.backward(torch.from_numpy(dy))
        return y.detach().numpy(), X.grad.numpy(), Wt.grad.numpy()
    from reference import conv2d_backward_ref, conv2d_ref
    y = conv2d_ref(x, w, None, (1, 1), (pad, pad))
    dx, dw = conv2d_backward_ref(dy, x, w, (1, 1), (pad, pad))
    return y, dx, dw


def close(name, got, ref):
    err = np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30)
    if not err < 1e-4:
        raise SystemExit(f"{name}: clnn differs from the reference (relative error {err:.1e})")


def main(argv=None):
    ap = _common.arg_parser(__doc__)
    args = ap.parse_args(argv)
    torch = _common.torch_or_none()
    rows = []
    for name, N, C, H, W, M, R, S, pad in LAYERS:
        rng = np.random.default_rng(0)
        P, Q = H + 2 * pad - R + 1, W + 2 * pad - S + 1
        x = rng.standard_normal((N, C, H, W), dtype=np.float32)
        w = rng.standard_normal((M, C, R, S), dtype=np.float32)
        dy = rng.standard_normal((N, M, P, Q), dtype=np.float32)
        flops = 2.0 * N * M * P * Q * C * R * S
        y_ref, dx_ref, dw_ref = references(torch, x, w, dy, pad)
        row = {"layer": name, "shape": [N, C, H, W, M, R, S, pad], "ms": {}}
        for dev in _common.devices(args.device):
            X, Wd, DY = (clnn.asarray(v, device=dev) for v in (x, w, dy))
            ops = {"forward": lambda: clnn.conv2d(X, Wd, padding=pad),
                   "data grad": lambda: clnn.conv2d_backward_data(DY, Wd, x.shape,
                                                                  padding=pad),
                   "weight grad": lambda: clnn.conv2d_backward_weight(DY, X, w.shape,
                                                                      padding=pad)}
            for op, ref in zip(ops, (y_ref, dx_ref, dw_ref)):
                close(f"{name} {op}", ops[op]().get(), ref)
            key = f"clnn ({dev.name})"
            row["ms"][key] = {op: 1e3 * _common.median_time(fn, args.repeats,
                                                            sync=dev.finish)
                              for op, fn in ops.items()}
        if torch is not None:
            tx, tw, tdy = (torch.from_numpy(v) for v in (x, w, dy))
            F = torch.nn.functional
            tops = {"forward": lambda: F.conv2d(tx, tw, padding=pad),
                    "data grad": lambda: torch.nn.grad.conv2d_input(x.shape, tw, tdy,
                                                                    padding=pad),
                    "weight grad": lambda: torch.nn.grad.conv2d_weight(tx, w.shape, tdy,
                                                                       padding=pad)}
            row["ms"]["PyTorch CPU"] = {op: 1e3 * _common.median_time(fn, args.repeats)
                                        for op, fn in tops.items()}
        rows.append(row)
        for lib, t in row["ms"].items():
            total = sum(t.values())
            print(f"{name:<14} {lib:<45} fwd {t['forward']:8.2f} ms  dgrad "
                  f"{t['data grad']:8.2f} ms  wgrad {t['weight grad']:8.2f} ms  total "
                  f"{total:8.2f} ms ({3 * flops / total / 1e6:6.1f} GFLOP/s)")
        if "PyTorch CPU" in row["ms"]:
            ref_total = sum(row["ms"]["PyTorch CPU"].values())
            for lib, t in row["ms"].items():
                if lib.startswith("clnn"):
                    print(f"{'':<14} {lib} at {ref_total / sum(t.values()):.2f}x PyTorch "
                          "CPU's speed (forward + both gradients)")
    print(f"results: {_common.write_json('bench_conv', {'rows': rows}, args.json)}")


if __name__ == "__main__":
    main()
