"""Turn the benchmark JSON files into a Markdown table and PNG plots.

    python benchmarks/report.py [--results benchmarks/results]

Reads bench_gemm.json, bench_mlp.json, bench_lenet.json, bench_conv.json,
bench_tutorial.json, bench_ops.json and bench_host.json (whichever exist) and writes
report.md, gemm.png and conv.png beside them.
"""

import argparse
import json
import os

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _load(folder, name):
    path = os.path.join(folder, f"{name}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def gemm_table(data):
    libs = list(dict.fromkeys(k for row in data["rows"] for k in row["gflops"]))
    clnn_keys = [k for k in libs if k.startswith("clnn")]
    lines = ["| shape | " + " | ".join(libs) + " | " +
             " | ".join(f"{c} / {o}" for c in clnn_keys for o in libs
                        if not o.startswith("clnn")) + " |"]
    lines.append("|" + "---|" * (1 + len(libs) + len(clnn_keys) *
                                 len([o for o in libs if not o.startswith("clnn")])))
    for row in data["rows"]:
        g = row["gflops"]
        cells = [f"{g[k]:.1f}" if k in g else "" for k in libs]
        ratios = [f"{g[c] / g[o]:.2f}" if c in g and o in g else "" for c in clnn_keys
                  for o in libs if not o.startswith("clnn")]
        lines.append(f"| {row['shape']} ({row['M']}x{row['N']}x{row['K']}) | "
                     + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def conv_table(data):
    libs = list(dict.fromkeys(k for row in data["rows"] for k in row["ms"]))
    lines = ["| layer | " + " | ".join(f"{k} fwd / dgrad / wgrad ms" for k in libs) + " |",
             "|" + "---|" * (1 + len(libs))]
    for row in data["rows"]:
        cells = []
        for k in libs:
            t = row["ms"].get(k)
            cells.append(" / ".join(f"{v:.2f}" for v in t.values()) if t else "")
        lines.append(f"| {row['layer']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tutorial_table(data):
    lines = ["| device | batch | library | ms per step | pool peak GiB |", "|---|---|---|---|---|"]
    for run in data["runs"]:
        for lib, ms in run["step_ms"].items():
            peak = run.get("pool_peak_bytes_4gib" if "4 GiB" in lib else
                           "pool_peak_bytes_float16" if "float16" in lib else "pool_peak_bytes")
            lines.append(f"| {run['device']} | {run['batch']} | {lib} | "
                         f"{'did not fit' if ms is None else f'{ms:.1f}'} | "
                         f"{peak / 2**30:.2f} |" if lib.startswith("clnn") and peak else
                         f"| {run['device']} | {run['batch']} | {lib} | "
                         f"{'did not fit' if ms is None else f'{ms:.1f}'} | |")
    return "\n".join(lines)


def ops_table(data):
    refs = [r for r in ("numpy", "torch_cpu", "torch_cuda")
            if any(f"{r}_GBps" in row for row in data["rows"])]
    lines = ["| device | op | clnn GB/s | " + " | ".join(f"{r} GB/s" for r in refs) + " | "
             + " | ".join(f"clnn / {r}" for r in refs) + " |",
             "|" + "---|" * (3 + 2 * len(refs))]
    for row in data["rows"]:
        cells = [f"{row[f'{r}_GBps']:.1f}" if f"{r}_GBps" in row else "" for r in refs]
        ratios = [f"{row['clnn_GBps'] / row[f'{r}_GBps']:.2f}" if f"{r}_GBps" in row
                  else "" for r in refs]
        lines.append(f"| {row['device']} | {row['op']} | {row['clnn_GBps']:.1f} | "
                     + " | ".join(cells + ratios) + " |")
    return "\n".join(lines)


def host_table(data):
    refs = [r for r in ("torch_cpu", "torch_cuda")
            if any(f"{r}_call_us" in row for row in data["rows"])]
    lines = ["| device | op | enqueue | unplanned | call | kernel | "
             + " | ".join(f"{r} call" for r in refs) + " |",
             "|" + "---|" * (6 + len(refs))]
    def us(value):               # a blank where the run had nothing to measure
        return "" if value is None else f"{value:.1f}"

    for row in data["rows"]:
        cells = [us(row.get(key)) for key in
                 ("enqueue_us", "unplanned_enqueue_us", "call_us", "kernel_us")]
        cells += [us(row.get(f"{r}_call_us")) for r in refs]
        lines.append(f"| {row['device']} | {row['op']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def step_table(data):
    lines = ["| library | seconds per step |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in data["step_seconds"].items()]
    return "\n".join(lines)


def plots(folder, gemm, conv):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    import numpy as np
    made = []
    for name, data, key, ylabel, label in (
            ("gemm", gemm, "gflops", "GFLOP/s", lambda r: r["shape"]),
            ("conv", conv, "ms", "ms (forward + both gradients)", lambda r: r["layer"])):
        if not data:
            continue
        rows = data["rows"]
        libs = list(dict.fromkeys(k for r in rows for k in r[key]))
        fig, ax = plt.subplots(figsize=(10, 4.5))
        width = 0.8 / len(libs)
        for i, lib in enumerate(libs):
            vals = [r[key].get(lib) for r in rows]
            vals = [(sum(v.values()) if isinstance(v, dict) else v) or 0 for v in vals]
            ax.bar(np.arange(len(rows)) + i * width, vals, width, label=lib)
        ax.set_xticks(np.arange(len(rows)) + 0.4 - width / 2)
        ax.set_xticklabels([label(r) for r in rows], rotation=15, ha="right")
        ax.set_ylabel(ylabel)
        if name == "conv":
            ax.set_yscale("log")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        path = os.path.join(folder, f"{name}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        made.append(path)
    return made


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=RESULTS)
    args = ap.parse_args(argv)
    gemm, mlp, lenet, conv, tutorial, ops, host = (_load(args.results, n) for n in (
        "bench_gemm", "bench_mlp", "bench_lenet", "bench_conv", "bench_tutorial",
        "bench_ops", "bench_host"))
    parts = ["# clnn benchmark report"]
    for title, data, table in (("GEMM, float32 GFLOP/s", gemm, gemm_table),
                               ("MLP training step", mlp, step_table),
                               ("LeNet-5 training step", lenet, step_table),
                               ("Convolution", conv, conv_table),
                               ("The tutorial's step (10000-5000-1000-10)", tutorial,
                                tutorial_table),
                               ("Memory-bound ops (GB/s read + written)", ops,
                                ops_table),
                               ("Host time per op (us per call)", host, host_table)):
        if data:
            parts += [f"## {title}", f"{data.get('date', '')}, "
                      f"{data.get('machine', {}).get('blas', '')}", table(data)]
    path = os.path.join(args.results, "report.md")
    os.makedirs(args.results, exist_ok=True)
    with open(path, "w") as f:
        f.write("\n\n".join(parts) + "\n")
    for p in [path] + plots(args.results, gemm, conv):
        print(f"wrote {p}")


if __name__ == "__main__":
    main()
