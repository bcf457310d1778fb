"""docs/decisions.md: every entry states its status, and the index at its top is the generated one.

The rules live in `docs/decisions_index.py` (which refuses to write an index over a file that
breaks them); here they hold for the real file, and each is shown to catch what it is for.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from docs.decisions_index import BEGIN, COMMAND, DECISIONS, END, entries, main, problems, render

HEAD = f"# Decisions\n\n{BEGIN}\n{END}\n\n"


def test_the_index_is_the_generated_one() -> None:
    text = DECISIONS.read_text()
    assert render(text) == text, f"docs/decisions.md's index is stale: run {COMMAND}"


def test_every_entry_states_one_status_and_names_only_later_decisions_that_name_it_back() -> None:
    text = DECISIONS.read_text()
    assert problems(text) == []
    assert len(entries(text)) >= 171


def test_the_index_counts_and_links_each_entry() -> None:
    text = HEAD + (
        "## D1. First `thing`: a/b (Q1)\n*Status:* superseded by D3\n\nbody\n\n"
        "## D2. Second | pipe\n*Status:* kept\n\n"
        "## D3. Third (amends D1)\n*Status:* kept\n"
    )
    made = render(text)
    assert "3 decisions: 2 kept, 0 amended, 1 superseded." in made
    assert (
        "| D1 | [First `thing`: a/b (Q1)](#d1-first-thing-ab-q1) | superseded by [D3](#d3-" in made
    )
    assert r"| D2 | [Second \| pipe](#d2-second--pipe) | kept |" in made
    assert render(made) == made


WRONG = [
    ("## D1. A\n\n*Context:* no status\n", "D1 has no status line under its heading"),
    ("## D1. A\n*Status:* Kept\n", "D1 has no status line under its heading"),
    ("## D1. A\n*Status:* amended by D2 and D3\n", "D1 has no status line under its heading"),
    ("## D1. A\n*Status:* kept\n\nbody\n*Status:* kept\n", "D1 has a second `*Status:*` line"),
    ("## D2. A\n*Status:* kept\n## D1. B\n*Status:* kept\n", "D1 comes after D2"),
    ("## D1. A\n*Status:* kept\n## D1. B\n*Status:* kept\n", "D1 comes after D1"),
    ("## D1. A\n*Status:* amended by D9\n", "D1's status names D9, which does not exist"),
    (
        "## D1. A (amends D2)\n*Status:* kept\n## D2. B\n*Status:* superseded by D1\n",
        "D2's status names D1, which is not later",
    ),
    (
        "## D1. A\n*Status:* amended by D2\n## D2. B\n*Status:* kept\n\n*Choice:* more.\n",
        "D2 changes D1 and should say so: (amends D1)",
    ),
]


@pytest.mark.parametrize(("entries_text", "problem"), WRONG, ids=[p for _, p in WRONG])
def test_a_broken_rule_is_named_and_no_index_is_written(entries_text: str, problem: str) -> None:
    assert any(found.startswith(problem) for found in problems(HEAD + entries_text)), problem
    with pytest.raises(ValueError, match=re.escape(problem)):
        render(HEAD + entries_text)


def test_an_amendment_named_back_in_the_body_passes() -> None:
    text = HEAD + (
        "## D1. A\n*Status:* amended by D2, D3\n"
        "## D2. B\n*Status:* kept\n\n*Choice (amends D1):* x.\n"
        "## D3. C\n*Status:* kept\n\nThis amends D0, D1; prose may quote `*Status:* kept`.\n"
    )
    assert problems(text) == []


def test_the_index_needs_its_two_markers() -> None:
    with pytest.raises(ValueError, match="index markers"):
        render("# Decisions\n\n## D1. A\n*Status:* kept\n")


def test_the_command_checks_the_real_file() -> None:
    ran = subprocess.run(
        [sys.executable, "docs/decisions_index.py", "--check"],
        cwd=DECISIONS.parent.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (ran.returncode, ran.stderr) == (0, "")


def test_a_stale_index_is_refused_by_check_and_rewritten_by_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "decisions.md"
    path.write_text(HEAD + "## D1. A\n*Status:* kept\n")
    assert main(["--check"], path) == 1
    assert capsys.readouterr().err.endswith(f"the index is stale; run {COMMAND}\n")
    assert main([], path) == 0
    assert "| D1 | [A](#d1-a) | kept |" in path.read_text()
    assert main(["--check"], path) == 0
    path.write_text(path.read_text() + "## D2. B\n")
    assert main([], path) == 1
    assert "D2 has no status line" in capsys.readouterr().err
