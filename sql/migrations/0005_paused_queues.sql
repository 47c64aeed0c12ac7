-- compatibility: additive
-- Paused queues: workers claim nothing from a queue listed here until its
-- pause ends (`until`, NULL: until `pgqctl resume`). Kept in the database so
-- a pause holds across worker restarts, for workers started later, and for
-- a queue that has no jobs yet.
--
-- A pause that ends by itself needs nobody to remove its row: the claims
-- read paused_queues_now, which compares `until` with the transaction's
-- now(). The table stays tiny (one row per paused queue), so the claim's
-- one read of it per statement costs nothing measurable.

-- step: transaction
CREATE TABLE paused_queues (
    queue     text PRIMARY KEY,
    reason    text,
    paused_at timestamptz NOT NULL DEFAULT now(),
    until     timestamptz
);

-- The queues paused at this moment: what the claims and next_due skip.
CREATE VIEW paused_queues_now AS
    SELECT queue, reason, paused_at, until
    FROM paused_queues
    WHERE until IS NULL OR until > now();
