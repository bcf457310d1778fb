"""The engine behind `AgentHarness`: private; programs import from `harness_core` only.

Where things live: `lane` (the per-lane runtime: mutation line, commits, effects), `procedures`
(run, steps, the tool batch, compaction and navigation), `gate` (manual drive), `reduction`
(lane state, its transition function and the fold restore uses), `restore` (the bounded reads),
`context` (provider context and compaction planning), `effects` (the `Effects` Protocol),
`lease` (the writer-lease keeper) and `telemetry` (spans).
"""
