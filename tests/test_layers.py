"""nvfs's layers import only downwards, and no module imports itself back through others.

Every module under nvfs/ is read with ``ast``; nothing is imported, so the test sees imports
under ``if TYPE_CHECKING:`` and inside functions as well as those at the top. Each of them is a
dependency a reader has to follow, and a cycle among them (even one only a type checker
follows) means two modules that cannot be understood, or moved, one without the other.

The rules are the data below; docs/ARCHITECTURE.md draws the same picture.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

# --- The rules -----------------------------------------------------------------------------

# The layer of each top-level module or package of nvfs ("__init__" is nvfs/__init__.py). A new
# one fails test_every_module_has_a_layer until it is placed here.
LAYER_OF = {
    # command line, daemon life cycle, -o options: the wiring of all the layers below
    "__main__": "entry",
    "cli": "entry",
    "daemon": "entry",
    "options": "entry",
    "option_registry": "entry",
    "option_docs": "entry",
    "fuse": "fuse",  # kernel requests -> vfs calls
    "vfs": "vfs",  # inodes, open files, write buffers, read-ahead
    "store": "store",  # manifests, chunk format, dedup, GC, chunk processes
    "formats": "formats",  # checkpoint file layouts (torch.save, safetensors) -> typed regions
    "codec": "codec",  # byte planes and entropy coders
    "backend": "backend",  # object keys on a directory, S3, a stage
    # the package's version and process-wide helpers, importing nothing of nvfs
    "__init__": "support",
    "gil": "support",
    "heap": "support",
    "testing": "testing",  # helpers for tests and benchmarks: may import anything, used by none of nvfs
}

# The layers each layer may import besides its own. Anything missing here is forbidden: a
# lower layer importing a higher one, codec and backend importing each other, anything but
# tests and benchmarks importing nvfs.testing.
MAY_IMPORT = {
    "entry": {"fuse", "vfs", "store", "formats", "codec", "backend", "support"},
    "fuse": {"vfs", "support"},
    # The vfs hands the bytes a writer writes to the layout tracker (formats) as they go by.
    "vfs": {"store", "formats", "support"},
    "store": {"codec", "backend", "support"},
    "formats": {"codec"},
    "codec": {"support"},
    "backend": {"support"},
    "support": set(),
    "testing": {"entry", "fuse", "vfs", "store", "formats", "codec", "backend", "support"},
}

# Where a layer may use only some modules of a layer it may import: (importer, imported) ->
# those modules. The formats know the codec's vocabulary (Region, ElementKind), not its coders.
ONLY_MODULES = {
    ("formats", "codec"): {"nvfs.codec.base"},
}

# -------------------------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "nvfs"


@dataclass(frozen=True)
class Import:
    """One import statement's dependency of module ``source`` on module ``target``."""

    source: str
    target: str
    path: Path
    line: int
    where: str  # "", " (under TYPE_CHECKING)" or " (in a function)"

    @property
    def place(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def module_files() -> dict[str, Path]:
    """Every Python module of nvfs by dotted name (a package by its ``__init__.py``)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


MODULES = module_files()


def layer_key(module: str) -> str:
    """The key of ``module`` in LAYER_OF: its top-level module or package under nvfs."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def is_native(package: str, name: str) -> bool:
    """Whether ``package.name`` is a compiled extension (its C or C++ source or its built library
    lies in the package): a submodule that imports nothing of nvfs."""
    init = MODULES.get(package)
    if init is None or init.name != "__init__.py":
        return False
    return any(path.suffix != ".py" for path in init.parent.glob(f"{name}.*"))


def existing_module(dotted: str) -> str | None:
    """``dotted`` if it is an nvfs module, else its longest prefix that is one (``import a.b.c``)."""
    parts = dotted.split(".")
    while parts and ".".join(parts) not in MODULES:
        parts.pop()
    return ".".join(parts) or None


def targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The nvfs modules an import statement of ``module`` depends on.

    ``from pkg import name`` depends on the submodule ``pkg.name`` where there is one and on
    ``pkg`` (its ``__init__``) for any other name, as Python resolves it.
    """
    if isinstance(node, ast.Import):
        found = [existing_module(alias.name) for alias in node.names if alias.name.split(".")[0] == "nvfs"]
        return [target for target in found if target]
    if node.level:
        package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
        for _ in range(node.level - 1):
            package = package.rpartition(".")[0]
        base = f"{package}.{node.module}" if node.module else package
    else:
        base = node.module or ""
    if base.split(".")[0] != "nvfs":
        return []
    found = []
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        if submodule in MODULES:
            found.append(submodule)
        elif not is_native(base, alias.name):
            found.append(existing_module(base))
    return [target for target in found if target]


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(module: str, path: Path, source: str) -> list[Import]:
    """Every intra-nvfs import in the ``source`` of one module, wherever in the file it is."""
    found: list[Import] = []

    def visit(node: ast.AST, where: str) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.extend(Import(module, target, path, node.lineno, where)
                         for target in targets(module, node) if target != module)
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(node, ast.If) and is_type_checking(node.test) and child in node.body:
                visit(child, " (under TYPE_CHECKING)")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not where:
                visit(child, " (in a function)")
            else:
                visit(child, where)

    visit(ast.parse(source, filename=str(path)), "")
    return found


ALL_IMPORTS = [found for module, path in MODULES.items()
               for found in imports_of(module, path, path.read_text())]


def layer_problem(found: Import) -> str | None:
    """Which rule ``found`` breaks, if any."""
    source, target = LAYER_OF.get(layer_key(found.source)), LAYER_OF.get(layer_key(found.target))
    if source is None or target is None or source == target:
        return None  # unplaced modules are test_every_module_has_a_layer's to report
    if target not in MAY_IMPORT[source]:
        allowed = f"only {', '.join(sorted(MAY_IMPORT[source]))}" if MAY_IMPORT[source] else "no other layer"
        return (f"{found.place}: {found.source} ({source}) imports {found.target} ({target}){found.where}; "
                f"{source} may import {allowed} (MAY_IMPORT in tests/test_layers.py)")
    only = ONLY_MODULES.get((source, target))
    if only is not None and found.target not in only:
        return (f"{found.place}: {found.source} ({source}) imports {found.target}{found.where}; "
                f"of {target}, {source} may import only {', '.join(sorted(only))} "
                f"(ONLY_MODULES in tests/test_layers.py)")
    return None


def find_cycles(edges: dict[str, dict[str, Import]]) -> list[list[Import]]:
    """Import cycles, each as the imports that close it: a depth-first search in which an import of
    a module still on the search path is a cycle. Every cycle-carrying group of modules yields at
    least one; each cycle is reported once."""
    cycles: list[list[Import]] = []
    seen_cycles: set[frozenset[tuple[str, str]]] = set()
    finished: set[str] = set()
    path: list[str] = []
    on_path: dict[str, int] = {}

    def visit(module: str) -> None:
        on_path[module] = len(path)
        path.append(module)
        for target in sorted(edges.get(module, {})):
            if target in on_path:
                loop = path[on_path[target]:] + [target]
                cycle = [edges[a][b] for a, b in zip(loop, loop[1:], strict=False)]
                key = frozenset((step.source, step.target) for step in cycle)
                if key not in seen_cycles:
                    seen_cycles.add(key)
                    cycles.append(cycle)
            elif target not in finished:
                visit(target)
        path.pop()
        del on_path[module]
        finished.add(module)

    for module in sorted(edges):
        if module not in finished:
            visit(module)
    return cycles


def test_every_module_has_a_layer():
    unplaced = sorted({layer_key(module) for module in MODULES} - set(LAYER_OF))
    assert not unplaced, (f"nvfs modules or packages in no layer: {', '.join(unplaced)}; add each to "
                          f"LAYER_OF in tests/test_layers.py (and to docs/ARCHITECTURE.md)")


def test_the_rules_name_only_known_layers():
    layers = set(LAYER_OF.values())
    assert set(MAY_IMPORT) == layers, f"MAY_IMPORT should have a row for each of {sorted(layers)}"
    named = set().union(*MAY_IMPORT.values(), *ONLY_MODULES)
    assert named <= layers, f"the rules name layers that do not exist: {sorted(named - layers)}"
    for modules in ONLY_MODULES.values():
        assert modules <= set(MODULES), f"ONLY_MODULES names modules that do not exist: {modules}"


def test_layers_import_only_downwards():
    problems = [problem for found in ALL_IMPORTS if (problem := layer_problem(found))]
    if problems:
        pytest.fail("imports against the layer direction:\n" + "\n".join(problems), pytrace=False)


def describe(cycle: list[Import]) -> str:
    steps = "\n".join(f"    {step.place}: {step.source} imports {step.target}{step.where}" for step in cycle)
    return " -> ".join([cycle[0].source, *(step.target for step in cycle)]) + "\n" + steps


def test_no_import_cycles():
    edges: dict[str, dict[str, Import]] = {}
    for found in ALL_IMPORTS:
        edges.setdefault(found.source, {}).setdefault(found.target, found)
    cycles = find_cycles(edges)
    if cycles:
        pytest.fail("import cycles (a module imports itself back through these imports):\n" +
                    "\n".join(describe(cycle) for cycle in cycles), pytrace=False)


def test_the_checks_report_a_broken_rule_and_a_cycle():
    """The checks themselves, on imports made up for the purpose."""
    def made_up(source: str, target: str) -> Import:
        return Import(source, target, PACKAGE / "x.py", 1, "")

    assert "codec may import only support" in layer_problem(made_up("nvfs.codec.cpu", "nvfs.store.chunk"))
    assert "support may import no other layer" in layer_problem(made_up("nvfs.gil", "nvfs.codec"))
    assert "may import only nvfs.codec.base" in layer_problem(made_up("nvfs.formats.x", "nvfs.codec.planes"))
    assert layer_problem(made_up("nvfs.formats.x", "nvfs.codec.base")) is None
    assert layer_problem(made_up("nvfs.store.chunk", "nvfs.store.names")) is None
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set()}
    edges = {source: {target: made_up(source, target) for target in imported}
             for source, imported in graph.items()}
    assert [describe(cycle).splitlines()[0] for cycle in find_cycles(edges)] == ["a -> b -> c -> a"]


SAMPLE = """
from __future__ import annotations
from typing import TYPE_CHECKING
import nvfs.codec.base
from nvfs.backend import Backend, directory
from . import chunk
from ..codec import _planes
if TYPE_CHECKING:
    from nvfs.vfs import Vfs
def late():
    from nvfs.options import MountOptions
"""


def test_the_import_finder_sees_every_kind_of_import(monkeypatch):
    """The rules are only as good as the finder: it must see each shape of import nvfs may use."""
    module = "nvfs.store.sample"
    monkeypatch.setitem(MODULES, module, PACKAGE / "store" / "sample.py")
    found = {(found.target, found.line, found.where) for found in imports_of(module, MODULES[module], SAMPLE)}
    assert found == {
        ("nvfs.codec.base", 4, ""),
        ("nvfs.backend", 5, ""),  # Backend: a name of the package
        ("nvfs.backend.directory", 5, ""),  # a submodule
        ("nvfs.store.chunk", 6, ""),  # relative
        # ..codec._planes, a compiled extension, imports nothing of nvfs
        ("nvfs.vfs", 9, " (under TYPE_CHECKING)"),
        ("nvfs.options", 11, " (in a function)"),
    }
