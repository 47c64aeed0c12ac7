"""The only place the benchmarks touch pgqctl's internals.

pgqctl's Python API (``enqueue_many``) and the worker's claim-and-complete
functions are reached through here, so a renamed function is a one-line fix.
``missing()`` says which pieces this checkout does not have yet; the harness
skips the workloads that need them and says so.
"""

from __future__ import annotations

import importlib
import os
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

    ``exchange(done)`` is the worker's one round trip (``claims.exchange``):
    report the finished jobs done, fenced, and claim up to ``slots`` due jobs
    under a lease, in one statement, as the worker does when all its slots
    come free.
    """

    LEASE_S = 300.0  # the worker's default lease

    def __init__(self, dsn: str, *, slots: int, schema: str = "public") -> None:
        self.claims = _claims()
        self.slots = slots
        self.worker = f"bench:{os.getpid()}"
        from pgqctl import db

        self.conn = db.connect(dsn, schema=schema)

    def exchange(self, done: list[Any]) -> list[Any]:
        changed = self.claims.exchange(
            self.conn,
            done=[job.held for job in done],
            claim=self.slots,
            lease=self.LEASE_S,
            worker=self.worker,
        )
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
