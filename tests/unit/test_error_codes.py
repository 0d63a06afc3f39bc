"""The registry of wire error codes (``hubgrpo/error_codes.py``) against the code base: every (class, code) that
``hubgrpo/`` raises is listed, every listed one is raised, the worker stops on exactly the registry's stopping
codes, and ``docs/architecture.md`` holds the generated table."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from hubgrpo import error_codes, errors

ROOT = Path(__file__).resolve().parents[2]
WIRE = ("Refused", "LeaseError", "InvalidSubmission", "CoordinatorError")
POSITIONAL = ("Refused", "InvalidSubmission")  # their code is the first argument; the others take ``code=``


def _strings(node: ast.AST, function: ast.AST | None) -> set[str]:
    """The string constants a code expression can take: constants in it, and for a variable, the constants
    assigned to that name in the enclosing function."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Name) and function is not None:
        found: set[str] = set()
        for n in ast.walk(function):
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets):
                found |= _strings(n.value, None)
        return found
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _code_arg(call: ast.Call, name: str) -> ast.AST | None:
    for k in call.keywords:
        if k.arg == "code":
            return k.value
    if name in POSITIONAL and call.args:
        return call.args[0]
    return None


def _functions(tree: ast.AST):
    """(function or None, call) for every call, with the innermost function around it."""
    def visit(node, fn):
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else fn
            if isinstance(child, ast.Call):
                yield fn, child
            yield from visit(child, inner)
    yield from visit(tree, None)


def raised() -> set[tuple[str, str]]:
    """(class, code) of every wire error constructed in hubgrpo/, through wrappers too: a function whose parameter
    goes into a wire error as its code raises that class with every constant its callers pass (a private wrapper
    only from its own module)."""
    trees = {p: ast.parse(p.read_text()) for p in sorted((ROOT / "hubgrpo").rglob("*.py"))}
    wrappers: dict[tuple[Path | None, str], str] = {}
    out: set[tuple[str, str]] = set()
    for path, tree in trees.items():
        for fn, call in _functions(tree):
            name = _callee(call)
            if name not in WIRE:
                continue
            arg = _code_arg(call, name)
            params = {a.arg for a in fn.args.args} if fn is not None else set()
            if arg is None:
                out.add((name, getattr(errors, name).code))
            elif isinstance(arg, ast.Name) and arg.id in params:
                wrappers[(path if fn.name.startswith("_") else None, fn.name)] = name
            else:
                out |= {(name, s) for s in _strings(arg, fn)}
    for path, tree in trees.items():
        for fn, call in _functions(tree):
            name = _callee(call)
            error = wrappers.get((path, name)) or wrappers.get((None, name))
            arg = _code_arg(call, "Refused") if error else None
            if arg is not None:
                out |= {(error, s) for s in _strings(arg, fn)}
    return out


@pytest.mark.timeout(60)
def test_every_code_raised_is_in_the_registry_and_every_listed_code_is_raised():
    listed = {(c.error, c.code) for c in error_codes.CODES}
    found = raised()
    assert ("Refused", "budget") in found and ("InvalidSubmission", "nonfinite") in found  # the scan sees wrappers
    assert not found - listed, f"raised but not in hubgrpo/error_codes.py: {sorted(found - listed)}"
    assert not listed - found, f"listed in hubgrpo/error_codes.py but never raised: {sorted(listed - found)}"
    assert all(c.action in error_codes.ACTIONS for c in error_codes.CODES)
    assert len(listed) == len(error_codes.CODES), "a (class, code) pair is listed twice"


@pytest.mark.timeout(60)
def test_the_worker_stops_on_the_registry_codes_and_the_document_holds_its_table():
    from hubgrpo.worker import loop

    assert set(loop.STOP_CODES) == error_codes.stop_codes() >= {"auth", "version", "orphaned", "redirect"}
    assert "merging" not in loop.STOP_CODES and "unreachable" not in loop.STOP_CODES
    doc = (ROOT / "docs" / "architecture.md").read_text()
    assert error_codes.markdown() in doc, ("docs/architecture.md's error table is not the registry's: paste the "
                                           "output of `python -m hubgrpo.error_codes` in its place")
