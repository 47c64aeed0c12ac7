"""Enqueueing jobs: what ``pgqctl.enqueue`` and ``pgqctl enqueue`` share.

One purpose per module:

- `api`: ``pgqctl.enqueue`` and ``pgqctl.enqueue_many``, thin, over the parts below;
- `command_line`: what ``pgqctl enqueue`` asks for, in one call (one job,
  one per kind, or a JSON-lines file);
- `fields`: one job's fields, checked and normalised (`make_job`);
- `lines`: JSON lines read into COPY rows, by quick inline checks for the
  common shape of job and by `fields` for any other (tests compare the two);
- `copy_rows`: the COPY text row of a job, and back;
- `loading`: inserting rows, through COPY or from arrays, in the caller's
  transaction;
- `direct_copy`: the COPY straight into jobs that a load keeps open across
  chunks, and the ids drawn for it;
- `unique`: unique keys: conflicts, and the jobs that hold them;
- `statements`: every statement on the caller's connection, never prepared;
- `fanout`: one payload, one job per kind.

Whatever the connection (direct, or through a session or transaction
pooler), nothing sent leans on it: no statement is prepared, no setting is
changed, and the staging table of a bulk load goes with the transaction.
psycopg and threads are imported only when jobs are inserted, so
``import pgqctl`` stays cheap. Bad input raises ``BadInput`` (a
``ValueError``) before anything is sent to the database.
"""
