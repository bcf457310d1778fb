"""The agent plugin: found in the current directory, told the settings, and the shipped example.

The example (`examples/agent.py`) is what the README tells a newcomer to run, so it is driven
here the way the README does: a whole `Service` with the web channel, a question that calls its
safe tool, and a deploy that waits for the Approve button and then runs once.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from config import Settings, format_settings_error
from config.settings import accepted
from gateway.channels import gateway_settings
from gateway.plugin import PluginError, load_plugin
from tests.support.gateway_rig import decision_body, serving, thread_items


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A current directory of the test's own; modules imported from it are forgotten after."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield tmp_path
    # only the test's own modules: a library module imported meanwhile must stay the same object
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(tmp_path)):
            del sys.modules[name]


def _module(where: Path, name: str, source: str) -> None:
    (where / f"{name}.py").write_text(textwrap.dedent(source))


def test_a_plugin_in_the_current_directory_is_found(workdir: Path) -> None:
    _module(
        workdir,
        "myagent_here",
        """
        from harness_core import Tool

        async def ping(args, ctx):
            return "pong"

        def tools():
            return [Tool(name="ping", description="Ping.", execute=ping, replay="safe")]
        """,
    )
    plugin = load_plugin("myagent_here")
    assert [tool.name for tool in plugin.tools] == ["ping"]
    assert plugin.model is None


def test_a_missing_plugin_names_where_it_was_looked_for(workdir: Path) -> None:
    with pytest.raises(PluginError) as refused:
        load_plugin("no_such_agent_module")
    assert str(refused.value) == (
        f"GATEWAY_PLUGIN=no_such_agent_module: no module 'no_such_agent_module' in {workdir} or "
        "the installed packages (name a module like agent for ./agent.py or pkg.agent, or a "
        "file like examples/agent.py)"
    )


@pytest.mark.parametrize("name", ["os", "json", "empty_dir"])
def test_a_module_that_is_no_agent_is_refused(workdir: Path, name: str) -> None:
    """`GATEWAY_PLUGIN=os` (or an empty directory, imported as a namespace package) ran as no
    plugin at all: no tools, and nothing said so."""
    (workdir / "empty_dir").mkdir()
    with pytest.raises(PluginError, match="defines none of tools\\(\\), model\\(\\) or adapters"):
        load_plugin(name)


def test_a_plugin_whose_own_import_fails_says_which(workdir: Path) -> None:
    _module(workdir, "needs_a_dependency", "import not_installed_anywhere\n")
    with pytest.raises(PluginError) as refused:
        load_plugin("needs_a_dependency")
    assert str(refused.value) == (
        "GATEWAY_PLUGIN=needs_a_dependency: cannot import it "
        "(ModuleNotFoundError: No module named 'not_installed_anywhere')"
    )


def test_model_is_given_the_settings_when_it_takes_them(workdir: Path) -> None:
    _module(
        workdir,
        "picky_agent",
        """
        from harness_core import ModelRef, ScriptedModel

        seen = []

        def model(settings):
            seen.append(settings.model)
            if settings.model != "scripted:echo":
                return None
            return ScriptedModel(), ModelRef(provider="scripted", model_id="mine")
        """,
    )
    mine = load_plugin("picky_agent", Settings())
    assert mine.model is not None and mine.model[1].model_id == "mine"
    configured = load_plugin("picky_agent", Settings(model="openai:gpt-4.1-mini"))
    assert configured.model is None  # None: the model GATEWAY_MODEL names
    assert sys.modules["picky_agent"].seen == ["scripted:echo", "openai:gpt-4.1-mini"]


def test_a_model_without_parameters_still_works(workdir: Path) -> None:
    _module(
        workdir,
        "plain_agent",
        """
        from harness_core import ModelRef, ScriptedModel

        def model():
            return ScriptedModel(), ModelRef(provider="scripted", model_id="plain")
        """,
    )
    plugin = load_plugin("plain_agent", Settings())
    assert plugin.model is not None and plugin.model[1].model_id == "plain"


def test_a_model_returning_something_else_is_refused(workdir: Path) -> None:
    _module(workdir, "odd_agent", "def model(settings):\n    return 'gpt'\n")
    with pytest.raises(PluginError, match=r"model\(\) must return \(client, ModelRef\) or None"):
        load_plugin("odd_agent", Settings())


@pytest.mark.parametrize(
    ("returned", "said"),
    [
        ("5", r"tools\(\) must return a list of Tool objects, not int"),  # was "unexpected error"
        ("'ping'", r"tools\(\) must return a list of Tool objects, not str"),
        ("None", r"tools\(\) must return a list of Tool objects, not NoneType"),
        ("[5]", r"tools\(\) must return Tool objects"),
    ],
)
def test_tools_returning_something_else_is_refused(workdir: Path, returned: str, said: str) -> None:
    name = f"odd_tools_{abs(hash(returned))}"
    _module(workdir, name, f"def tools():\n    return {returned}\n")
    with pytest.raises(PluginError, match=said):
        load_plugin(name, Settings())


def test_two_tools_of_one_name_or_a_plain_def_tool_are_refused_at_start(workdir: Path) -> None:
    """Two tools named alike: the last one ran, and the model was offered both (a provider that
    refuses that fails every request). A plain def ran its effect, then its call failed: the
    model would make it again (an outside probe)."""
    _module(
        workdir,
        "twice_named",
        """
        from harness_core import Tool, ToolContext, tool

        async def first(args: dict, ctx: ToolContext) -> str:
            return "one"

        async def second(args: dict, ctx: ToolContext) -> str:
            return "two"

        def tools():
            return [tool(name="lookup")(first), tool(name="lookup")(second)]
        """,
    )
    with pytest.raises(PluginError, match="tools\\(\\) names 'lookup' more than once"):
        load_plugin("twice_named", Settings())
    _module(
        workdir,
        "plain_def",
        """
        from harness_core import ToolContext, tool

        @tool()
        def syncfn(args: dict, ctx: ToolContext) -> str:
            return "sync result"

        def tools():
            return [syncfn]
        """,
    )
    with pytest.raises(PluginError) as raised:
        load_plugin("plain_def", Settings())
    assert "'syncfn': its function must be `async def`" in str(raised.value)


def test_a_tool_whose_schema_a_model_cannot_take_is_refused_at_start(workdir: Path) -> None:
    """A NaN default passed the start and failed every request of every thread offered the
    tool, three times each, then parked the lane stuck (an outside probe)."""
    _module(
        workdir,
        "nan_agent",
        """
        from pydantic import BaseModel
        from harness_core import ToolContext, tool

        class Hostile(BaseModel):
            n: float = float("nan")

        @tool()
        async def hostile(args: Hostile, ctx: ToolContext) -> str:
            return "never"

        def tools():
            return [hostile]
        """,
    )
    with pytest.raises(PluginError) as refused:
        load_plugin("nan_agent", Settings())
    said = str(refused.value)
    assert said.startswith("GATEWAY_PLUGIN=nan_agent: tool 'hostile' cannot be offered to a model")
    assert "\n" not in said and "nan" in said.lower()


# -- GATEWAY_PLUGIN as a module name or a .py file ----------------------------------------

ROOT = Path(__file__).resolve().parents[2]

PING = """
from harness_core import Tool

