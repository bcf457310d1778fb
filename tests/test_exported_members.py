"""The public surface: `import harness_core` gives every name a program needs (httpx-style).

Every public module of harness_core (no underscore in its path) is either part of the surface,
whose `__all__` names must all be exported at the top, or one of the few namespaces that stay
separate on purpose. A name a surface module exports but the top does not must be listed below
with the reason. And every README example imports only from `harness_core`, and runs.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import harness_core

ROOT = Path(__file__).resolve().parent.parent

NAMESPACES = {
    "harness_core.session": "the stored vocabulary and the storage contract (entries, records)",
    "harness_core.storage": "the backends; programs open them with harness_core.open_repo",
    "harness_core.backends": "the plumbing under the store, the broker and the web mailbox "
    "(SQLite, Redis, URLs), one module per backend family",
    "harness_core.testing": "the test kit (conformance suite, builders, manual clock)",
    "harness_core.texts": "what the model reads from the harness; exported as a module",
    "harness_core.telemetry_schema": "the span and attribute vocabulary, read by the runtime, "
    "the docs table and the tests; a reference, not an API a program calls",
    "harness_core.models.conversion": "pydantic-ai message interop (HarnessState uses it)",
    "harness_core.models.tool_names": "provider-safe tool names, the pydantic-ai adapter's own "
    "encoding (D209)",
    "harness_core.models.scripted": "script builders, read as scripted.text(...); the module "
    "is exported as `scripted` and ScriptedModel at the top",
}
"""Public modules whose names stay in their own namespace (subpackages included)."""

NOT_AT_THE_TOP = {
    "harness_core.approvals.check_decisions": "the harness's admission rules, documented there",
    "harness_core.approvals.mismatch": "a helper of check_decisions",
    "harness_core.approvals.stale": "a helper of check_decisions",
    "harness_core.models.is_context_overflow": "the harness's classification of a response",
    "harness_core.models.is_recoverable_length": "the harness's classification of a response",
    "harness_core.models.is_retryable": "the harness's classification of a response",
    "harness_core.portable.CAPABILITY_PREFIX": "the custom-entry prefix of capability data",
    "harness_core.portable.capabilities_of": "used by export_state",
    "harness_core.portable.capability_entry": "used by set_capability",
    "harness_core.frozen.Frozen": "the base class of the durable models",
    "harness_core.frozen.FrozenDict": "the read-only dict frozen JSON yields",
    "harness_core.frozen.FrozenJson": "a pydantic field type of the durable models",
    "harness_core.frozen.FrozenJsonObject": "a pydantic field type of the durable models",
    "harness_core.frozen.freeze_json": "the JSON check every payload passes",
    "harness_core.frozen.invalid_reason": "formats a validation error",
    "harness_core.frozen.revalidated": "re-checks a value that skipped validation",
    "harness_core.frozen.thaw_json": "turns frozen JSON back into plain values",
}
"""Names of surface modules that are deliberately not exported at the top, and why."""


def public_modules() -> list[str]:
    names = ["harness_core"]
    for info in pkgutil.walk_packages(harness_core.__path__, "harness_core."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def in_namespace(module: str) -> bool:
    return any(module == ns or module.startswith(ns + ".") for ns in NAMESPACES)


def test_every_public_name_is_at_the_top_or_deliberately_not() -> None:
    top = set(harness_core.__all__)
    missing = []
    for name in public_modules():
        if name == "harness_core" or in_namespace(name):
            continue
        module = importlib.import_module(name)
        exported = getattr(module, "__all__", None)
        assert exported is not None, f"{name} has no __all__"
        for item in exported:
            if item not in top and f"{name}.{item}" not in NOT_AT_THE_TOP:
                missing.append(f"{name}.{item}")
    assert missing == []


def test_the_top_names_resolve_and_the_lists_name_real_things() -> None:
    for item in harness_core.__all__:
        assert getattr(harness_core, item) is not None, item
    for dotted in NOT_AT_THE_TOP:
        module, _, item = dotted.rpartition(".")
        assert item in importlib.import_module(module).__all__, dotted
    for namespace in NAMESPACES:
        assert importlib.import_module(namespace).__all__, namespace


def test_the_engine_stays_private() -> None:
    assert not any(n.startswith("harness_core._runtime") for n in public_modules())
    leaked = [
        item
        for item in harness_core.__all__
        if getattr(getattr(harness_core, item), "__module__", "").startswith(
            "harness_core._runtime"
        )
        and item not in ("ActionInfo",)  # manual drive's parked-effect description
    ]
    assert leaked == []


def readme_examples() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def test_readme_examples_import_only_from_harness_core() -> None:
    examples = readme_examples()
    assert examples
    for example in examples:
        for node in ast.walk(ast.parse(example)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness_core"):
                assert node.module == "harness_core", ast.unparse(node)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("harness_core."), ast.unparse(node)


def test_readme_examples_run(tmp_path: Path) -> None:
    for number, example in enumerate(readme_examples()):
        script = tmp_path / f"example{number}.py"
        script.write_text(example)
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr[-2000:]
