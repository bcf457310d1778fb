"""The container packaging: Dockerfile, .dockerignore and compose.yaml stay true to the package.

No container runtime runs here, so the image is checked in two ways. Its instructions are parsed
(multi-stage, non-root, a health check, ``gateway serve``), and its builder stage is *executed*
outside Docker: the COPY steps copy the build context (honouring .dockerignore) into a temporary
directory and the RUN steps run there, with the image's paths (/opt/venv, /wheels, /src) mapped
to temporary ones. The resulting venv is what the runtime stage copies, so starting its
``gateway serve`` and asking ``/healthz`` (with the Dockerfile's own HEALTHCHECK command) shows
that ``pip install`` of the project gives a working service and that the image cannot drift
from the package. compose.yaml is read with a small parser for the YAML it uses (no PyYAML).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from config import Settings
from config.loader import settings_table
from gateway.channels import gateway_sections
from gateway.channels import load_gateway_settings as load_settings

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness_core", "adapters", "gateway", "config")
SETTINGS = settings_table(gateway_sections())
"""Every setting by name, each channel section's included (``slack_bot_token``)."""
SECRET_SETTINGS = frozenset(name for name, setting in SETTINGS.items() if setting.secret)
# Non-Python files of the packages that the wheel need not carry: read by people, not the code.
NOT_SHIPPED = frozenset({"adapters/slack/manifest.json", "adapters/slack/manifest-http.json"})


# --- Dockerfile ---------------------------------------------------------------------------


@dataclass
class Stage:
    """One FROM ... stage: its base image, its name and its instructions in order."""

    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str:
        found = self.all(keyword)
        assert found, f"stage {self.name or self.base} has no {keyword}"
        return found[-1]

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for args in self.all("ENV"):
            for pair in shlex.split(args):
                key, equals, value = pair.partition("=")
                assert equals, f"ENV {args!r}: use the KEY=value form"
                values[key] = value
        return values


def parse_dockerfile(text: str) -> list[Stage]:
    """The stages of a Dockerfile (comments dropped, continuation lines joined)."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not pending):
            continue
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    stages: list[Stage] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            assert len(words) in (1, 3), f"FROM {args!r}: expected IMAGE [AS NAME]"
            stages.append(Stage(base=words[0], name=name))
        else:
            assert stages, f"{keyword} before any FROM"
            stages[-1].instructions.append((keyword, args))
    return stages


def exec_form(args: str) -> list[str]:
    """A JSON (exec form) argument list; the shell form is refused."""
    assert args.startswith("["), f"{args!r}: use the exec (JSON) form"
    words = json.loads(args)
    assert isinstance(words, list)
    assert all(isinstance(word, str) for word in words)
    return [str(word) for word in words]


def healthcheck_command(stage: Stage) -> list[str]:
    """The HEALTHCHECK's command, its options (--interval=...) skipped."""
    options, cmd, command = (" " + stage.last("HEALTHCHECK")).partition(" CMD ")
    assert cmd, "HEALTHCHECK CMD [...] (not NONE)"
    assert all(option.startswith("--") for option in options.split()), options
    return exec_form(command.strip())


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def builder(stages: list[Stage]) -> Stage:
    return stages[0]


@pytest.fixture(scope="module")
def runtime(stages: list[Stage]) -> Stage:
    return stages[-1]


def test_the_image_is_built_in_one_stage_and_runs_in_another(
    stages: list[Stage], builder: Stage, runtime: Stage
) -> None:
    assert len(stages) == 2
    assert builder.name == "builder"
    # The runtime stage reuses the venv as is: its python symlinks must resolve there too.
    assert builder.base == runtime.base == "python:3.11-slim"
    copies = [shlex.split(args) for args in runtime.all("COPY")]
    assert copies == [["--from=builder", "/opt/venv", "/opt/venv"]], "copy only the venv"
    assert runtime.env()["PATH"].startswith("/opt/venv/bin:")


def test_the_runtime_runs_as_a_user_that_is_not_root(runtime: Stage) -> None:
    user = runtime.last("USER").split(":")[0]
    assert user not in ("root", "0", ""), user
    keywords = [keyword for keyword, _ in runtime.instructions]
    # The user is switched before the entry point, and no RUN follows as that user.
    last_user = max(i for i, k in enumerate(keywords) if k == "USER")
    assert keywords.index("ENTRYPOINT") > last_user
    assert "RUN" not in keywords[last_user:]


