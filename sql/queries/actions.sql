-- The SQL of pgqctl/actions.py: named blocks, loaded by pgqctl/sql.py with every
-- other file of sql/queries/. Every value is a psycopg placeholder.

-- name: action_record
-- An action done (or the first batch of one), in the transaction that did
-- it. One row: its id.
INSERT INTO actions (actor, action, target, jobs, finished)
VALUES (%(actor)s, %(action)s, %(target)s::jsonb, %(jobs)s, %(finished)s)
RETURNING id;

-- name: action_add
-- A further batch of a bulk action, in that batch's transaction. No rows.
UPDATE actions SET jobs = jobs + %(jobs)s, finished = %(finished)s WHERE id = %(id)s;

-- name: action_list
-- The actions within `since` (NULL: all), newest first, at most `limit`.
SELECT id, at, actor, action, target, jobs, finished
FROM actions
WHERE %(since)s::interval IS NULL OR at >= now() - %(since)s::interval
ORDER BY at DESC, id DESC
LIMIT %(limit)s;

-- name: action_rights
-- Whether this connection may act on the queue: not a standby, and the
-- role may change jobs, pauses and actions. One row.
SELECT pg_is_in_recovery() AS standby,
       current_user AS role,
       -- Each privilege on its own: a list asks whether any one is held.
       has_table_privilege('jobs', 'UPDATE') AS jobs,
       has_table_privilege('paused_queues', 'INSERT') AND has_table_privilege('paused_queues', 'UPDATE')
           AND has_table_privilege('paused_queues', 'DELETE') AS pauses,
       has_table_privilege('actions', 'INSERT') AND has_table_privilege('actions', 'UPDATE')
           AS actions;
