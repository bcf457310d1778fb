"""harness_core: the durable agent runtime (session store first; the harness runtime follows)."""
