"""Inserting checked jobs in the caller's transaction: a few from arrays in
one INSERT, more in chunks through COPY (straight into jobs, or through a
staging table, or from arrays for a role without the TEMP privilege: see
`insert_rows`), and `load`, a JSON-lines input read and inserted in one
transaction."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from pgqctl.errors import BadInput
from pgqctl.intake.copy_rows import (
    all_due_now,
    all_keyless,
    has_limit_keys,
    job_row,
    row_columns,
    with_limit_key_column,
)
from pgqctl.intake.fields import NewJob
from pgqctl.intake.lines import read_rows
from pgqctl.intake.statements import cursor, jobs_table, run, statement
from pgqctl.intake.unique import Unique, check_on_conflict
from pgqctl.limits import MAX_PAYLOAD_BYTES
from pgqctl.sql import query

if TYPE_CHECKING:
    from concurrent.futures import Future

    import psycopg
    from psycopg import sql

    from pgqctl.intake.direct_copy import DirectCopy
    from pgqctl.policy import Policy


# Below this many jobs, one INSERT from arrays; from it on, chunks through
# COPY, whose few round trips of setup pay off only in bulk.
COPY_MIN_JOBS = 200
CHUNK_JOBS = 10_000
CHUNKS_AHEAD = 2
FIRST_CHUNK_JOBS = 500
# A bulk load read before its transaction keeps this much in memory, the
# rest in a temporary file.
SPOOL_MEMORY = 16 * 1024 * 1024


class Ids(list[int]):
    """The ids of the jobs given, in order. `existing` holds the positions
    (from 0) of the jobs that were not inserted because a pending or running
    job held their unique key: that job's id stands in their place."""

    def __init__(self, ids: Iterable[int] = ()) -> None:
        super().__init__(ids)
        self.existing: set[int] = set()

    def add(self, ids: Sequence[int], existing: Sequence[bool] = ()) -> None:
        """Append the ids of more jobs, with whether each was there already
        (none, when `existing` is empty)."""
        if existing:
            self.existing.update(len(self) + i for i, held in enumerate(existing) if held)
        self.extend(ids)


def _index_name(number: int) -> str:
    return f"jobs[{number - 1}]"


def load(
    lines: Iterable[bytes],
    connect: Callable[[], psycopg.Connection[Any]],
    *,
    source: str = "input",
    defaults: Mapping[str, Any] | None = None,
    on_progress: Callable[[int], None] | None = None,
    read_first: bool = True,
    on_conflict: str = "skip",
    policy: Policy | None = None,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> Ids:
    """Check every job of a JSON-lines input and insert them all in one
    transaction; their ids in input order. An input with no job never
    connects; a bad line raises BadInput and nothing is inserted. Unique
    keys are handled as `enqueue_many` says (the first line with a key wins).

    `read_first`: read and check the whole input before the transaction
    starts, keeping the rows in a file once they outgrow SPOOL_MEMORY, so that
    a slow producer never holds a transaction open (a server's
    idle_in_transaction_session_timeout would end it). Without it, for a
    regular file that is read as fast as the disk goes, rows stream to the
    server as they are checked, and a bad one aborts the transaction.

    `policy`: also refuse a job a worker under it would refuse.
    """
    try:
        with _gc_skips_older_objects():
            rows = read_rows(
                lines,
                source=source,
                defaults=defaults,
                policy=policy,
                max_payload_bytes=max_payload_bytes,
            )
            spooled = _ReadFirst(rows) if read_first else None
            if spooled is not None:
                rows = spooled
            # The first job is read before connecting, so an empty or plainly
            # wrong input never touches the database.
            first = next(rows, None)
            if first is None:
                return Ids()
            with connect() as conn:
                return insert_rows(
                    conn,
                    itertools.chain([first], rows),
                    on_progress=on_progress,
                    on_conflict=on_conflict,
                    where=lambda n: f"{source}, line {n}",
                    expected=None if spooled is None else spooled.count,
                )
    except BadInput as exc:
        raise BadInput(f"{exc}; nothing was enqueued") from None


class _ReadFirst(Iterator[str]):
    """Every row, all read (at the first `next`) before the first is given
    back; `count` is how many there are from then on."""

    def __init__(self, rows: Iterator[str]) -> None:
        self.count: int | None = None
        self._rows = self._read(rows)

    def __next__(self) -> str:
        return next(self._rows)

    def _read(self, rows: Iterator[str]) -> Iterator[str]:
        import tempfile  # here: `import pgqctl` need not load it

        with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY, mode="w+", encoding="utf-8") as f:
            counted = itertools.count()
            # One row a line: COPY's text format escapes the line ends within a value.
            f.writelines(row for row, _ in zip(rows, counted, strict=False))  # counted: endless
            self.count = next(counted)
            f.seek(0)
            yield from f


