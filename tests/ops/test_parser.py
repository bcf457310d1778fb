"""`gateway ops`'s command line: what each command takes."""

from __future__ import annotations

import pytest

from gateway.ops.cli.parser import build_parser


@pytest.mark.parametrize("command", ["redeliver", "discard"])
def test_every_acting_delivery_command_takes_yes(command: str) -> None:
    # a script passing --yes to every acting command broke on redeliver, which does not ask
    args = build_parser().parse_args([command, "reply:s:1", "--yes"])
    assert (args.delivery_id, args.yes) == ("reply:s:1", True)
