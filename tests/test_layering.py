"""The layers of the code (docs/DESIGN.md) hold: no module imports one above it, and
the modules of one layer import each other without cycles. Read from the source (every
import statement, those inside functions too), so a lazy import cannot hide a cycle."""

import ast
import pathlib

import clnn

ROOT = pathlib.Path(clnn.__file__).parent
# bottom to top, as docs/DESIGN.md draws them; a module may import lower ranks only
RANKS = {"errors": 0, "cache": 1, "datasets": 1, "ptx": 1, "memory": 2, "device": 3, "programs": 4,
         "plans": 5, "profiler": 5, "cmdbuf": 5, "tuning": 6, "ops": 7, "optim": 8, "nn": 9,
         "distributed": 10, "train": 11, "tuner": 11, "selfcheck": 11, "cli": 12, "__main__": 13}


def modules():
    for f in sorted(ROOT.rglob("*.py")):
        parts = list(f.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield ".".join(parts), f


def imports(name, path):
    """Every clnn module ``name`` imports, as dotted names."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("clnn"):
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if (ROOT.parent / (sub.replace(".", "/") + ".py")).exists()
                              or (ROOT.parent / sub.replace(".", "/")).is_dir() else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("clnn"))
    return found


def rank(module):
    parts = module.split(".")
    return None if len(parts) == 1 else RANKS[parts[1]]


def test_no_module_imports_a_layer_above_it():
    bad = []
    for name, path in modules():
        own = rank(name)
        if own is None:               # the package itself: the top, it may import all
            continue
        for dep in imports(name, path):
            if dep == "clnn":
                # the public namespace (clnn.gemm, clnn.asarray): complete once the ops
                # are imported, so only modules above the ops use it
                if own <= RANKS["ops"]:
                    bad.append(f"{name} imports the clnn package")
                continue
            if dep.split(".")[1] == name.split(".")[1]:
                continue              # within one layer: checked for cycles below
            if rank(dep) >= own:
                bad.append(f"{name} (rank {own}) imports {dep} (rank {rank(dep)})")
    assert not bad, "\n".join(bad)


def test_no_import_cycles_within_a_layer():
    graph = {name: {d for d in imports(name, path) if d != "clnn"}
             for name, path in modules()}
    for package in ("clnn.ops", "clnn.nn"):
        graph.pop(package, None)      # a package's __init__ gathers its modules
    state = {}

    def visit(node, trail):
        if state.get(node) == "done":
            return
        assert state.get(node) != "open", "import cycle: " + " -> ".join(trail + [node])
        state[node] = "open"
        for dep in graph.get(node, ()):
            if dep.split(".")[:2] == node.split(".")[:2]:
                visit(dep, trail + [node])
        state[node] = "done"
    for node in graph:
        visit(node, [])
