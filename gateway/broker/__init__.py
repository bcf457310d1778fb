"""The broker: the inbox, the outbox, per-thread state and the audit trail (see `contract`)."""
