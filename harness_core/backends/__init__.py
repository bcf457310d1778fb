"""The plumbing under every durable thing: one implementation per backend family (D191).

The session store (`harness_core.storage`), the gateway's broker and the web channel's mailbox
keep different data under different contracts; what they share is how a backend family is
reached and used, written once here and imported by all three:

* `io_thread`: one thread per resource for its blocking calls, and the one close/cancel
  discipline (a call cancelled before it started never runs; close waits for the calls in
  flight; calls after close raise the owner's error).
* `sqlite`: the connection policy (WAL, ``synchronous``, busy timeout, page size), the I/O
  thread with its connection, reads on the event loop while the thread is idle or on a
  read-only connection while it works, group commits.
* `redis`: clients from a URL (TLS, Cluster, no automatic retries), the key rule (prefix, hash
  tag), Lua scripts run by sha and loaded again after ``NOSCRIPT``, setup once, close.
* `urls`: one parser per family's URLs, and `Openers`, where each thing registers its opener
  per family.
* `batch`: group commit (`WriteQueue`).

A new family (say Postgres) is one module here; each thing then adds a backend module and one
`Openers.add` line.
"""

__all__ = ["batch", "io_thread", "redis", "sqlite", "urls"]
"""The family modules (imported by name: importing this package imports neither SQLite nor
redis-py)."""
