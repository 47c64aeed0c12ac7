"""Unique keys: at most one pending or running job per (queue, unique_key).

What a job whose key is taken does (`ON_CONFLICT`), and `Unique`, which
inserts keyed jobs and finds the job holding each key that was taken.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pgqctl.errors import BadInput, PgqctlError
from pgqctl.intake.copy_rows import copy_value, has_key, row_columns
from pgqctl.intake.fanout import record_number
from pgqctl.intake.statements import run, statement

if TYPE_CHECKING:
    import psycopg
    from psycopg import sql


# What a job whose unique key is taken does: skip it (the holder's id is
# given back instead) or fail the whole call.
ON_CONFLICT = ("skip", "error")


class DuplicateJob(PgqctlError):
    """A job's unique key is held by a pending or running job (on_conflict="error").

    Nothing the call was given is inserted.
    """

    def __init__(self, queue: str, unique_key: str, holder: int, status: str) -> None:
        self.queue, self.unique_key, self.holder, self.status = queue, unique_key, holder, status
        super().__init__(
            f"job {holder} ({status}) already has unique key {unique_key!r} in queue "
            f"{queue!r}: nothing was enqueued; `--on-conflict skip` gives its id instead"
        )


def check_on_conflict(on_conflict: str) -> None:
    if on_conflict not in ON_CONFLICT:
        raise BadInput(f"on_conflict must be 'skip' or 'error', not {on_conflict!r}")


class Unique:
    """Inserts chunks in which some jobs have a unique key, and finds the
    holder of each key that was taken.

    INSERT ... ON CONFLICT DO NOTHING returns only the rows it inserted:
    sorted by id they are the inserted rows in input order, so walking the
    input alongside tells, for each keyed job, whether it went in. A job that
    did not is held by a job of this load (a key given twice: the first
    wins), or by one already in the queue, which a second statement finds:
    it sees the holder even when it was committed by a concurrent producer
    that the INSERT waited for. Should the holder finish in between (the key
    is free again), those jobs are inserted again.
    """

    def __init__(
        self,
        cur: psycopg.Cursor[Any],
        table: sql.Identifier,
        on_conflict: str,
        where: Callable[[int], str],
    ) -> None:
        self.cur, self.table, self.on_conflict, self.where = cur, table, on_conflict, where
        self.loaded: dict[tuple[str, str], tuple[int, int]] = {}  # key -> (row n, job id)

    def insert_rows(self, rows: list[str]) -> tuple[list[int], list[bool]]:
        """Insert rows (some with keys) from arrays; their ids in order, and
        whether each job was there already."""
        run(self.cur, statement("jobs_insert_arrays_unique", self.table), row_columns(rows))
        return self.resolve(rows, self.cur.fetchall())

    def resolve(
        self, rows: list[str], inserted: list[tuple[int, str, str | None]], tries: int = 5
    ) -> tuple[list[int], list[bool]]:
        """The ids of `rows`, given what their INSERT returned, and whether
        each job was there already."""
        ids, existing, taken = self._walk(rows, sorted(inserted))
        free = self._holders(ids, taken) if taken else []
        if free:
            # Their holders finished since the INSERT: the keys are free, insert these again.
            if tries == 1:
                raise PgqctlError("unique keys kept changing hands while enqueueing: try again")
            retry = [rows[i] for i in free]
            run(self.cur, statement("jobs_insert_arrays_unique", self.table), row_columns(retry))
            again, held = self.resolve(retry, self.cur.fetchall(), tries - 1)
            for i, job_id, was in zip(free, again, held, strict=True):
                ids[i], existing[i] = job_id, was
        return [i for i in ids if i is not None], existing

    def _walk(
        self, rows: list[str], inserted: list[tuple[int, str, str | None]]
    ) -> tuple[list[int | None], list[bool], list[tuple[int, str, str]]]:
        """Each row's id if known yet, whether it was there already, and the
        rows held by a job not of this load: (index, queue, key)."""
        ids: list[int | None] = []
        existing: list[bool] = []
        taken: list[tuple[int, str, str]] = []
        p = 0
        for i, row in enumerate(rows):
            if not has_key(row):
                ids.append(inserted[p][0])
                existing.append(False)
                p += 1
                continue
            fields = row.rstrip("\n").split("\t")
            n = record_number(fields[0])
            queue, key = copy_value(fields[3]), copy_value(fields[-1])
            assert queue is not None and key is not None
            first = self.loaded.get((queue, key))
            if first is None and p < len(inserted) and inserted[p][1:] == (queue, key):
                ids.append(inserted[p][0])
                existing.append(False)
                self.loaded[(queue, key)] = (n, inserted[p][0])
                p += 1
                continue
            existing.append(True)
            if first is None:
                ids.append(None)
                taken.append((i, queue, key))
            elif self.on_conflict == "error":
                raise BadInput(
                    f"{self.where(n)} repeats the unique key {key!r} (queue {queue!r}) "
                    f"of {self.where(first[0])}"
                )
            else:
                ids.append(first[1])
        return ids, existing, taken

    def _holders(self, ids: list[int | None], taken: list[tuple[int, str, str]]) -> list[int]:
        """Fill in the holders' ids; the indexes of the rows whose key no job holds now."""
        run(
            self.cur,
            statement("jobs_unique_holders", self.table),
            {"queue": [t[1] for t in taken], "unique_key": [t[2] for t in taken]},
        )
        holders = {(q, k): (job_id, status) for q, k, job_id, status in self.cur.fetchall()}
        free = []
        for i, queue, key in taken:
            held = holders.get((queue, key))
            if held is None:
                free.append(i)
            elif self.on_conflict == "error":
                raise DuplicateJob(queue, key, held[0], held[1])
            else:
                ids[i] = held[0]
        return free
