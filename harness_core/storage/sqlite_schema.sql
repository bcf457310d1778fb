-- The SQLite session store. One database holds many sessions; every table is keyed by session.
-- Applied on open; `schema_version` guards against opening a database of another layout.
-- A `checksum` column (schema 3) is NULL on rows written before it: those are validated in full.
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);

CREATE TABLE IF NOT EXISTS sessions (
    session_id        TEXT PRIMARY KEY,
    created_at        INTEGER NOT NULL,
    parent_session_id TEXT,
    metadata          TEXT NOT NULL,
    name              TEXT,                      -- projection: newest name fact
    last_seq          INTEGER NOT NULL DEFAULT 0, -- the seq allocator
    fence             INTEGER NOT NULL DEFAULT 0, -- last writer token handed out
    n_entries         INTEGER NOT NULL DEFAULT 0,
    n_messages        INTEGER NOT NULL DEFAULT 0,
    n_records         INTEGER NOT NULL DEFAULT 0,
    u_input           INTEGER NOT NULL DEFAULT 0,
    u_output          INTEGER NOT NULL DEFAULT 0,
    u_cache_read      INTEGER NOT NULL DEFAULT 0,
    u_cache_write     INTEGER NOT NULL DEFAULT 0,
    u_total_tokens    INTEGER NOT NULL DEFAULT 0,
    c_input           REAL NOT NULL DEFAULT 0,
    c_output          REAL NOT NULL DEFAULT 0,
    c_cache_read      REAL NOT NULL DEFAULT 0,
    c_cache_write     REAL NOT NULL DEFAULT 0,
    c_total           REAL NOT NULL DEFAULT 0
);

-- Entries and records are rowid tables: their rows carry kilobytes of payload, which a
-- WITHOUT ROWID b-tree would split across pages on every insert (measured: twice the cost).
CREATE TABLE IF NOT EXISTS entries (
    session_id  TEXT NOT NULL,
    id          TEXT NOT NULL,
    seq         INTEGER NOT NULL,
    timestamp   INTEGER NOT NULL,
    lane        TEXT,
    parent_id   TEXT,
    type        TEXT NOT NULL,
    custom_type TEXT,
    payload     TEXT NOT NULL,
    checksum    INTEGER         -- CRC32C of the payload and the row's own columns (schema 3)
);
CREATE UNIQUE INDEX IF NOT EXISTS entries_by_id ON entries (session_id, id);
CREATE UNIQUE INDEX IF NOT EXISTS entries_by_seq ON entries (session_id, seq);
CREATE INDEX IF NOT EXISTS entries_by_custom_type ON entries (session_id, custom_type, seq)
    WHERE custom_type IS NOT NULL;

CREATE TABLE IF NOT EXISTS records (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    id         TEXT NOT NULL,
    lane       TEXT NOT NULL,
    run_id     TEXT,            -- an operation start's own id; other records' run_id
    type       TEXT NOT NULL,
    op_kind    TEXT,            -- operation starts only
    timestamp  INTEGER NOT NULL,
    payload    TEXT NOT NULL,
    checksum   INTEGER          -- CRC32C of the payload, seq and timestamp (schema 3)
);
CREATE UNIQUE INDEX IF NOT EXISTS records_by_seq ON records (session_id, seq);
CREATE UNIQUE INDEX IF NOT EXISTS records_by_id ON records (session_id, id);
CREATE INDEX IF NOT EXISTS records_by_lane ON records (session_id, lane, seq);
-- A type (or an operation kind) filter is an equality on the column right before seq, so a
-- lane's records of one type are one range in seq order: "the newest operation_finished" and
-- "queue records since seq N" are seeks, whatever else the lane holds (schema version 2; version
-- 1 had op_kind between type and seq, which made type-only filters scan the lane row by row).
CREATE INDEX IF NOT EXISTS lane_records_of_type ON records (session_id, lane, type, seq);
CREATE INDEX IF NOT EXISTS lane_records_of_kind ON records (session_id, lane, op_kind, seq)
    WHERE op_kind IS NOT NULL;
CREATE INDEX IF NOT EXISTS records_of_type ON records (session_id, type, seq);
CREATE INDEX IF NOT EXISTS records_of_kind ON records (session_id, op_kind, seq)
    WHERE op_kind IS NOT NULL;
CREATE INDEX IF NOT EXISTS records_by_run ON records (session_id, run_id, seq);

-- Running usage sums per lane and per entry id (the sum of the usage records bound to it),
-- maintained at every usage write in seq order like the session's sums in `sessions`.
CREATE TABLE IF NOT EXISTS usage_sums (
    session_id     TEXT NOT NULL,
    scope          TEXT NOT NULL,  -- 'lane' or 'entry'
    key            TEXT NOT NULL,  -- the lane name or the entry id
    u_input        INTEGER NOT NULL,
    u_output       INTEGER NOT NULL,
    u_cache_read   INTEGER NOT NULL,
    u_cache_write  INTEGER NOT NULL,
    u_total_tokens INTEGER NOT NULL,
    c_input        REAL NOT NULL,
    c_output       REAL NOT NULL,
    c_cache_read   REAL NOT NULL,
    c_cache_write  REAL NOT NULL,
    c_total        REAL NOT NULL,
    PRIMARY KEY (session_id, scope, key)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS lanes (
    session_id TEXT NOT NULL,
    lane       TEXT NOT NULL,
    leaf_id    TEXT,
    PRIMARY KEY (session_id, lane)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS open_operations (
    session_id TEXT NOT NULL,
    lane       TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    run_id     TEXT NOT NULL,
    PRIMARY KEY (session_id, lane, seq)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS lane_moves (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    timestamp  INTEGER NOT NULL,
    lane       TEXT NOT NULL,
    leaf_id    TEXT,
    created    INTEGER NOT NULL,
    checksum   INTEGER,         -- CRC32C of the row's columns (schema 3)
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS facts (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    timestamp  INTEGER NOT NULL,
    payload    TEXT NOT NULL,
    checksum   INTEGER,         -- CRC32C of the payload, seq and timestamp (schema 3)
    PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS labels (
    session_id TEXT NOT NULL,
    target_id  TEXT NOT NULL,
    label      TEXT NOT NULL,
    PRIMARY KEY (session_id, target_id)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS writer_leases (
    session_id    TEXT PRIMARY KEY,
    owner         TEXT NOT NULL,
    token         INTEGER NOT NULL,
    ttl_ms        INTEGER NOT NULL,
    expires_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
