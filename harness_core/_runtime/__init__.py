"""The engine behind `AgentHarness`: private; programs import from `harness_core` only.

Where things live: `lane` (the per-lane runtime: mutation line, commits, the production
`Effects`), `lane_context` (a lane's reads and their caches), `lane_effects` (the bodies of its
model, tool, hook and sleep effects), `lane_jobs` (the surface's jobs on a lane), `procedures`
(run, steps, the tool batch, compaction and navigation), `gate` (manual drive), `reduction`
(lane state, its transition function and the fold restore uses), `restore` (the bounded reads),
`context` (provider context and compaction planning), `effects` (the `Effects` Protocol),
`lease` (the writer-lease keeper) and `telemetry` (spans).
"""
