"""Import direction, the test kit kept out of shipped code, one error root per package, and the
ban on ambient time, ids, randomness and environment in harness_core."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness_core", "adapters", "gateway", "config")
ALLOWED = {
    "harness_core": set(),
    "adapters": {"harness_core", "config"},
    "config": set(),
    "gateway": {"adapters", "harness_core", "config"},
}
# The only harness_core modules allowed to read the wall clock, sleep or mint ids/randomness.
AMBIENT_MODULES = {"harness_core/clock.py", "harness_core/ids.py", "harness_core/testing/clock.py"}
BANNED_CALLS = {
    ("time", "time"), ("time", "time_ns"), ("time", "monotonic"), ("time", "monotonic_ns"),
    ("time", "sleep"), ("time", "perf_counter"), ("datetime", "now"), ("datetime", "utcnow"),
    ("datetime", "today"), ("date", "today"), ("asyncio", "sleep"), ("os", "getenv"),
    ("os", "environ"), ("os", "urandom"), ("uuid", "uuid1"), ("uuid", "uuid4"), ("uuid", "uuid7"),
}  # fmt: skip
BANNED_MODULES = {"random", "secrets", "uuid"}


def _sources(package: str) -> Iterator[Path]:
    yield from sorted((ROOT / package).rglob("*.py"))


def _imports(tree: ast.AST) -> Iterator[tuple[str, int]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_point_one_way(package: str) -> None:
    forbidden = set(PACKAGES) - ALLOWED[package] - {package}
    violations = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in _sources(package)
        for name, line in _imports(ast.parse(path.read_text()))
        if name.split(".")[0] in forbidden
    ]
    assert violations == []


def test_private_modules_stay_inside_their_package() -> None:
    violations = []
    for package in PACKAGES:
        for path in _sources(package):
            for name, line in _imports(ast.parse(path.read_text())):
                parts = name.split(".")
                if (
                    parts[0] in PACKAGES
                    and parts[0] != package
                    and any(p.startswith("_") for p in parts)
                ):
                    violations.append(f"{path.relative_to(ROOT)}:{line} imports private {name}")
    assert violations == []


def _ambient_violations(source: str, relative: str) -> list[str]:
    tree = ast.parse(source)
    found = [
        f"{relative}:{line} imports {name}"
        for name, line in _imports(tree)
        if name.split(".")[0] in BANNED_MODULES
    ]
    # `asyncio.sleep(0)` hands the loop a turn; it reads no clock and waits for no time
    yields = {
        id(node.func)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and [ast.dump(a) for a in node.args] == [ast.dump(ast.Constant(0))]
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if (node.value.id, node.attr) in BANNED_CALLS and id(node) not in yields:
                found.append(f"{relative}:{node.lineno} uses {node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module in {
            "time",
            "datetime",
            "os",
            "asyncio",
        }:
            for alias in node.names:
                if (node.module, alias.name) in BANNED_CALLS:
                    found.append(f"{relative}:{node.lineno} imports {node.module}.{alias.name}")
    return found


def test_harness_core_reads_no_ambient_clock_ids_randomness_or_environment() -> None:
    violations = []
    for path in _sources("harness_core"):
        relative = str(path.relative_to(ROOT))
        if relative not in AMBIENT_MODULES:
            violations += _ambient_violations(path.read_text(), relative)
    assert violations == []


def test_the_ambient_check_catches_each_kind_of_violation() -> None:
    source = (
        "import uuid\nimport time\nfrom os import environ\nfrom random import choice\n"
        "x = time.time()\nimport asyncio\nasync def f():\n    await asyncio.sleep(1)\n"
        "    await asyncio.sleep(0)\n    time.sleep(0)\n"
    )
    found = sorted(_ambient_violations(source, "m.py"))
    assert found == [
        "m.py:1 imports uuid",
        "m.py:3 imports os.environ",
        "m.py:4 imports random",
        "m.py:5 uses time.time",
        "m.py:8 uses asyncio.sleep",
    ]  # a zero sleep only yields the loop a turn: neither line 9 nor 10 reads time


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _eager_imports(tree: ast.Module) -> Iterator[ast.ImportFrom | ast.Import]:
    """Module-level imports that run at import time (not under TYPE_CHECKING, not in a def)."""
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            guard = ast.unparse(node.test)
            if "TYPE_CHECKING" not in guard:
                pending += node.body + node.orelse
        elif isinstance(node, ast.Try):
            pending += node.body + node.orelse + node.finalbody
            for handler in node.handlers:
                pending += handler.body


def _all_imports(tree: ast.Module) -> Iterator[ast.ImportFrom | ast.Import]:
    """Every import of a module, the lazy ones inside functions too."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def import_graph(*packages: str, lazy: bool = False) -> dict[str, set[str]]:
    """Which modules of `packages` each of their modules imports when it is imported (`lazy`:
    or ever, counting the imports inside functions too)."""
    modules = {_module_name(path): path for package in packages for path in _sources(package)}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    found = _all_imports if lazy else _eager_imports
    for name, path in modules.items():
        for node in found(ast.parse(path.read_text())):
            targets = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [f"{node.module}.{alias.name}" for alias in node.names] + [node.module or ""]
            )
            for target in targets:
                if target in modules and target != name:
                    graph[name].add(target)
    # `from harness_core.x import y` names a module x.y when y is a submodule, else module x
    for name in graph:
        graph[name] = {t for t in graph[name] if not any(t + "." in o for o in graph[name])}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of a graph (each once, from its smallest module)."""
    found: list[list[str]] = []

    def walk(start: str, node: str, path: list[str]) -> None:
        for nxt in sorted(graph[node]):
            if nxt == start:
                found.append([*path, start])
            elif nxt not in path and nxt > start:
                walk(start, nxt, [*path, nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return found


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle_inside_a_package(package: str) -> None:
    assert cycles(import_graph(package)) == []


def test_no_import_circle_across_the_packages() -> None:
    assert cycles(import_graph(*PACKAGES)) == []


def test_the_circle_check_sees_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_gateway_and_adapters_use_the_engine_only_through_the_public_surface() -> None:
    violations = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for package in ("gateway", "adapters")
        for path in _sources(package)
        for name, line in _imports(ast.parse(path.read_text()))
        if name.startswith("harness_core._runtime")
    ]
    assert violations == []


TEST_KIT = ("harness_core.testing", "adapters.testing", "tests")
"""What only tests import: harness_core's kit (builders, manual clock, the storage suite, the
trajectories), the recording channel and the repository's own tests. A shipped conformance
suite (`gateway.broker.conformance`) is run by plugin authors' tests, but takes what it needs
(the clock it advances, a second broker) from the fixture their test builds (D182)."""


def _named(node: ast.Import | ast.ImportFrom) -> Iterator[str]:
    """The modules (and module.names) an import statement names."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif node.module and node.level == 0:
        yield node.module
        yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _in_kit(name: str) -> bool:
    return any(name == kit or name.startswith(kit + ".") for kit in TEST_KIT)


