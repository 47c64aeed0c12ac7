"""`pgqctl worker`: claim jobs, run each as a child process, report how it ended.

`serve` connects and hands the connection to the loop (loop.py), which owns
it; config.py says what the options mean. The loop's docstring tells how
the parts fit: who owns what, and which thread does what.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable

from pgqctl import db, hardening
from pgqctl.blockers import find_blocker
from pgqctl.config import describe
from pgqctl.worker.config import (
    APPLICATION_NAME_BYTES,
    BACKOFF_CAP,
    CONNECTION_PARAMS,
    SESSION_SETTINGS,
    TERM_GRACE,
    TIMEOUTS,
    WorkerConfig,
    application_name,
    backoff_delay,
    identity,
    make_room_for,
)
from pgqctl.worker.loop import Worker
from pgqctl.worklog import WorkLog

__all__ = [
    "APPLICATION_NAME_BYTES",
    "BACKOFF_CAP",
    "CONNECTION_PARAMS",
    "SESSION_SETTINGS",
    "TERM_GRACE",
    "TIMEOUTS",
    "Worker",
    "WorkerConfig",
    "application_name",
    "backoff_delay",
    "identity",
    "make_room_for",
    "serve",
]


def serve(config: WorkerConfig, target: Callable[[], str], log: WorkLog) -> int:
    """Connect to the DSN `target()` gives, check the schema, and work until
    told to stop; the exit code.

    Raises BadInput for a --concurrency the open-file limit cannot serve
    (before anything else), and DatabaseUnavailable or NotMigrated when it
    cannot start.
    """
    if not hardening.make_undumpable() and sys.platform.startswith("linux"):
        log.event(
            "jobs_can_read_worker",
            "cannot close this worker's environment and memory to its jobs (prctl "
            "PR_SET_DUMPABLE refused): jobs running as this user may read its database "
            "password; run them as another user (see docs/operating.md, Jobs and the database "
            "password)",
        )
    make_room_for(config.concurrency)
    dsn = target()
    # pg_stat_activity tells each worker's connections from the others'.
    name = application_name(identity())
    # psycopg logs a lost connection inside a pipeline with Python's last-resort
    # handler (a bare stderr line); the worker logs that event itself.
    logging.getLogger("psycopg").addHandler(logging.NullHandler())

    def connect() -> db.QueueConnection:
        return db.open_queue(
            dsn,
            schema=config.schema,
            writes=True,
            migrated=False,
            application_name=name,
            settings={**SESSION_SETTINGS, **config.timeouts.settings()},
            **CONNECTION_PARAMS,
        )

    listen_dsn = config.listen_dsn or dsn

    def listen_connect() -> db.QueueConnection:
        return db.connect(
            listen_dsn,
            schema=config.schema,
            application_name=name,
            **CONNECTION_PARAMS,
        )

    conn = connect()
    try:
        db.require_migrated(conn)
    except BaseException:
        conn.close()
        raise
    worker = Worker(
        config,
        connect,
        log,
        listen_connect=listen_connect,
        describe_target=describe(dsn),
        describe_listen_target=describe(listen_dsn),
        find_blocker=functools.partial(find_blocker, dsn, schema=config.schema),
    )
    try:
        worker.check(conn)
    except BaseException:
        conn.close()
        raise
    return worker.run(conn)
