"""Every import arrow in the package points down (docs/architecture.md draws them).

The package's modules are parsed with :mod:`ast` (imports inside functions and under
``TYPE_CHECKING`` count too: a lazy import is still an arrow). Two rules:

* layers: a module may import only from its own layer or the layers below it;
* no cycles: the module graph is acyclic, so even inside a layer every arrow points one way.

Entry points get no exemption: a ``coadapt/controller/__main__.py`` that imported the CLI was
an upward arrow (and a package-level cycle) that an exemption here once hid.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "coadapt"

#: Bottom to top; a top-level part of ``coadapt`` not listed here fails the test (place it).
LAYERS: tuple[tuple[str, ...], ...] = (
    # version, free_port, wire formats, crash-safe file replacement, compiled-kernel shim
    ("coadapt", "coadapt.ports", "coadapt.protocol", "coadapt.atomicfile", "coadapt._jit"),
    ("coadapt.goodput",),  # the goodput model
    ("coadapt.policies", "coadapt.train", "coadapt.executors", "coadapt.sparse"),
    ("coadapt.sim", "coadapt.serve"),  # the simulator runs the policies; serving
    ("coadapt.controller",),  # store, loop, API, dashboard
    # tuning on top of the controller's store and job specs; the model registry beside it
    ("coadapt.tune", "coadapt.registry", "coadapt.deploy"),
    ("coadapt.service",),  # the composition root
    ("coadapt.cli",),  # the one CLI package
)


def _modules() -> dict[str, Path]:
    """Module name -> file, for every module of a real package (has ``__init__.py``)."""
    out: dict[str, Path] = {}
    for path in ROOT.rglob("*.py"):
        if not all(
            (d / "__init__.py").exists()
            for d in [path.parent, *path.parent.parents]
            if d.is_relative_to(ROOT)
        ):
            continue  # data that happens to be Python (the demo's job scripts)
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    targets.add(sub if sub in mods else base)
        edges[name] = {t for t in targets if t in mods and t != name}
    return edges


def _rank(module: str) -> int:
    """The layer of ``module``: that of the longest ``LAYERS`` entry it is or lies under."""
    found = [
        (len(part), i)
        for i, layer in enumerate(LAYERS)
        for part in layer
        if module == part or module.startswith(part + ".")
    ]
    length, rank = max(found, default=(0, -1))
    if rank < 0 or (length == len("coadapt") and module != "coadapt"):
        pytest.fail(f"{module} is in no layer: add its package to LAYERS (and the docs)")
    return rank


MODS = _modules()
EDGES = _edges(MODS)


def test_the_parser_sees_the_known_arrows() -> None:
    """Guards the two rules below against a parser that finds nothing."""
    assert "coadapt.tune.runner" in EDGES["coadapt.service"]
    assert "coadapt.service" in EDGES["coadapt.cli.controller"]  # a function-level import
    assert "coadapt.controller.store" in EDGES["coadapt.tune.store"]
    assert len(MODS) > 60


def test_every_import_points_down_the_layers() -> None:
    upward = [
        f"{src} (layer {_rank(src)}) imports {dst} (layer {_rank(dst)})"
        for src, dsts in EDGES.items()
        for dst in dsts
        if _rank(dst) > _rank(src)
    ]
    assert not upward, "upward imports:\n" + "\n".join(sorted(upward))


def test_the_module_graph_has_no_cycle() -> None:
    graph = {m: set(ds) for m, ds in EDGES.items()}
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    path: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle = [*path[path.index(d) :], d]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if d not in state:
                visit(d)
        path.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)


#: The modules that may open database sessions; everything else reads and writes through
#: :class:`coadapt.controller.store.Store` (or tuning's ``TuneStore`` on top of it).
SESSION_OWNERS = {
    "coadapt.controller.store",
    "coadapt.controller.db",
    "coadapt.tune.store",
    "coadapt.registry.store",
    "coadapt.deploy.store",
}


def test_only_the_stores_open_database_sessions() -> None:
    opened = set()
    for name, path in MODS.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.ImportFrom)
                and node.module == "sqlalchemy.orm"
                and any(a.name in ("Session", "sessionmaker") for a in node.names)
            ):
                opened.add(name)
    assert opened - SESSION_OWNERS == set(), "go through the Store instead"
    assert "coadapt.controller.store" in opened  # the scan sees the one that must be there
