"""The main job until the network API lands: device table, then every op against numpy.

Each check runs the op once to compare with a float64 numpy reference, then times it
(median of a few runs, queue finished) beside numpy's own float32 version.
"""

import statistics
import time

import numpy as np

import clnn


def _time(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _checks(rng, n, rows, cols):
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    z = rng.standard_normal((rows, cols)).astype(np.float32) * 3
    t = np.eye(cols, dtype=np.float32)[rng.integers(0, cols, rows)]
    b = rng.standard_normal(cols).astype(np.float32)
    x64, z64 = x.astype(np.float64), z.astype(np.float64)
    X, Y, Z, T, B = (clnn.asarray(v) for v in (x, y, z, t, b))
    sig = 1 / (1 + np.exp(-x64))
    lsm = z64 - z64.max(1, keepdims=True)
    lsm -= np.log(np.exp(lsm).sum(1, keepdims=True))
    # (name, shape text, clnn call returning an array, float64 reference or
    #  (reference, scale of its terms), numpy call)
    return [
        ("sigmoid", f"{n}", lambda: clnn.sigmoid(X), sig, lambda: 1 / (1 + np.exp(-x))),
        ("tanh'", f"{n}", lambda: clnn.activation_derivative("tanh", a=X),
         1 - x64 ** 2, lambda: 1 - x * x),
        ("relu backward", f"{n}", lambda: clnn.activation_backward("relu", Y, z=X),
         y * (x64 > 0), lambda: y * (x > 0)),
        ("hadamard", f"{n}", lambda: clnn.hadamard(X, Y), x64 * y, lambda: x * y),
        ("axpy", f"{n}", lambda: clnn.axpy(0.5, X, Y, out=clnn.empty(n)), 0.5 * x64 + y,
         lambda: 0.5 * x + y),
        ("bias_add", f"{rows}x{cols}", lambda: clnn.bias_add(Z, B), z64 + b, lambda: z + b),
        ("bias_grad", f"{rows}x{cols}", lambda: clnn.bias_grad(Z), z64.sum(0),
         lambda: z.sum(0)),
        ("sum", f"{n}", lambda: clnn.sum(X), (x64.sum(), np.abs(x64).sum()), lambda: x.sum()),
        ("max axis=1", f"{rows}x{cols}", lambda: clnn.max(Z, axis=1), z64.max(1),
         lambda: z.max(1)),
        # a dot product of random vectors cancels: judge it against sum |x y|
        ("dot", f"{n}", lambda: clnn.dot(X, Y), (x64 @ y, np.abs(x64 * y).sum()),
         lambda: x @ y),
        ("nrm2", f"{n}", lambda: clnn.nrm2(X), np.sqrt(x64 @ x64), lambda: np.linalg.norm(x)),
        ("softmax", f"{rows}x{cols}", lambda: clnn.softmax(Z), np.exp(lsm),
         lambda: np.exp(z - z.max(1, keepdims=True))),
        ("log_softmax", f"{rows}x{cols}", lambda: clnn.log_softmax(Z), lsm,
         lambda: z - np.log(np.exp(z).sum(1, keepdims=True))),
        ("softmax x-entropy", f"{rows}x{cols}", lambda: clnn.softmax_cross_entropy(Z, T)[0],
         -(t * lsm).sum() / rows, lambda: -(t * z).sum()),
    ]


def main(quick=False):
    from .device import print_devices
    print("OpenCL devices")
    print("--------------")
    print_devices()
    dev = clnn.device()
    print(f"\nSelf-check on {dev.name} [{dev.facts.platform}]: every op against a float64 "
          "numpy reference, then timed beside numpy (float32, median).\n")
    n, rows, cols = (10_007, 101, 10) if quick else (1_000_003, 4096, 10)
    rng = np.random.default_rng(0)
    header = f"{'op':<20}{'shape':>12}{'rel. error':>12}{'clnn ms':>10}{'numpy ms':>10}  result"
    print(header)
    print("-" * len(header))
    failures = 0
    for name, shape, run, ref, np_fn in _checks(rng, n, rows, cols):
        got = run().get().astype(np.float64)
        ref, scale = ref if isinstance(ref, tuple) else (ref, None)
        ref = np.asarray(ref, dtype=np.float64)
        scale = np.max(np.abs(ref)) if scale is None else scale
        err = float(np.max(np.abs(got - ref)) / max(scale, 1e-30))
        ok = err < 1e-4
        failures += not ok
        t_cl = _time(lambda: (run(), dev.finish()), 5) * 1e3
        t_np = _time(np_fn, 5) * 1e3
        print(f"{name:<20}{shape:>12}{err:>12.1e}{t_cl:>10.2f}{t_np:>10.2f}  "
              f"{'ok' if ok else 'FAIL'}")
    s = dev.pool.stats()
    print(f"\npool: peak {s['peak_bytes'] / 2**20:.1f} MiB of a {s['budget'] / 2**30:.1f} GiB "
          f"budget, {s['allocations']} real allocations for {s['requests']} requests")
    print("all ops match numpy" if not failures else f"{failures} op(s) FAILED")
    return 1 if failures else 0
