"""`bench/redis_calls.py` runs end to end and names every call a gateway reply makes.

No figure is judged: what can fail is the script, the gateway's replies it waits for, and the
naming of the scripts (a new Lua script whose sha the bench cannot name shows as a raw sha).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_the_redis_calls_bench_names_every_call_of_a_reply() -> None:
    done = subprocess.run(
        [sys.executable, "bench/redis_calls.py", "--messages", "4", "--threads", "2",
         "--spaces", "1", "--rate", "0", "--settle", "0.2", "--trace"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    out = done.stdout
    assert out.startswith("4 messages (one at a time), 2 threads in 1 spaces"), out[:500]
    per_reply = {
        name.strip(): float(count)
        for name, count in re.findall(r"^  (EVALSHA \S+|[A-Z]+(?: BLOCK)?)\s+([\d.]+)$", out, re.M)
    }
    # one message, one reply: what each makes exactly once
    for name in ("EVALSHA broker:inbox_append", "EVALSHA broker:inbox_ack",
                 "EVALSHA broker:outbox_enqueue", "EVALSHA broker:outbox_settle"):  # fmt: skip
        assert per_reply.get(name) == 1.0, (name, out)
    assert per_reply["EVALSHA mailbox:append"] == 2.0, out  # the message and its reply
    assert per_reply["EVALSHA store:mutate"] >= 1.0, out
    unnamed = re.findall(r"EVALSHA [0-9a-f]{12}\b", out)
    assert not unnamed, f"scripts the bench cannot name: {unnamed}"
    assert "every top-level call, in order" in out
