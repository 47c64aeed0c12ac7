"""The only place the benchmarks touch pgqctl's internals.

pgqctl's Python API (``enqueue_many``) and the worker's claim-and-complete
functions are reached through here, so a renamed function is a one-line fix.
``missing()`` says which pieces this checkout does not have yet; the harness
skips the workloads that need them and says so.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

import psycopg


class Missing(RuntimeError):
    """A pgqctl piece a workload needs is not in this checkout."""


def missing() -> dict[str, str]:
    """Each absent piece, with what to wait for."""
    absent = {}
    try:
        _api()
    except Missing as exc:
        absent["api"] = str(exc)
    try:
        _claims()
    except Missing as exc:
        absent["claims"] = str(exc)
    return absent


def _api() -> Any:
    import pgqctl

    if not hasattr(pgqctl, "enqueue_many"):
        raise Missing("pgqctl.enqueue_many (the Python enqueue API)")
    return pgqctl


def _claims() -> Any:
    try:
        return importlib.import_module("pgqctl.claims")
    except ImportError:
        raise Missing("pgqctl/claims.py (the worker's claim-and-complete functions)") from None


def enqueue_many(conn: psycopg.Connection[Any], jobs: Iterable[Mapping[str, Any]]) -> list[int]:
    ids: list[int] = _api().enqueue_many(conn, jobs)
    return ids


def enqueue(conn: psycopg.Connection[Any], kind: str, payload: Mapping[str, Any]) -> int:
    job_id: int = _api().enqueue(conn, kind, payload)
    return job_id


class WorkerPath:
    """What one worker process does per batch, minus the child processes.

    ``exchange(done)`` is the worker's one round trip (``claims.exchange``) as
    `pgqctl worker --concurrency SLOTS --prefetch PREFETCH` sends it when its
    jobs have all ended: report them done, fenced, and claim up to ``slots``
    + ``prefetch`` due jobs under a lease, the first ``slots`` for its slots,
    the rest for its local queue. It connects as the worker does (its
    transaction-local settings: generic plans, timeouts, no JIT; its libpq
    keepalives) and walks the claim index from its floor as the worker does
    (``claims.Floors``). Attempts are not recorded: the worker with
    ``--no-history``.
    """

    LEASE_S = 300.0  # the worker's default lease

    def __init__(self, dsn: str, *, slots: int, prefetch: int = 0, schema: str = "public") -> None:
        self.claims = _claims()
        from pgqctl import db
        from pgqctl.worker import CONNECTION_PARAMS, SESSION_SETTINGS

        self.slots = list(range(slots))
        self.prefetch = prefetch
        self.worker = f"bench:{os.getpid()}"
        self.floors = self.claims.Floors()
        self.conn = db.connect(dsn, schema=schema, settings=SESSION_SETTINGS, **CONNECTION_PARAMS)

    def exchange(self, done: list[Any]) -> list[Any]:
        sent = time.monotonic()
        changed = self.claims.exchange(
            self.conn,
            done=[job.held for job in done],
            claim=len(self.slots) + self.prefetch,
            slots=self.slots,
            prefetch=self.prefetch,
            lease=self.LEASE_S,
            worker=self.worker,
            floor=self.floors.floor(sent),
        )
        self.floors.claimed(sent, changed.last_claimed)
        if len(changed.done) != len(done):
            raise RuntimeError("a fenced report matched fewer jobs than it reported")
        jobs: list[Any] = changed.claimed
        return jobs

    def __enter__(self) -> WorkerPath:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.conn.close()


def claim_once(conn: psycopg.Connection[Any], slots: int) -> int:
    """One claim of up to `slots` jobs through the worker's exchange; how many it got.

    The history workload runs it in a transaction it rolls back.
    """
    changed = _claims().exchange(conn, claim=slots, lease=WorkerPath.LEASE_S, worker="bench")
    return len(changed.claimed)