def test_the_entry_point_is_gateway_serve(runtime: Stage) -> None:
    assert exec_form(runtime.last("ENTRYPOINT")) + exec_form(runtime.last("CMD")) == [
        "gateway",
        "serve",
    ]


def test_the_embedded_store_has_a_writable_volume(runtime: Stage) -> None:
    assert runtime.last("WORKDIR") == "/data"
    assert runtime.last("VOLUME") in ("/data", '["/data"]')
    uid, _, gid = runtime.last("USER").partition(":")
    runs = " ".join(runtime.all("RUN"))
    assert f"--uid {uid}" in runs and f"--gid {gid}" in runs, "USER is the user created"
    assert "chown gateway:gateway /data" in runs, "the user can write the store"
    assert runtime.last("EXPOSE") == str(Settings().port)


def test_the_health_check_asks_healthz_with_python(runtime: Stage) -> None:
    command = healthcheck_command(runtime)
    assert command[:2] == ["python", "-c"]
    script = command[2]
    assert "urllib.request" in script
    assert "http://127.0.0.1:%s/healthz" in script
    assert f"os.environ.get('GATEWAY_PORT', '{Settings().port}')" in script
    assert not {"curl", "wget"} & set(" ".join(command).split())


def test_the_image_sets_no_listen_address_and_no_store(stages: list[Stage]) -> None:
    # GATEWAY_HOST=0.0.0.0 is for whoever runs the image to choose (compose.yaml does), and an
    # explicit store URL would win over GATEWAY_REDIS_URL.
    for stage in stages:
        assert not {
            "GATEWAY_HOST",
            "GATEWAY_STORE_URL",
            "GATEWAY_BROKER_URL",
            "GATEWAY_WEB_URL",
        } & set(stage.env())


# --- .dockerignore --------------------------------------------------------------------------