async def ping(args, ctx):
    return "pong"

def tools():
    return [Tool(name="ping", description="Ping.", execute=ping, replay="safe")]
"""

# What the setting takes (a module, or a .py file `load_plugin` looks for), and what it refuses
# with one line saying what to write instead.
PLUGIN_SETTINGS = [
    ("agent", True),
    ("mypkg.agent", True),
    ("examples/agent.py", True),
    ("./agent.py", True),
    ("/opt/agents/agent.py", True),
    ("../shared/my agent.py", True),
    ("examples/agent", False),
    ("agent.", False),
    ("my-agent", False),
    ("", False),
    ("agent.py\n", False),
    ("a/" * 2500 + "agent.py", False),
]


@pytest.mark.parametrize(("value", "taken"), PLUGIN_SETTINGS)
def test_the_plugin_setting_takes_a_module_or_a_file(value: str, taken: bool) -> None:
    if taken:
        assert Settings(plugin=value).plugin == value
        return
    with pytest.raises(ValidationError) as refused:
        Settings(plugin=value)
    said = format_settings_error(refused.value)
    assert (
        "expected a Python module like agent (./agent.py) or mypkg.agent, or the path of a .py"
        in (said)
    )
    assert "\n" not in said.strip()


def test_every_constrained_text_setting_says_what_it_takes() -> None:
    """No setting refuses a value with only "expected text" (what GATEWAY_PLUGIN=x.py said)."""
    for name, field in Settings.model_fields.items():
        rules = ("pattern", "min_length", "max_length")
        if any(getattr(m, rule, None) is not None for m in field.metadata for rule in rules):
            assert accepted(name) != "text", name


# A file's path (relative to the current directory or absolute), and what loading it says.
PLUGIN_FILES = [
    ("agents/pinger.py", None),
    ("./agents/pinger.py", None),
    ("{workdir}/agents/pinger.py", None),
    ("agents/missing.py", "GATEWAY_PLUGIN=agents/missing.py: no file {workdir}/agents/missing.py"),
    ("agents/bad-name.py", "bad-name.py cannot be imported (a module's file name is letters"),
    ("agents/json.py", "a module named 'json' is imported already"),
    ("agents/broken.py", "cannot import it (ZeroDivisionError: division by zero)"),
    # it made the command exit 3 without a word (an outside probe)
    (
        "agents/exits.py",
        "GATEWAY_PLUGIN=agents/exits.py: it exits while it is imported (sys.exit(3))",
    ),
]


@pytest.mark.parametrize(("value", "said"), PLUGIN_FILES)
def test_a_plugin_file_is_loaded_by_its_path(workdir: Path, value: str, said: str | None) -> None:
    folder = workdir / "agents"
    folder.mkdir()
    for name in ("pinger", "bad-name", "json"):
        _module(folder, name, PING)
    _module(folder, "broken", "1 / 0\n")
    _module(folder, "exits", "import sys\nsys.exit(3)\n")
    value = value.format(workdir=workdir)
    if said is None:
        plugin = load_plugin(value)
        assert [tool.name for tool in plugin.tools] == ["ping"]
        assert load_plugin(value).tools[0].execute is plugin.tools[0].execute  # imported once
        return
    with pytest.raises(PluginError) as refused:
        load_plugin(value)
    assert said.format(workdir=workdir) in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_plugin_file_imports_its_neighbours(workdir: Path) -> None:
    folder = workdir / "elsewhere"
    folder.mkdir()
    _module(folder, "shared_helpers_mod", "ANSWER = 'pong from a neighbour'\n")
    _module(
        folder,
        "with_neighbour",
        """
        from harness_core import Tool
        from shared_helpers_mod import ANSWER

        async def ping(args, ctx):
            return ANSWER

        def tools():
            return [Tool(name="ping", description="Ping.", execute=ping, replay="safe")]
        """,
    )
    assert [t.name for t in load_plugin("elsewhere/with_neighbour.py").tools] == ["ping"]


def test_the_readme_example_loads_by_its_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "agent", raising=False)
    try:
        plugin = load_plugin("examples/agent.py")
        assert {tool.name for tool in plugin.tools} == {"deploy_window", "deploy"}
        assert plugin.model is not None  # its scripted stand-in (GATEWAY_MODEL is scripted:echo)
    finally:
        sys.modules.pop("agent", None)


def test_the_example_uses_a_configured_model_instead_of_its_stand_in() -> None:
    plugin = load_plugin("examples.agent", Settings(model="anthropic:claude-sonnet-5-5"))
    assert plugin.model is None
    assert {tool.name: (tool.replay, tool.requires_approval) for tool in plugin.tools} == {
        "deploy_window": ("safe", False),
        "deploy": ("never", True),
    }


@pytest.fixture
async def example(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    settings = gateway_settings(
        store_url=f"sqlite:///{tmp_path}/store.db",
        broker_url=f"sqlite:///{tmp_path}/broker.db",
        web_url=f"sqlite:///{tmp_path}/web.db",
        plugin="examples.agent",
    )
    async with serving(settings) as http:
        yield http


async def _answers(http: httpx.AsyncClient, thread: str, count: int) -> list[dict[str, Any]]:
    return await thread_items(http, thread, ["reply", "approval_request"], count)


async def _post(http: httpx.AsyncClient, thread: str, text: str) -> None:
    response = await http.post(f"/web/threads/{thread}/messages", json={"text": text})
    assert response.status_code == 202, response.text


async def test_the_example_answers_from_its_safe_tool(example: httpx.AsyncClient) -> None:
    await _post(example, "window", "when is the deploy window?")
    [reply] = await _answers(example, "window", 1)
    assert reply["text"] == "Deploys are open Tuesday to Thursday, 10:00-16:00 UTC."


async def test_the_example_deploys_once_after_approve(example: httpx.AsyncClient) -> None:
    await _post(example, "ship", "deploy api")
    [asked] = await _answers(example, "ship", 1)
    assert asked["kind"] == "approval_request"
    approval = asked["approval"]
    [call] = approval["calls"]
    assert call["tool_name"] == "deploy" and call["args"] == {"service": "api"}
    decision = decision_body(approval, approved=True, key="click-1")
    response = await example.post("/web/threads/ship/decisions", json=decision)
    assert response.status_code == 202, response.text
    answers = await _answers(example, "ship", 2)
    assert answers[1]["kind"] == "reply"
    assert answers[1]["text"].startswith("api deployed (request ")


async def test_the_readme_s_two_messages_pasted_together_are_both_answered(
    example: httpx.AsyncClient,
) -> None:
    """The second message joined the first's run, and its one reply said only "api deployed":
    the deploy window, asked first, was never answered (the README says it is)."""
    await _post(example, "pasted", "when is the deploy window?")
    await _post(example, "pasted", "deploy api")
    asked = [a for a in await _answers(example, "pasted", 1) if a["kind"] == "approval_request"]
    if not asked:  # the first run ended before the second message came: its own reply first
        asked = [a for a in await _answers(example, "pasted", 2) if a["kind"] != "reply"]
    decision = decision_body(asked[0]["approval"], approved=True, key="click-pasted")
    response = await example.post("/web/threads/pasted/decisions", json=decision)
    assert response.status_code == 202, response.text
    items = await thread_items(example, "pasted", ["reply"], 1)
    while not any("api deployed" in item["text"] for item in items):
        items = await thread_items(example, "pasted", ["reply"], len(items) + 1)
    said = "\n".join(item["text"] for item in items)
    assert "Deploys are open Tuesday to Thursday" in said and "api deployed (request " in said


async def test_the_example_echoes_anything_else(example: httpx.AsyncClient) -> None:
    await _post(example, "chat", "hello")
    [reply] = await _answers(example, "chat", 1)
    assert reply["text"] == "You said: hello"


def test_the_example_stand_in_reads_a_second_author_s_request() -> None:
    """A thread's second author's message comes tagged (`[bob] deploy api`): the stand-in
    echoed it instead of calling `deploy`."""
    from examples.agent import respond
    from harness_core import ModelRef, ModelRequest, TextPart, ToolCallPart, UserMessage

    said = ("hi", "[Bob (U2)] deploy api")
    request = ModelRequest(
        model=ModelRef(provider="scripted", model_id="example"),
        messages=tuple(UserMessage(content=(TextPart(text=text),)) for text in said),
    )
    called = [p for p in respond(request).content if isinstance(p, ToolCallPart)]
    assert [(c.name, dict(c.arguments)) for c in called] == [("deploy", {"service": "api"})]
