"""`gateway ops`'s command line: what each command takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.cli import main
from gateway.ops.cli.parser import build_parser
from gateway.ops.cli.target import Target


@pytest.mark.parametrize("command", ["redeliver", "discard"])
def test_every_acting_delivery_command_takes_yes(command: str) -> None:
    # a script passing --yes to every acting command broke on redeliver, which does not ask
    args = build_parser().parse_args([command, "reply:s:1", "--yes"])
    assert (args.delivery_id, args.yes) == ("reply:s:1", True)


def test_the_store_and_config_given_before_ops_are_ops_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`gateway --config FILE ops mcp` said "unrecognized arguments: mcp"; `ops` had no
    --store, so the token file of a gateway serving another store could not be found."""
    store = f"sqlite:///{tmp_path}/gw.db"
    config = tmp_path / "gateway.toml"
    config.write_text('log_level = "info"\n')
    for leading in (["--store", store], [f"--config={config}"], ["--config", str(config)]):
        code = main([*leading, "ops", "lanes", "--url", "http://127.0.0.1:9", "--token", "t"])
        said = capsys.readouterr().err
        assert code == 3, said  # it got as far as the gateway: the arguments were understood
        assert "cannot reach the gateway" in said
    args = build_parser().parse_args(["lanes", "--store", store])
    assert Target(args, None).token_file() == tmp_path / "ops-token"


def test_a_bad_store_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # "unexpected ValidationError: 1 validation error for Settings\nstore_url..." before
    assert main(["ops", "--store", "foo://x", "lanes"]) == 2
    said = capsys.readouterr().err
    assert said.startswith("gateway ops: cannot read the settings (store_url='foo://x' ")
    assert said.count("\n") == 1
    assert main(["ops", "--store", "", "lanes"]) == 2  # not the default store's
    said = capsys.readouterr().err
    assert said.startswith("gateway ops: --store is empty") and said.count("\n") == 1