def test_no_shipped_module_imports_the_test_kit() -> None:
    violations = sorted(
        f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"
        for package in PACKAGES
        for path in _sources(package)
        if not _in_kit(_module_name(path))
        for node in _all_imports(ast.parse(path.read_text()))
        for name in _named(node)
        if _in_kit(name)
    )
    assert violations == []


OPS_FRONT_END_USERS = {
    "gateway.app": "mounts the API's error envelope",
    "gateway.cli": "hands `gateway ops` to its parser",
    "gateway.guards": "refuses oversized requests in the API's envelope",
    "gateway.service": "builds the API and its tokens",
    "gateway.serve": "keeps the address `gateway ops` calls beside the store",
}
"""The only modules outside `gateway.ops` (the operator HTTP front end: API, tokens, envelope,
page, CLI) that import it: the ones that assemble the service. The worker carries operator
actions out with `gateway.operator_actions` and reads lanes with `gateway.lane_status`."""


def test_only_the_assembly_imports_the_operator_front_end() -> None:
    graph = import_graph("gateway", lazy=True)
    violations = sorted(
        f"{name} imports {target}"
        for name, targets in graph.items()
        if not name.startswith("gateway.ops") and name not in OPS_FRONT_END_USERS
        for target in targets
        if target == "gateway.ops" or target.startswith("gateway.ops.")
    )
    assert violations == []


def test_the_worker_reaches_nothing_of_the_operator_front_end() -> None:
    graph = import_graph("gateway", lazy=True)
    reached, pending = set(), ["gateway.worker"]
    while pending:
        name = pending.pop()
        if name not in reached:
            reached.add(name)
            pending += graph[name]
    assert sorted(n for n in reached if n == "gateway.ops" or n.startswith("gateway.ops.")) == []


ROOTS = {"gateway": "GatewayError", "adapters": "AdapterError"}


def _exception_classes(package: str) -> Iterator[type[BaseException]]:
    """Every exception class a module of `package` defines (at its top level)."""
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        if info.name.endswith(".__main__"):  # running it is its import
            continue
        module = importlib.import_module(info.name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, BaseException) and value.__module__ == info.name:
                yield value


@pytest.mark.parametrize("package", sorted(ROOTS))
def test_every_exception_derives_from_its_package_root(package: str) -> None:
    root = getattr(importlib.import_module(package), ROOTS[package])
    found = list(_exception_classes(package))
    assert len(found) > 5  # the walk sees the package's errors
    strays = sorted(
        f"{cls.__module__}.{cls.__qualname__}" for cls in found if not issubclass(cls, root)
    )
    assert strays == []


CHANNEL_FOLDERS = sorted(
    path.name for path in (ROOT / "adapters").iterdir() if (path / "spec.py").is_file()
)


def test_gateway_reaches_channels_only_through_the_registry() -> None:
    """The gateway imports `adapters` (the contract, the kit, the registry), never a channel.

    A channel's folder is imported by its spec's builder; a gateway module naming a channel's
    module (an import, or a string for importlib) would build on one channel by name.
    """
    violations = []
    for path in _sources("gateway"):
        source = path.read_text()
        for name, line in _imports(ast.parse(source)):
            if name.split(".")[0] == "adapters" and name != "adapters":
                violations.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
        for folder in CHANNEL_FOLDERS:
            if f"adapters.{folder}" in source or f"adapters/{folder}" in source:
                violations.append(f"{path.relative_to(ROOT)} names adapters.{folder}")
    assert violations == []
    assert {"web", "slack", "email"} <= set(CHANNEL_FOLDERS)


def test_a_channel_folder_imports_no_other_channel() -> None:
    """Channels share the kit (adapters' own modules), never each other's folders."""
    violations = []
    for folder in CHANNEL_FOLDERS:
        for path in sorted((ROOT / "adapters" / folder).rglob("*.py")):
            for name, line in _imports(ast.parse(path.read_text())):
                parts = name.split(".")
                other = parts[1] if parts[0] == "adapters" and len(parts) > 1 else folder
                if other in CHANNEL_FOLDERS and other != folder:
                    violations.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert violations == []


def test_every_built_in_channel_is_a_folder_with_a_spec() -> None:
    from adapters.registry import BUILT_IN

    assert sorted(target.split(".")[1] for target in BUILT_IN) == CHANNEL_FOLDERS