@contextmanager
def _gc_skips_older_objects() -> Iterator[None]:
    """Keep the garbage collector's full passes off the objects that exist already.

    A bulk load makes short-lived objects by the hundred thousand, which
    triggers full passes; each would walk every module, class and function
    imported at startup again.
    """
    import gc

    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def insert_jobs(
    conn: psycopg.Connection[Any],
    jobs: Iterable[NewJob],
    *,
    schema: str | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_conflict: str = "skip",
    where: Callable[[int], str] = _index_name,
    numbers: Iterable[int | str] | None = None,
) -> Ids:
    """Insert jobs in the connection's transaction; return their ids in order.

    A list of fewer than COPY_MIN_JOBS goes in one INSERT from arrays. Other
    jobs go through `insert_rows`, so ``jobs`` may be a lazy iterator that
    validates as it goes. Unique keys: see `enqueue_many`. ``numbers``: the
    rows' numbers (`fanout.row_number`), which errors give to `where`;
    default 1, 2, 3...
    """
    check_on_conflict(on_conflict)
    numbered: Iterable[tuple[int | str, NewJob]] = (
        enumerate(jobs, start=1) if numbers is None else zip(numbers, jobs, strict=True)
    )
    if isinstance(jobs, Sequence) and len(jobs) < COPY_MIN_JOBS:
        if not jobs:
            return Ids()
        with _own_transaction(conn, on_conflict):
            table = jobs_table(schema)
            if all(j.unique_key is None for j in jobs):
                return Ids(_insert_from_arrays(conn, jobs, table))
            with cursor(conn) as cur:
                unique = Unique(cur, table, on_conflict, where)
                ids = Ids()
                ids.add(*unique.insert_rows(list(itertools.starmap(job_row, numbered))))
                return ids
    rows = itertools.starmap(job_row, numbered)
    return insert_rows(
        conn,
        rows,
        schema=schema,
        on_progress=on_progress,
        on_conflict=on_conflict,
        where=where,
        expected=len(jobs) if isinstance(jobs, Sequence) else None,
    )


def insert_rows(
    conn: psycopg.Connection[Any],
    rows: Iterable[str],
    *,
    schema: str | None = None,
    on_progress: Callable[[int], None] | None = None,
    on_conflict: str = "skip",
    where: Callable[[int], str] = _index_name,
    expected: int | None = None,
) -> Ids:
    """Insert jobs given as COPY rows (`read_rows`, `job_row`); return their ids in order.

    Rows stream to the server in chunks, so ``rows`` may be a lazy iterator
    that validates as it goes: an exception it raises aborts the transaction.
    ``on_progress`` gets the number of jobs sent so far, now and then.

    Never commits an open transaction; in autocommit mode it wraps its
    statements in a transaction of its own (and, under on_conflict="error",
    in a savepoint inside the caller's, so that a conflict leaves none of
    these jobs behind). Workers get one notification however many jobs and
    statements: the table's statement trigger sends the same one each time,
    and PostgreSQL delivers a transaction's duplicates once.

    Each chunk takes the quickest way open to it (`_Loader`): COPY straight
    into jobs, with ids drawn first, for a role that may draw from the id
    sequence and a chunk whose jobs have no unique key and are due at once
    (`DirectCopy`: one COPY across such chunks, its ids drawn in blocks of
    about ``expected`` ids, the number of rows when the caller knows it);
    else COPY into a temporary table and INSERT ... SELECT; else, for a role
    without the TEMP privilege, an INSERT from arrays. All give the same rows.
    """
    from pgqctl.intake.direct_copy import DirectCopy  # here: only bulk loads need it

    check_on_conflict(on_conflict)
    table = jobs_table(schema)
    with _own_transaction(conn, on_conflict), cursor(conn) as cur:
        run(cur, query("jobs_load_privileges"), {"table": table.as_string(conn)})
        may_stage, sequence, timeout = cur.fetchone() or (False, None, 0.0)
        direct = None if sequence is None else DirectCopy(cur, table, sequence, expected, timeout)
        loader = _Loader(cur, table, Unique(cur, table, on_conflict, where), may_stage, direct)
        return _load_chunks(rows, loader, on_progress)


@contextmanager
def _own_transaction(conn: psycopg.Connection[Any], on_conflict: str) -> Iterator[None]:
    """A transaction in autocommit mode; under on_conflict="error" a savepoint
    in the caller's, so that a conflict leaves none of this call's jobs
    there; else the caller's transaction as it is."""
    if conn.autocommit:
        with conn.transaction():
            yield
    elif on_conflict == "error":
        # On an idle connection a transaction() block would begin a
        # transaction and commit it at its end: the caller's to commit.
        # Any statement begins it (psycopg's implicit BEGIN), then the block
        # is a savepoint.
        if conn.info.transaction_status == _IDLE:
            with cursor(conn) as cur:
                run(cur, query("transaction_open"))
        with conn.transaction():
            yield
    else:
        yield


_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE, without importing psycopg here


