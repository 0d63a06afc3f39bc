"""The package's roles, checked on its source: which role may import which, no import cycles, light core.

Roles (the folder tree): the light core (``config``, ``errors``, ``layout``, ``runrepo``, ``card``, ``tracking``),
``store``, ``task``, ``merge``, ``proof`` below everything; ``worker`` (the training side) and ``coordinator`` beside each
other and never importing each other; ``space`` (HTTP API + UI) over the coordinator; ``cli`` over everything.
Every import counts, including the ones inside function bodies; imports for type checking only (under ``if
TYPE_CHECKING:``) count for the roles but not for cycles (they never run). Outside ``coordinator/`` nobody takes
the coordinator untyped or touches its private attributes. The tests follow one rule of their own: a test module
imports helpers only from ``tests/support``, never from another test module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "hubgrpo"
CORE = {"hubgrpo", "hubgrpo.config", "hubgrpo.config.sections", "hubgrpo.config.loading", "hubgrpo.config.quota",
        "hubgrpo.config.recipe", "hubgrpo.config.reference", "hubgrpo.config.methods", "hubgrpo.config.section_base",
        "hubgrpo.config.params_section", "hubgrpo.config.merge_section", "hubgrpo.config.rounds_section",
        "hubgrpo.config.worker_section", "hubgrpo.config.legacy",
        "hubgrpo.errors", "hubgrpo.error_codes", "hubgrpo.layout", "hubgrpo.runrepo", "hubgrpo.card",
        "hubgrpo.tracking", "hubgrpo.upload_body"}
BELOW = {"core", "store", "task", "merge", "proof"}
ALLOWED = {
    "core": {"core", "store"},
    "store": {"core", "store"},
    "task": {"core", "task"},
    "merge": {"core", "merge"},
    "proof": {"core", "proof"},  # keyed sampling and its replay: used by the worker and by any verifier
    "worker": BELOW | {"worker"},
    "coordinator": BELOW | {"coordinator"},
    "space": BELOW | {"coordinator", "space"},
    "sim": BELOW | {"worker", "coordinator", "sim"},
    "launch": BELOW | {"launch"},
    "python_api": BELOW | {"worker", "coordinator", "cli", "python_api"},  # the Python API over the CLI's pieces
    "package": {"core", "store", "python_api"},  # hubgrpo/__init__: re-exports the Python API lazily (in __getattr__)
    "cli": BELOW | {"worker", "coordinator", "space", "sim", "launch", "cli"},
}


def role(module: str) -> str:
    if module == "hubgrpo":
        return "package"
    if module == "hubgrpo.python_api":
        return "python_api"
    if module in CORE:
        return "core"
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ALLOWED:
        return parts[1]
    raise AssertionError(f"{module} belongs to no role: put it in a role's folder or add it to the core list")


def module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_only(tree: ast.AST) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:`` in ``tree``."""
    out = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and (getattr(test, "id", None) == "TYPE_CHECKING"
                                         or getattr(test, "attr", None) == "TYPE_CHECKING"):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return out


def imports(path: Path, *, type_only: bool = True) -> set[str]:
    """Every hubgrpo module ``path`` imports, anywhere in the file (``from hubgrpo.x import y`` counts
    ``hubgrpo.x.y`` when that is a module, else ``hubgrpo.x``); ``type_only=False``: not the imports made for
    type checking only."""
    out = set()
    tree = ast.parse(path.read_text())
    skip = set() if type_only else _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "hubgrpo"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hubgrpo":
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out.add(sub if sub in MODULES else node.module)
    return out


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def test_every_import_stays_inside_the_roles_it_may_use():
    crossings = []
    for name, path in sorted(MODULES.items()):
        mine = role(name)
        for target in sorted(imports(path)):
            if role(target) not in ALLOWED[mine] | {"package"}:  # anyone may read hubgrpo.__version__
                crossings.append(f"{name} ({mine}) imports {target} ({role(target)})")
    assert not crossings, "imports that cross role lines:\n  " + "\n  ".join(crossings)


def test_no_import_cycles():
    graph = {name: {t for t in imports(path, type_only=False) if t in MODULES and t != name}
             for name, path in MODULES.items()}
    # the package re-exports the Python API inside __getattr__ only (checked below): on first use, never at import
    graph["hubgrpo"] = set()
    init = ast.parse((PKG / "__init__.py").read_text())
    assert not [n for n in init.body if isinstance(n, (ast.Import, ast.ImportFrom))], "hubgrpo/__init__ imports"
    # a package's __init__ is imported by its submodules implicitly; explicit edges only here
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert not cycles, "import cycles:\n  " + "\n  ".join(cycles)


