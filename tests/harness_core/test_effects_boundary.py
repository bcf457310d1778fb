"""Nothing a procedure does bypasses `Effects`: each await is an effect, a read or its own step.

The crash matrix (next issue) enumerates crash sites from the `Effects` calls alone, so an
awaited write, model call, tool run, hook or sleep that went around it would be a crash site
nobody tests. This reads `procedures.py` and names every await that is none of those.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re

from harness_core._runtime import procedures
from harness_core._runtime.effects import Effects

READS = {
    "self.lane.context.entries",
    "self.lane.context.messages",
    "self.lane.context.request_messages",
    "self.lane.context.tokens",
    "self.lane.context.entry",
    "self.lane.context.path_entries_of_type",
    "storage.find_entries_on_branch",
    "storage.get_usage",
}
"""Reads of committed state: not effects (a crash around a read changes nothing durable)."""

STEP_PARAMETERS = {"build", "screen"}
"""The retry loop's callables: procedure steps passed in (their own awaits are checked too)."""


def dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return "<expr>"


PARTS = [
    importlib.import_module(f"{procedures.__name__}.{info.name}")
    for info in pkgutil.iter_modules(procedures.__path__)
]
"""Every module of the procedures package (the parts and what they share)."""


def awaited_calls() -> list[tuple[str, int, str]]:
    found = []
    for module in [procedures, *PARTS]:
        found += [
            (module.__name__.rpartition(".")[2], line, name)
            for line, name in _awaited(ast.parse(inspect.getsource(module)))
        ]
    return found


def _awaited(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Await) and isinstance(node.value, ast.Call):
            call = node.value
            if dotted(call.func) == "asyncio.gather":  # concurrent effects: check each one
                inner = [n for arg in call.args for n in ast.walk(arg) if isinstance(n, ast.Call)]
                found += [(node.lineno, dotted(n.func)) for n in inner]
            else:
                found.append((node.lineno, dotted(call.func)))
    return found


def test_every_await_in_a_procedure_is_an_effect_a_read_or_a_procedure_step() -> None:
    effects = {name for name, _ in inspect.getmembers(Effects) if not name.startswith("_")}
    outside = []
    for module, line, name in awaited_calls():
        head, _, method = name.rpartition(".")
        if head in ("fx", "self.fx") and method in effects:
            continue
        if (
            name in READS
            or name in STEP_PARAMETERS
            or re.fullmatch(r"self\.(?:(?:steps|tools|structural|run)\.)?[a-z_]+", name)
        ):
            continue  # a read, or one of the procedure's own steps (or another part's)
        outside.append(f"procedures/{module}.py:{line}: await {name}(...)")
    assert PARTS and outside == []


def test_the_check_sees_effects_at_all() -> None:
    names = {name for _, _, name in awaited_calls()}
    assert {"fx.append_record", "self.fx.execute_tool", "self.fx.stream_assistant"} <= names