def _insert_from_arrays(
    conn: psycopg.Connection[Any], jobs: Sequence[NewJob], table: sql.Identifier
) -> list[int]:
    columns = dict(zip(NewJob._fields, map(list, zip(*jobs, strict=True)), strict=True))
    with cursor(conn) as cur:
        run(cur, statement("jobs_insert_arrays", table), columns)
        return [row[0] for row in cur.fetchall()]


def _load_chunks(
    rows: Iterable[str], loader: _Loader, on_progress: Callable[[int], None] | None
) -> Ids:
    # A thread loads the chunks while this one reads and validates the next
    # ones, up to CHUNKS_AHEAD of them, so that the client's and the
    # server's work overlap (psycopg releases the GIL while it waits) and
    # neither waits on the other for a chunk that was slower than the rest.
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    ids = Ids()
    loading: deque[Future[tuple[Sequence[int], list[bool]]]] = deque()
    with ThreadPoolExecutor(1) as thread:
        try:
            sent = 0
            for chunk in _chunks(rows, CHUNK_JOBS):
                if len(loading) == CHUNKS_AHEAD:
                    ids.add(*loading.popleft().result())
                loading.append(thread.submit(loader.load, chunk))
                sent += len(chunk)
                if on_progress is not None:
                    on_progress(sent)
            while loading:
                ids.add(*loading.popleft().result())
            thread.submit(loader.end).result()
        except BaseException as exc:
            # A bad row, or a failed chunk: the load stops here, the chunks
            # not started yet never go, and a COPY still open is aborted
            # (after the chunk under way, in the loader's thread): whatever
            # happens meanwhile, as the open COPY holds the connection.
            try:
                for future in loading:
                    future.cancel()
            finally:
                thread.submit(loader.end, exc).result()
            raise
    return ids


class _Loader:
    """Loads one chunk of COPY rows the quickest way open to it (see insert_rows)."""

    def __init__(
        self,
        cur: psycopg.Cursor[Any],
        table: sql.Identifier,
        unique: Unique,
        may_stage: bool,
        direct: DirectCopy | None,
    ) -> None:
        self.cur, self.table, self.unique = cur, table, unique
        self.may_stage, self.direct = may_stage, direct
        self.staging = False  # whether the staging table is there yet

    def load(self, rows: list[str]) -> tuple[Sequence[int], list[bool]]:
        """The chunk's ids in order, and whether each job was there already."""
        text = "".join(rows)
        limited = has_limit_keys(text, len(rows))
        if limited:
            rows = with_limit_key_column(rows)
        keyless = all_keyless(text, len(rows))
        if self.direct is not None and keyless and all_due_now(text, len(rows)):
            return self.direct.write(rows, limited), []
        if self.direct is not None:
            self.direct.skip()  # the statements below need the connection
        if self.may_stage:
            return self._copy_staged(rows, limited, keyless)
        return self._from_arrays(rows, keyless)

    def end(self, exc: BaseException | None = None) -> None:
        """End the load's open COPY, if any; with `exc`, abort it."""
        if self.direct is not None:
            self.direct.end(exc)

    def _copy_staged(
        self, rows: list[str], limited: bool, keyless: bool
    ) -> tuple[list[int], list[bool]]:
        """COPY into the staging table, then INSERT ... SELECT ... RETURNING id
        (COPY has none)."""
        cur = self.cur
        if not self.staging:
            run(cur, query("jobs_load_create"))
            self.staging = True
        # Emptied first: the table may hold the rows of an earlier chunk, or of
        # an earlier load in the same transaction that stopped half way.
        run(cur, query("jobs_load_truncate"))
        # Only a chunk with limit keys copies the column; in the others the
        # staged column stays NULL.
        copied = "jobs_load_copy_limited" if limited else "jobs_load_copy"
        with cur.copy(query(copied)) as copy:
            copy.write("".join(rows))
        if keyless:
            run(cur, statement("jobs_insert_loaded", self.table))
            return [row[0] for row in cur.fetchall()], []
        run(cur, statement("jobs_insert_loaded_unique", self.table))
        return self.unique.resolve(rows, cur.fetchall())

    def _from_arrays(self, rows: list[str], keyless: bool) -> tuple[list[int], list[bool]]:
        """The rows inserted from arrays, in one statement: no temporary table."""
        if not keyless:
            return self.unique.insert_rows(rows)
        run(self.cur, statement("jobs_insert_arrays", self.table), row_columns(rows))
        # Ids are drawn in the order of the rows; RETURNING's order is not promised.
        return sorted(row[0] for row in self.cur.fetchall()), []


def _chunks(rows: Iterable[str], size: int) -> Iterator[list[str]]:
    # Small at first, so that the server starts on the first rows while the
    # client reads the next ones, then growing to `size`.
    it = iter(rows)
    length = min(size, FIRST_CHUNK_JOBS)
    while chunk := list(itertools.islice(it, length)):
        yield chunk
        length = min(size, length * 4)