def test_the_role_checker_catches_a_crossing(tmp_path):
    """The checker itself: a coordinator module importing the engine is reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from hubgrpo.worker.engine import RoundEngine\n")
    assert "hubgrpo.worker.engine" in imports(bad)
    assert role("hubgrpo.worker.engine") not in ALLOWED["coordinator"]


def test_light_modules_import_without_torch_or_gradio():
    code = ("import sys, hubgrpo.config, hubgrpo.layout, hubgrpo.errors, hubgrpo.runrepo, hubgrpo.card, "
            "hubgrpo.store, hubgrpo.task.data, hubgrpo.task.rewards, hubgrpo.coordinator.core, "
            "hubgrpo.coordinator.status, hubgrpo.cli.main, "
            "hubgrpo.store.s3; "  # opening an s3:// store imports boto3, importing the module does not
            "print(' '.join(m for m in ('torch', 'gradio', 'transformers', 'trl', 'peft', 'boto3', 'botocore') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", f"heavy modules imported: {r.stdout.strip()}"


COORDINATOR_NAMES = {"c", "coord", "coordinator"}  # what code outside coordinator/ calls a Coordinator


def _names_coordinator(node: ast.AST) -> bool:
    """Whether an expression reads like a coordinator: ``coord``, ``self.coord``, ``api.coord``, ``c``…"""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return name in COORDINATOR_NAMES


def coordinator_seam_breaches(path: Path) -> list[str]:
    """Private attributes of a coordinator touched in ``path`` (``coord._x``, ``getattr(coord, "_x")``) and
    parameters named like a coordinator with no type."""
    out, where = [], _where(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and _names_coordinator(node.value):
            out.append(f"{where}:{node.lineno} touches {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr", "setattr") \
                and len(node.args) >= 2 and _names_coordinator(node.args[0]) \
                and isinstance(node.args[1], ast.Constant) and str(node.args[1].value).startswith("_"):
            out.append(f"{where}:{node.lineno} touches {ast.unparse(node)}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            out += [f"{where}:{node.lineno} {node.name}() takes {a.arg} untyped" for a in args
                    if a.arg in COORDINATOR_NAMES - {"c"} and a.annotation is None]
    return out


def test_nothing_outside_the_coordinator_reaches_into_it():
    """The coordinator's seams are its public, typed interface: outside ``hubgrpo/coordinator/`` no module
    touches a private attribute of a coordinator, and every parameter that takes one says its type."""
    breaches = [b for name, path in sorted(MODULES.items()) if role(name) != "coordinator"
                for b in coordinator_seam_breaches(path)]
    assert not breaches, "the coordinator's private parts used outside it:\n  " + "\n  ".join(breaches)


def test_the_seam_checker_catches_a_breach(tmp_path):
    """The checker itself: a private attribute, a probe by name and an untyped coordinator are each reported."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f(coord):\n    coord._adapters.clear()\n    return getattr(self.coord, '_global', None)\n")
    found = coordinator_seam_breaches(bad)
    assert len(found) == 3 and "untyped" in found[0], found



def _where(path: Path) -> str:
    return path.relative_to(PKG.parent).as_posix() if path.is_relative_to(PKG) else path.name


def method_name_branches(path: Path) -> list[str]:
    """Comparisons of a merge method's name with a method (``method == "ffa"``, ``o.method != "stack"``…)."""
    from hubgrpo.config.methods import BY_NAME

    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            named = any(getattr(s, "id", None) == "method" or getattr(s, "attr", None) == "method" for s in sides)
            if named and any(isinstance(s, ast.Constant) and s.value in BY_NAME for s in sides):
                out.append(f"{_where(path)}:{node.lineno} {ast.unparse(node)}")
    return out


def test_merge_methods_are_objects_not_string_branches(tmp_path):
    """What a merge method means is said once, by its ``MergeMethod`` (``hubgrpo.config.methods``): nobody branches
    on its name, and the configs name exactly the methods there are."""
    import typing

    from hubgrpo.config.methods import BY_NAME
    from hubgrpo.config.sections import MergeSection
    from hubgrpo.merge.core import MergeOptions

    branches = [b for path in MODULES.values() for b in method_name_branches(path)]
    assert not branches, "branches on a merge method's name:\n  " + "\n  ".join(branches)
    for model in (MergeSection, MergeOptions):
        assert set(typing.get_args(model.model_fields["method"].annotation)) == set(BY_NAME), model
    bad = tmp_path / "bad.py"
    bad.write_text("def f(cfg, o):\n    return cfg.merge.method == 'ffa' or 'stack' != o.method\n")
    assert len(method_name_branches(bad)) == 2  # the checker itself: either side, == or !=


TESTS = PKG.parent / "tests"
TEST_LEVELS = ("unit", "integration", "system")


def cross_test_imports(path: Path, root: Path = TESTS.parent) -> list[str]:
    """Imports in ``path`` (anywhere in the file, ``from`` or plain) of a test module of any level, each as
    ``<path relative to root>:<line> <the import>``."""
    def a_test_module(name: str) -> bool:
        parts = name.split(".")
        return len(parts) > 2 and parts[0] == "tests" and parts[1] in TEST_LEVELS

    out = []
    nodes = [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]
    for node in sorted(nodes, key=lambda n: n.lineno):
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            names = [module] + [f"{module}.{a.name}" for a in node.names]
        else:
            names = [a.name for a in node.names]
        if any(a_test_module(n) for n in names):
            out.append(f"{path.relative_to(root).as_posix()}:{node.lineno} {ast.unparse(node)}")
    return out


def test_tests_import_helpers_only_from_support():
    """Helpers shared by test modules live in ``tests/support`` (tests/README.md): no test module imports another."""
    found = [i for path in sorted(TESTS.rglob("*.py")) for i in cross_test_imports(path)]
    assert not found, "imports of another test module (move the helper to tests/support):\n  " + "\n  ".join(found)


def test_the_test_import_checker_catches_one(tmp_path):
    """The checker itself: a top-level and an indented import of another test module are reported, support not."""
    bad = tmp_path / "tests" / "unit" / "test_bad.py"
    bad.parent.mkdir(parents=True)
    bad.write_text("from tests.support.coord_helpers import FakeClock\nfrom tests.unit.test_checkpoints import x\n"
                   "def f():\n    import tests.system.test_storage as s\n    from tests.unit import test_simulate\n")
    found = [line.split(" ", 1)[1] for line in cross_test_imports(bad, tmp_path)]
    assert found == ["from tests.unit.test_checkpoints import x", "import tests.system.test_storage as s",
                     "from tests.unit import test_simulate"], found
