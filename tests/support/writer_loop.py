"""A writer process for crash tests: appends forever and prints every acknowledged write.

Usage: python -m tests.support.writer_loop <store url> <session id> <owner>

Each acknowledged write prints ``ACK <kind> <id> <seq>`` (flushed) only after the storage call
returned, so whatever the parent saw acknowledged must survive a SIGKILL of this process.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sys

from harness_core.errors import SessionError
from harness_core.messages import TokenUsage
from harness_core.session.records import Usage
from harness_core.storage import open_repo
from harness_core.testing.builders import custom_entry, operation_finished, operation_started


async def main(url: str, session_id: str, owner: str) -> None:
    repo = open_repo(url)
    try:
        await repo.create(session_id)
    except SessionError as exc:
        if exc.code != "already_exists":
            raise
    lease = await repo.acquire_lease(session_id, owner=owner, ttl_ms=60_000)
    storage = await repo.open(session_id, lease=lease)
    for lane in ("a", "b"):
        if await storage.get_lane(lane) is None:
            await storage.create_lane(lane, None)
        # A predecessor killed between a start and its finish left the lane busy: close that
        # operation, as recovery would, before starting new ones.
        for opened in await storage.find_open_operations(lane):
            closed = await storage.append_record(
                operation_finished(f"recover-{os.getpid()}-{opened.id}", opened.id, lane=lane)
            )
            print("ACK record", closed.id, closed.seq, flush=True)
    print("READY", flush=True)
    for n in itertools.count():
        tag = f"{owner}-{os.getpid()}-{n}"
        lane = "a" if n % 2 else "b"
        if n % 7 == 3:
            record = await storage.append_record(
                Usage(id=f"u-{tag}", lane=lane, cause="adjustment", usage=TokenUsage(input=1))
            )
            print("ACK record", record.id, record.seq, flush=True)
        elif n % 11 == 5:
            started = await storage.append_record(operation_started(f"r-{tag}", lane=lane))
            finished = await storage.append_record(
                operation_finished(f"f-{tag}", started.id, lane=lane)
            )
            print("ACK record", started.id, started.seq, flush=True)
            print("ACK record", finished.id, finished.seq, flush=True)
        else:
            stored = await storage.append_entry(
                custom_entry(f"e-{tag}", data={"n": n, "pad": "x" * 200}), lane
            )
            print("ACK entry", stored.id, stored.seq, flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
