"""What building a lane's messages costs, by decoder: the figure behind resume's remaining gap.

    .venv/bin/python bench/decode_options.py                 # H = 10, 100, 1000 turns
    .venv/bin/python bench/decode_options.py --turns 1000 --reps 9

Resume with the messages loaded at H = 1,000 builds the 4,000 messages of `bench/vs_langgraph.py`'s
workload (a user message, a tool call, its result, a 200-character answer a turn); the peer
unpickles one checkpoint. This times building those messages from their JSON, in CPU time
(minimum of `--reps`), the ways a store could hold them:

- ``pydantic``: our message models from one JSON array, validated (what a snapshot of the window
  in one blob would cost, read back with today's models);
- ``pydantic/msg``: the same, one message at a time (the store keeps a message per entry);
- ``pickle``: the same objects unpickled (what the peer does with its own);
- ``msgspec``: the same JSON decoded into ``msgspec.Struct`` types of the same shape (the messages
  as a different kind of type, a change of the runtime's public types); shown when msgspec is
  installed (``.venv/bin/pip install msgspec``), which the project does not need otherwise.
"""

from __future__ import annotations

import argparse
import gc
import json
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python bench/decode_options.py` as well as `-m bench....`
    sys.path.insert(0, str(ROOT))

from pydantic import TypeAdapter  # noqa: E402

from bench.interrupt import run_main  # noqa: E402
from harness_core.messages import AgentMessage  # noqa: E402

ANSWER_TAIL = "quick brown fox jumps over the lazy dog while an agent checks the inventory ledger "


def turn(k: int) -> list[dict[str, Any]]:
    """The four messages of turn `k`, as the store writes them (JSON shapes)."""
    usage = {"input": 21 + k, "output": 10, "cache_read": 0, "cache_write": 0,
             "total_tokens": 31 + k}  # fmt: skip
    return [
        {"role": "user", "content": [{"type": "text", "text": f"Turn {k:06d}: check item-{k:06d}"}]},
        {"role": "assistant", "stop_reason": "tool_use", "provider": "scripted", "model": "w",
         "content": [{"type": "tool_call", "id": f"call-{k:06d}", "name": "lookup",
                      "arguments": {"item": f"item-{k:06d}"}}], "usage": usage},
        {"role": "tool_result", "tool_call_id": f"call-{k:06d}", "tool_name": "lookup",
         "content": [{"type": "text", "text": f"item-{k:06d}: in stock"}], "outcome": "ok"},
        {"role": "assistant", "stop_reason": "stop", "provider": "scripted", "model": "w",
         "content": [{"type": "text", "text": (f"Answer {k:06d}: " + ANSWER_TAIL * 3)[:200]}],
         "usage": usage},
    ]  # fmt: skip


def cpu_ms(fn: Callable[[], object], reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        gc.collect()
        started = time.process_time()
        fn()
        best = min(best, time.process_time() - started)
    return best * 1000


Decode = Callable[[bytes], list[Any]]
Encode = Callable[[Any], bytes]


def msgspec_decoder() -> tuple[Decode, Encode] | None:
    """Msgspec Structs of the messages' shape: a decoder and an encoder (None: no msgspec)."""
    try:
        import msgspec  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return None

    # built by `defstruct` with the types themselves: this module's annotations are strings
    def struct(name: str, fields: list[Any], **options: Any) -> Any:
        return msgspec.defstruct(name, fields, frozen=True, **options)

    text = struct("TextPart", [("text", str)], tag_field="type", tag="text")
    thinking = struct("ThinkingPart", [("thinking", str)], tag_field="type", tag="thinking")
    call = struct(
        "ToolCallPart",
        [("id", str), ("name", str), ("arguments", dict[str, Any])],
        tag_field="type",
        tag="tool_call",
    )
    cost = struct("Cost", [(n, float, 0.0) for n in ("input", "output", "cache_read",
                                                     "cache_write", "total")])  # fmt: skip
    usage = struct(
        "Usage",
        [(n, int, 0) for n in ("input", "output", "cache_read", "cache_write", "total_tokens")]
        + [("cost", cost, msgspec.field(default_factory=cost))],
    )
    stamp = ("timestamp", int | None, None)
    user = struct(
        "UserMessage",
        [("content", list[text]), ("sender", str | None, None), stamp],  # type: ignore[valid-type, unused-ignore]
        tag_field="role",
        tag="user",
    )
    assistant = struct(
        "AssistantMessage",
        [("content", list[text | thinking | call]), ("stop_reason", str),  # type: ignore[valid-type, unused-ignore]
         ("provider", str), ("model", str), ("usage", usage | None, None), ("error", Any, None),
         ("raw_stop_reason", str | None, None), ("deferred", Any, None), stamp],
        tag_field="role",
        tag="assistant",
    )  # fmt: skip
    result = struct(
        "ToolResultMessage",
        [("tool_call_id", str), ("tool_name", str), ("content", list[text]),  # type: ignore[valid-type, unused-ignore]
         ("outcome", str), ("details", Any, None), ("usage", usage | None, None), stamp],
        tag_field="role",
        tag="tool_result",
    )  # fmt: skip
    decoder = msgspec.json.Decoder(list[user | assistant | result])  # type: ignore[valid-type, unused-ignore]
    return decoder.decode, msgspec.json.encode


MANY = TypeAdapter(list[AgentMessage])
ONE = TypeAdapter(AgentMessage)


def measure(h: int, reps: int, spec: tuple[Decode, Encode] | None) -> str:
    """One row: H, messages, JSON KiB, then CPU ms by decoder."""
    messages = MANY.validate_python([m for k in range(1, h + 1) for m in turn(k)])
    blob = MANY.dump_json(messages)
    rows = [ONE.dump_json(m) for m in messages]
    pickled = pickle.dumps(messages)
    figures = [
        cpu_ms(lambda: MANY.validate_json(blob), reps),
        cpu_ms(lambda: [ONE.validate_json(row) for row in rows], reps),
        cpu_ms(lambda: pickle.loads(pickled), reps),
    ]
    shown = [f"{ms:.2f}" for ms in figures]
    if spec is None:
        shown.append("-")
    else:
        decode, encode = spec
        if json.loads(encode(decode(blob))) != json.loads(blob):  # the same messages, every field
            raise AssertionError("msgspec's messages differ from pydantic's")
        shown.append(f"{cpu_ms(lambda: decode(blob), reps):.2f}")
    return f"{h} | {len(messages)} | {len(blob) / 1024:.0f} | " + " | ".join(shown)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--turns", default="10,100,1000", help="history lengths H, in turns")
    parser.add_argument("--reps", type=int, default=7, help="timings per figure (the minimum)")
    args = parser.parse_args(argv)
    try:
        sizes = sorted({int(h) for h in str(args.turns).split(",")})
    except ValueError:
        parser.error(f"--turns must be whole numbers separated by commas (got {args.turns!r})")
    if not sizes or sizes[0] <= 0 or args.reps <= 0:
        parser.error("--turns and --reps must be positive")
    spec = msgspec_decoder()
    print("# CPU ms to build a lane's messages from their stored form, minimum of", args.reps)
    print("H | messages | JSON KiB | pydantic | pydantic/msg | pickle | msgspec")
    for h in sizes:
        print(measure(h, args.reps, spec), flush=True)
    if spec is None:
        print("# msgspec: not installed (.venv/bin/pip install msgspec)")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main))
