"""docs/conformance.md stays honest: every code, test and decision it cites exists.

The table maps each requirement of the two seeds to the code that implements it and the test
that proves it. Code moves and tests are renamed; this reads every row and names each citation
that no longer resolves, each status outside the allowed forms, and a summary line that no
longer counts the rows.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "docs" / "conformance.md"
DECISIONS = ROOT / "docs" / "decisions.md"

_ROW = re.compile(r"^\| (S\d-\d+) \|")
_ID = re.compile(r"^(S1-\d{2}|S2-\d{3})$")
_TICKED = re.compile(r"`([^`]+)`")
_REF = re.compile(r"^(?P<path>[\w./-]+)::(?P<symbol>[\w.]+)(?:\[(?P<case>[^\]]+)\])?$")
_DECISION = re.compile(r"\bD(\d+)\b")
_STATUS = re.compile(
    r"^(?:done"
    r"|differs on purpose: D\d+(?:, D\d+)*"
    r"|partial: \S.*"
    r"|missing: \S.*"
    r"|in progress \(issue \d+ item \d+\))$"
)
_COUNTS = re.compile(
    r"\*\*(\d+) rows: (\d+) done, (\d+) differ on purpose, (\d+) partial, (\d+) missing, "
    r"(\d+) in progress\.\*\*"
)
_KINDS = ("done", "differs", "partial", "missing", "in progress")
_OPEN = re.compile(r"Open rows \(partial, missing or in progress\):((?:\s+S\d-\d+,?)*)")
_SHIPPED_SUITES = ("harness_core/testing/",)
"""Where a cited test may be a case of a shipped conformance suite rather than a `test_`."""


@dataclass(frozen=True)
class Row:
    """One requirement: its id, the cells as written, and the line it is on."""

    line: int
    id: str
    requirement: str
    code: str
    test: str
    status: str

    @property
    def kind(self) -> str:
        return next((k for k in _KINDS if self.status.startswith(k)), "unknown")


def rows(text: str) -> tuple[list[Row], list[str]]:
    """The table rows of the document, and the lines that look like rows but are not."""
    found: list[Row] = []
    broken: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not _ROW.match(line):
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 5:
            broken.append(f"line {number}: {len(cells)} cells, not 5 (a '|' inside a cell?)")
            continue
        found.append(Row(number, *cells))
    return found, broken


def _block(source: str, cls: str) -> str | None:
    """The text of class `cls` (from its line to the next top-level line), if defined."""
    match = re.search(rf"^class {re.escape(cls)}\b.*$", source, re.MULTILINE)
    if match is None:
        return None
    rest = source[match.end() :]
    end = re.search(r"^\S", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def _defines(source: str, name: str) -> bool:
    """Whether Python text defines `name`: a function, a class, or an assigned name."""
    return (
        re.search(
            rf"^\s*(?:(?:async\s+)?def|class)\s+{re.escape(name)}\b"
            rf"|^\s*{re.escape(name)}\s*(?::|=)",
            source,
            re.MULTILINE,
        )
        is not None
    )


def why_symbol_missing(path: Path, symbol: str) -> str | None:
    """Why `symbol` is not found in `path` (None: it is)."""
    if not path.is_file():
        return "no such file"
    source = path.read_text(encoding="utf-8")
    if path.suffix != ".py":  # a script or a SQL file: the name must appear as a word
        return None if re.search(rf"\b{re.escape(symbol)}\b", source) else "name not in file"
    if "." in symbol:
        cls, member = symbol.split(".", 1)
        block = _block(source, cls)
        if block is None:
            return f"no class {cls}"
        return None if _defines(block, member) else f"class {cls} has no {member}"
    return None if _defines(source, symbol) else f"{symbol} is not defined there"


def why_test_missing(path: Path, name: str, case: str | None) -> str | None:
    """Why the cited test does not exist (None: it does)."""
    if not path.is_file():
        return "no such file"
    source = path.read_text(encoding="utf-8")
    shipped = str(path.relative_to(ROOT)).startswith(_SHIPPED_SUITES)
    if not name.startswith("test_") and not shipped:
        return "not a test function (test_...)"
    if re.search(rf"^\s*(?:async\s+)?def {re.escape(name)}\(", source, re.MULTILINE) is None:
        return f"no def {name}"
    if case is not None and case not in source:
        return f"case {case!r} is not in the file"
    return None


def _refs(cell: str, row: Row, column: str, problems: list[str]) -> list[re.Match[str]]:
    found = []
    for token in _TICKED.findall(cell):
        match = _REF.match(token)
        if match is None:
            problems.append(f"{row.id}: {column} `{token}` is not `path::symbol`")
        else:
            found.append(match)
    if not found and cell not in ("—", ""):
        problems.append(f"{row.id}: {column} cell cites nothing; write — when there is nothing")
    return found


def problems(text: str, root: Path, decisions: str) -> list[str]:
    """Everything wrong with the table in `text`, one line each (empty: it is honest)."""
    table, found = rows(text)
    problems = list(found)
    if not table:
        return [*problems, "no rows"]
    known = {int(n) for n in re.findall(r"^## D(\d+)\. ", decisions, re.MULTILINE)}
    seen: set[str] = set()
    previous: dict[str, int] = {}
    for row in table:
        if not _ID.match(row.id):
            problems.append(f"{row.id}: an id is S1-nn or S2-nnn")
        if row.id in seen:
            problems.append(f"{row.id}: the id is used twice")
        seen.add(row.id)
        seed, number = row.id.split("-")
        if number.isdigit() and int(number) <= previous.get(seed, 0):
            problems.append(f"{row.id}: ids go up within a seed (new rows go at the end)")
        previous[seed] = int(number) if number.isdigit() else 0
        if not row.requirement:
            problems.append(f"{row.id}: no requirement")
        if not _STATUS.match(row.status):
            problems.append(f"{row.id}: status {row.status!r} is not one of the allowed forms")
            continue
        code = _refs(row.code, row, "code", problems)
        tests = _refs(row.test, row, "test", problems)
        for match in code:
            why = why_symbol_missing(root / match["path"], match["symbol"])
            if why is not None:
                problems.append(f"{row.id}: code `{match[0]}`: {why}")
        for match in tests:
            why = why_test_missing(root / match["path"], match["symbol"], match["case"])
            if why is not None:
                problems.append(f"{row.id}: test `{match[0]}`: {why}")
        if row.kind == "done" and not (code and tests):
            problems.append(f"{row.id}: done needs the code and a test that asserts it")
        for number_ in _DECISION.findall(f"{row.requirement} {row.status}"):
            if int(number_) not in known:
                problems.append(f"{row.id}: D{number_} is not in docs/decisions.md")
    counts = Counter(row.kind for row in table)
    expected = (
        len(table),
        *(counts[kind] for kind in _KINDS),
    )
    stated = _COUNTS.search(text)
    if stated is None:
        problems.append("no summary line (**N rows: a done, b differ on purpose, ...**)")
    elif tuple(int(n) for n in stated.groups()) != expected:
        problems.append(
            f"the summary says {stated[0]}, the rows are **{expected[0]} rows: {expected[1]} "
            f"done, {expected[2]} differ on purpose, {expected[3]} partial, {expected[4]} "
            f"missing, {expected[5]} in progress.**"
        )
    open_rows = [row.id for row in table if row.kind in ("partial", "missing", "in progress")]
    listed = _OPEN.search(text)
    if listed is None:
        problems.append("no list of open rows (Open rows (partial, missing or in progress): ...)")
    elif re.findall(r"S\d-\d+", listed[1]) != open_rows:
        problems.append(f"the open rows are {', '.join(open_rows) or 'none'}, not as listed")
    return problems


def test_every_citation_resolves_and_every_status_is_allowed() -> None:
    found = problems(TABLE.read_text(encoding="utf-8"), ROOT, DECISIONS.read_text(encoding="utf-8"))
    assert found == [], "docs/conformance.md:\n" + "\n".join(found)


def test_both_seeds_have_rows() -> None:
    table, _ = rows(TABLE.read_text(encoding="utf-8"))
    assert {row.id.split("-")[0] for row in table} == {"S1", "S2"}


HEADER = (
    "**{n} rows: {done} done, 0 differ on purpose, 0 partial, 0 missing, 0 in progress.**\n"
    "Open rows (partial, missing or in progress):\n"
)
GOOD = (
    "| S1-01 | a rule | `harness_core/portable.py::HarnessState.fork` "
    "| `tests/harness_core/test_portable_state.py::test_fork_needs_a_new_identity` | done |"
)


def test_a_good_row_passes() -> None:
    assert problems(HEADER.format(n=1, done=1) + GOOD, ROOT, "## D1. x\n") == []


BROKEN = {
    "a moved file": (
        GOOD.replace("portable.py", "gone.py"),
        "S1-01: code `harness_core/gone.py::HarnessState.fork`: no such file",
    ),
    "a renamed method": (
        GOOD.replace(".fork", ".spoon"),
        "S1-01: code `harness_core/portable.py::HarnessState.spoon`: class HarnessState has "
        "no spoon",
    ),
    "a renamed test": (
        GOOD.replace("test_fork_needs", "test_spoon_needs"),
        "S1-01: test `tests/harness_core/test_portable_state.py::test_spoon_needs_a_new_"
        "identity`: no def test_spoon_needs_a_new_identity",
    ),
    "a case that is gone": (
        GOOD.replace("identity`", "identity[no such case]`"),
        "S1-01: test `tests/harness_core/test_portable_state.py::test_fork_needs_a_new_identity"
        "[no such case]`: case 'no such case' is not in the file",
    ),
    "an unknown decision": (
        GOOD.replace("| done |", "| differs on purpose: D9999 |"),
        "S1-01: D9999 is not in docs/decisions.md",
    ),
    "a status outside the forms": (
        GOOD.replace("| done |", "| mostly done |"),
        "S1-01: status 'mostly done' is not one of the allowed forms",
    ),
    "done without a test": (
        GOOD.replace(
            "`tests/harness_core/test_portable_state.py::test_fork_needs_a_new_identity`", "—"
        ),
        "S1-01: done needs the code and a test that asserts it",
    ),
}


def test_each_kind_of_break_is_named() -> None:
    for what, (row, expected) in BROKEN.items():
        found = problems(HEADER.format(n=1, done=1) + row, ROOT, "## D1. x\n")
        assert expected in found, (what, found)


def test_a_stale_summary_and_a_repeated_id_are_named() -> None:
    found = problems(HEADER.format(n=1, done=1) + GOOD + "\n" + GOOD, ROOT, "## D1. x\n")
    assert "S1-01: the id is used twice" in found
    assert any(line.startswith("the summary says") for line in found), found


def test_an_open_row_missing_from_the_list_is_named() -> None:
    partial = GOOD.replace("| done |", "| partial: no test yet |")
    header = (
        "**1 rows: 0 done, 0 differ on purpose, 1 partial, 0 missing, 0 in progress.**\n"
        "Open rows (partial, missing or in progress):\n"
    )
    found = problems(header + partial, ROOT, "## D1. x\n")
    assert found == ["the open rows are S1-01, not as listed"]
    assert problems(header.replace("progress):", "progress): S1-01") + partial, ROOT, "") == []