def _glob_regex(pattern: str) -> re.Pattern[str]:
    assert "[" not in pattern and "\\" not in pattern, f"{pattern!r}: not understood here"
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def dockerignore(text: str) -> Callable[[str], bool]:
    """Whether a context-relative path is left out of the build context (Docker's rules).

    A pattern matches a path or any directory above it; ``!`` takes a path back; the last
    matching pattern decides.
    """
    rules: list[tuple[bool, re.Pattern[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        rules.append((keep, _glob_regex(line.removeprefix("!").strip("/"))))

    def ignored(path: str) -> bool:
        parts = path.strip("/").split("/")
        prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
        verdict = False
        for keep, rule in rules:
            if any(rule.fullmatch(prefix) for prefix in prefixes):
                verdict = not keep
        return verdict

    return ignored


@pytest.fixture(scope="module")
def ignored() -> Callable[[str], bool]:
    return dockerignore((ROOT / ".dockerignore").read_text(encoding="utf-8"))


def test_dockerignore_keeps_secrets_and_local_state_out(ignored: Callable[[str], bool]) -> None:
    for path in (".env", ".env.local", ".venv/bin/python", ".git/HEAD", ".gateway/gateway.db"):
        assert ignored(path), path
    for path in ("gateway/__pycache__/cli.cpython-311.pyc", "tests/test_packaging.py"):
        assert ignored(path), path
    for path in ("pyproject.toml", "README.md", "gateway/cli.py", "gateway/broker/lua/x.lua"):
        assert not ignored(path), path


# --- the builder stage, run outside Docker ------------------------------------------------------

# Where the builder stage's absolute paths live when it runs here.
BUILD_PATHS = ("/opt/venv", "/wheels", "/src")
_ABSOLUTE = re.compile(r"(?<![\w./-])/[\w./*-]+")


def _clean_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment minus this venv, this checkout and every GATEWAY_* setting."""
    drop = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in drop and not key.startswith("GATEWAY_")
    }
    return {**env, **(extra or {})}


def run_builder_stage(stage: Stage, ignored: Callable[[str], bool], into: Path) -> Path:
    """Run `stage`'s COPY and RUN steps with its paths under `into`; returns the venv."""
    mapped = {path: into / path.strip("/").replace("/", "-") for path in BUILD_PATHS}
    shim = into / "bin"
    shim.mkdir()
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    assert base.is_file(), base
    (shim / "python").write_text(f'#!/bin/sh\nexec {shlex.quote(str(base))} "$@"\n')
    (shim / "python").chmod(0o755)
    # The image's build ENV, but with pip's cache (PIP_NO_CACHE_DIR only keeps the image small).
    build_env = {key: value for key, value in stage.env().items() if key != "PIP_NO_CACHE_DIR"}
    env = _clean_env(
        {**build_env, "PATH": f"{shim}{os.pathsep}{os.environ.get('PATH', os.defpath)}"}
    )
    workdir: Path | None = None
    for keyword, args in stage.instructions:
        if keyword == "WORKDIR":
            assert args in mapped, f"WORKDIR {args}: map it in BUILD_PATHS"
            workdir = mapped[args]
            workdir.mkdir(parents=True, exist_ok=True)
        elif keyword == "COPY":
            assert workdir is not None, "COPY before WORKDIR"
            *sources, dest = shlex.split(args)
            assert not any(source.startswith("-") for source in sources), f"COPY {args}: flags"
            assert dest.endswith("/") and not dest.startswith("/"), f"COPY {args}: into a dir/"
            target = workdir / dest
            target.mkdir(parents=True, exist_ok=True)
            for source in sources:
                path = ROOT / source
                assert path.exists(), f"COPY {source}: not in the build context"
                assert not ignored(source), f"COPY {source}: left out by .dockerignore"
                if path.is_dir():
                    shutil.copytree(
                        path, target, dirs_exist_ok=True, ignore=_context_filter(ignored)
                    )
                else:
                    shutil.copy2(path, target / path.name)
        elif keyword == "RUN":
            assert workdir is not None, "RUN before WORKDIR"
            assert not args.startswith("["), f"RUN {args}: use the shell form"
            for path in _ABSOLUTE.findall(args):
                inside = any(path == p or path.startswith(p + "/") for p in BUILD_PATHS)
                assert inside, f"RUN {args}: {path} is not under BUILD_PATHS"
            done = subprocess.run(
                ["sh", "-c", _map_paths(args, mapped)],
                cwd=workdir,
                env=env,
                capture_output=True,
                text=True,
                timeout=240,
                check=False,
            )
            assert done.returncode == 0, f"RUN {args}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        else:
            assert keyword in ("ENV", "ARG"), f"{keyword}: this test does not know how to run it"
    return mapped["/opt/venv"]


def _map_paths(command: str, mapped: Mapping[str, Path]) -> str:
    """`command` with each of the image's paths in `mapped` replaced by its local directory."""
    alternatives = "|".join(re.escape(path) for path in mapped)
    return re.sub(
        rf"(?<![\w./-])(?:{alternatives})(?![\w.-])",
        lambda match: shlex.quote(str(mapped[match.group(0)])),
        command,
    )


def _context_filter(ignored: Callable[[str], bool]) -> Callable[[str, list[str]], set[str]]:
    """A `shutil.copytree` ignore function that leaves out what .dockerignore does."""

    def ignore(directory: str, names: list[str]) -> set[str]:
        relative = Path(directory).relative_to(ROOT).as_posix()
        return {name for name in names if ignored(f"{relative}/{name}")}

    return ignore


@pytest.fixture(scope="module")
def venv(
    builder: Stage, ignored: Callable[[str], bool], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The builder stage's venv, built here (once per module)."""
    return run_builder_stage(builder, ignored, tmp_path_factory.mktemp("image"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_venv_holds_the_package_and_its_data_not_the_checkout(
    venv: Path, tmp_path: Path
) -> None:
    script = (
        "import json, importlib; "
        f"print(json.dumps({{p: importlib.import_module(p).__file__ for p in {list(PACKAGES)!r}}}))"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", script],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    files = {name: Path(path).parent for name, path in json.loads(done.stdout).items()}
    site = files["gateway"].parent
    assert site.name == "site-packages" and site.is_relative_to(venv), site
    assert all(directory.parent == site for directory in files.values()), files
    missing = [
        relative
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*"))
        if path.is_file()
        and path.suffix not in (".py", ".pyc")
        and "__pycache__" not in path.parts
        and (relative := path.relative_to(ROOT).as_posix()) not in NOT_SHIPPED
        and not (site / relative).is_file()
    ]
    assert missing == [], "add them to [tool.setuptools.package-data] in pyproject.toml"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_installed_command_answers_help(venv: Path, tmp_path: Path) -> None:
    done = subprocess.run(
        [str(venv / "bin" / "gateway"), "--help"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "serve" in done.stdout


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _post_json(url: str, body: Mapping[str, Any]) -> int:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return int(response.status)


def _wait_for_reply(url: str, deadline: float) -> str | None:
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url, timeout=5) as response:
            thread = json.loads(response.read())
        replies = [item["text"] for item in thread["items"] if item["kind"] == "reply"]
        if replies:
            return str(replies[0])
        time.sleep(0.2)
    return None


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_installed_service_serves_passes_its_health_check_and_drains(
    venv: Path, runtime: Stage, tmp_path: Path
) -> None:
    data = tmp_path / "data"  # the image's WORKDIR: the embedded store goes under it
    data.mkdir()
    port = _free_port()
    env = _clean_env(
        {
            "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            **{key: value for key, value in runtime.env().items() if key != "PATH"},
            "GATEWAY_PORT": str(port),
        }
    )
    entry = exec_form(runtime.last("ENTRYPOINT")) + exec_form(runtime.last("CMD"))
    check = healthcheck_command(runtime)
    # Found on PATH like in the image: both must be the venv's.
    for command in (entry, check):
        found = shutil.which(command[0], path=env["PATH"])
        assert found is not None and Path(found).parent == venv / "bin", command[0]
        command[0] = found
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "gateway.log"
    with (
        log.open("wb") as out,
        subprocess.Popen(entry, cwd=data, env=env, stdout=out, stderr=out) as process,
    ):
        try:
            deadline = time.monotonic() + 30
            status = 0
            while time.monotonic() < deadline and process.poll() is None:
                try:
                    status = _get(f"{base}/healthz")
                except OSError:
                    status = 0
                if status == 200:
                    break
                time.sleep(0.2)
            assert status == 200, log.read_text(errors="replace")
            assert _get(f"{base}/readyz") == 200
            assert (data / ".gateway" / "gateway.db").is_file()

            healthy = subprocess.run(check, env=env, capture_output=True, timeout=30, check=False)
            assert healthy.returncode == 0, healthy.stderr

            # A message in, its reply out (scripted:echo): workers and deliverer run too.
            assert _post_json(f"{base}/web/threads/hello/messages", {"text": "hello"}) == 202
            reply = _wait_for_reply(f"{base}/web/threads/hello", deadline=time.monotonic() + 20)
            assert reply == "You said: hello", log.read_text(errors="replace")

            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=Settings().shutdown_seconds + 5) == 0, log.read_text(
                errors="replace"
            )
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    # With nothing listening the same health check fails, so it does test something.
    unhealthy = subprocess.run(check, env=env, capture_output=True, timeout=30, check=False)
    assert unhealthy.returncode != 0


# --- compose.yaml -------------------------------------------------------------------------


class YamlSubset:
    """The YAML compose.yaml uses: block mappings and sequences, plain and quoted scalars,
    comments, anchors on mappings (``&name``) and merge keys (``<<: *name``).

    Anything else (flow collections, block scalars, multi-document) is refused, so a change
    to the file that this cannot read fails here instead of being misread.
    """

    def __init__(self, text: str) -> None:
        self.lines: list[tuple[int, str, int]] = []  # (indent, content, line number)
        for number, raw in enumerate(text.splitlines(), 1):
            content = self._strip_comment(raw).rstrip()
            if content.strip():
                self.lines.append(
                    (len(content) - len(content.lstrip(" ")), content.strip(), number)
                )
        self.anchors: dict[str, Any] = {}
        self.at = 0

    @staticmethod
    def _strip_comment(line: str) -> str:
        quote = None
        for i, char in enumerate(line):
            if quote:
                if char == quote:
                    quote = None
            elif char in "\"'":
                quote = char
            elif char == "#" and (i == 0 or line[i - 1] in " \t"):
                return line[:i]
        return line

    def parse(self) -> Any:
        value = self._block(0)
        assert self.at == len(self.lines), f"line {self.lines[self.at][2]}: unexpected indent"
        return value

    def _scalar(self, text: str, number: int) -> Any:
        if text in ("", "~", "null"):
            return None
        if text[0] in "[{|>!%@`":
            raise AssertionError(f"line {number}: {text!r} is YAML this parser does not read")
        if text[0] == "*":
            return self.anchors[text[1:]]
        if text[0] in "\"'":
            assert text[-1] == text[0] and len(text) > 1, f"line {number}: unclosed quote"
            return json.loads(text) if text[0] == '"' else text[1:-1].replace("''", "'")
        return text

    def _block(self, indent: int) -> Any:
        first = self.lines[self.at][1]
        if first == "-" or first.startswith("- "):
            return self._sequence(indent)
        return self._mapping(indent)

    def _value(self, rest: str, indent: int, number: int) -> Any:
        anchor = None
        if rest.startswith("&"):
            anchor, _, rest = rest[1:].partition(" ")
            rest = rest.strip()
        if rest:
            value = self._scalar(rest, number)
        elif self.at < len(self.lines) and self.lines[self.at][0] > indent:
            value = self._block(self.lines[self.at][0])
        elif (
            self.at < len(self.lines)
            and self.lines[self.at][0] == indent
            and (self.lines[self.at][1].startswith("- "))
        ):
            value = self._sequence(indent)  # a sequence may sit at its key's indent
        else:
            value = None
        if anchor:
            self.anchors[anchor] = value
        return value

    def _mapping(self, indent: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        merged: dict[str, Any] = {}
        while self.at < len(self.lines) and self.lines[self.at][0] == indent:
            _, content, number = self.lines[self.at]
            if content.startswith("- "):
                break
            match = re.fullmatch(
                r"(\"[^\"]*\"|'[^']*'|[^\s:'\"][^:]*?|<<)\s*:(?:\s+(.*))?", content
            )
            assert match, f"line {number}: {content!r} is not `key: value`"
            key = str(self._scalar(match.group(1), number))
            self.at += 1
            value = self._value((match.group(2) or "").strip(), indent, number)
            if key == "<<":
                assert isinstance(value, dict), f"line {number}: merge a mapping"
                merged.update(value)
            else:
                assert key not in result, f"line {number}: {key} twice"
                result[key] = value
        return {**merged, **result}

    def _sequence(self, indent: int) -> list[Any]:
        result: list[Any] = []
        while self.at < len(self.lines) and self.lines[self.at][0] == indent:
            _, content, number = self.lines[self.at]
            if not content.startswith("- "):
                break
            item = content[2:].strip()
            if re.match(r"[^\s:'\"][^:]*:(\s|$)", item):
                # `- key: value` opens a mapping whose keys align with `key`
                inner = indent + 2
                self.lines[self.at] = (inner, item, number)
                result.append(self._mapping(inner))
            else:
                self.at += 1
                result.append(self._value(item, indent, number))
        return result


def test_the_yaml_subset_reads_anchors_merges_and_refuses_flow_style() -> None:
    text = (
        "base: &b\n  a: 1\n  list:\n    - x\n    - path: .env\n      required: false\n"
        "one:\n  <<: *b\n  a: '2'  # mine wins\n  empty:\n"
    )
    parsed = YamlSubset(text).parse()
    assert parsed["one"] == {
        "a": "2",
        "list": ["x", {"path": ".env", "required": "false"}],
        "empty": None,
    }
    with pytest.raises(AssertionError, match="does not read"):
        YamlSubset("a: [1, 2]\n").parse()


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    parsed = YamlSubset((ROOT / "compose.yaml").read_text(encoding="utf-8")).parse()
    assert isinstance(parsed, dict)
    return parsed


def _environment(service: Mapping[str, Any]) -> dict[str, str | None]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] if "=" in item else (item, None) for item in env)
    assert isinstance(env, dict)
    return env


def _gateways(compose: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in compose["services"].items() if name != "redis"}


def _seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", text)
    assert match, f"{text!r}: expected a duration like 20s"
    return float(match.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[match.group(2)]


def test_redis_syncs_every_write_to_its_volume(compose: Mapping[str, Any]) -> None:
    redis = compose["services"]["redis"]
    assert str(redis["image"]).split(":")[0] == "redis"
    assert str(redis["image"]).split(":")[1].startswith("7")
    command = redis["command"]
    assert command[0] == "redis-server"
    options = dict(zip(command[1::2], command[2::2], strict=True))
    assert options == {
        "--appendonly": "yes",
        "--appendfsync": "always",
        "--maxmemory-policy": "noeviction",  # an evicted key is an accepted message lost (D309)
    }
    volume, _, mount = redis["volumes"][0].partition(":")
    assert mount == "/data" and volume in compose["volumes"], "a named volume on /data"
    assert redis["healthcheck"]["test"][0] in ("CMD", "CMD-SHELL")


def test_two_gateway_replicas_share_that_redis(compose: Mapping[str, Any]) -> None:
    gateways = _gateways(compose)
    assert sorted(gateways) == ["gateway-1", "gateway-2"]
    published = []
    for name, service in gateways.items():
        assert service["build"] == ".", f"{name}: built from the Dockerfile"
        assert (ROOT / service["build"] / "Dockerfile").is_file()
        env = _environment(service)
        assert env["GATEWAY_REDIS_URL"] == "redis://redis:6379/0", name
        assert env["GATEWAY_HOST"] == "0.0.0.0", f"{name}: a published port needs it"
        assert service["depends_on"] == {"redis": {"condition": "service_healthy"}}, name
        for port in service["ports"]:
            host, _, container = port.rpartition(":")
            assert container == str(Settings().port), f"{name}: the image listens on 8787"
            assert host.startswith("127.0.0.1:"), f"{name}: no login: publish on loopback"
            published.append(host)
        assert _seconds(service["stop_grace_period"]) > Settings().shutdown_seconds, name
    assert len(published) == len(set(published)) == 2


_REQUIRED = re.compile(r"\$\{(GATEWAY_[A-Z_]+):\?[^}]+\}")
_DEFAULTED = re.compile(r"\$\{(GATEWAY_[A-Z_]+):-([^}]+)\}")
# A valid value for each variable compose.yaml requires (`${VAR:?message}`), to check the rest.
REQUIRED_EXAMPLES = {"GATEWAY_OPS_TOKENS": "compose:operator:" + "0123456789abcdef" * 2}


def test_compose_holds_no_secret_and_no_empty_setting(compose: Mapping[str, Any]) -> None:
    lines = (ROOT / "compose.yaml").read_text(encoding="utf-8").splitlines()
    text = "\n".join(YamlSubset._strip_comment(line) for line in lines)
    # An empty GATEWAY_* variable stops the gateway: `${VAR:-}` would, when VAR is unset.
    assert not re.search(r"\$\{[^}]*:?-\}", text)
    for name, service in compose["services"].items():
        for key, value in _environment(service).items():
            assert key.startswith("GATEWAY_"), f"{name}: {key}"
            setting = key.removeprefix("GATEWAY_").lower()
            assert setting in SETTINGS, f"{name}: {key} is no setting"
            assert value != "", f"{name}: {key} is empty"
            if setting in SECRET_SETTINGS:
                # passed through (unset when absent), or required with a message
                required = value is not None and _REQUIRED.fullmatch(value)
                assert value is None or (required and required.group(1) == key), (
                    f"{name}: {key} must come from the shell or .env"
                )


def test_the_replicas_settings_are_accepted(compose: Mapping[str, Any]) -> None:
    # What `gateway serve` reads in each replica (the required variables given, the
    # pass-through ones unset) must load: a host beyond loopback, say, needs its tokens.
    for name, service in _gateways(compose).items():
        environ: dict[str, str] = {}
        for key, value in _environment(service).items():
            if value is None:
                continue
            required = _REQUIRED.fullmatch(value)
            if required:
                assert required.group(1) in REQUIRED_EXAMPLES, "add it to REQUIRED_EXAMPLES"
                value = REQUIRED_EXAMPLES[required.group(1)]
            defaulted = _DEFAULTED.fullmatch(value)
            if defaulted:  # `${VAR:-default}`, VAR unset: the default
                assert defaulted.group(1) == key, f"{name}: {key} defaults from another variable"
                value = defaulted.group(2)
            assert "${" not in value, f"{name}: {key}={value}: not understood here"
            environ[key] = value
        settings = load_settings(environ)
        assert (
            settings.effective_store_url
            == settings.effective_broker_url
            == environ["GATEWAY_REDIS_URL"]
        ), f"{name}: store and broker both in Redis"


# --- docs ---------------------------------------------------------------------------------


def test_the_deploy_guide_names_only_real_settings_and_files() -> None:
    text = (ROOT / "docs" / "deploy.md").read_text(encoding="utf-8")
    for variable in sorted(set(re.findall(r"\bGATEWAY_[A-Z_]+[A-Z]\b", text))):
        assert variable.removeprefix("GATEWAY_").lower() in SETTINGS, variable
    for name in ("Dockerfile", "compose.yaml", ".dockerignore"):
        assert name in text
        assert (ROOT / name).is_file()
