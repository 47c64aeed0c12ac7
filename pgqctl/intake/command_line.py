"""What ``pgqctl enqueue`` asks for, done in one call: `enqueue_from_options`.

The command parses its options into a `Request` and hands the `Enqueued`
that comes back to output; everything between (reading the policy, checking
the fields, fanning out, reading a file, inserting) is here, in the order
that keeps a bad input from touching the database.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

from pgqctl.intake.fanout import check_kinds, fan_out
from pgqctl.intake.fields import (
    NewJob,
    check_defaults,
    check_kind,
    check_policy,
    make_job,
    parse_payload,
)
from pgqctl.intake.loading import Ids, insert_jobs, load

if TYPE_CHECKING:
    import psycopg

    from pgqctl.policy import Policy


class Input(NamedTuple):
    """An open JSON-lines input, as the command line named it."""

    lines: Iterable[bytes]
    source: str  # how errors name it: a path, or "stdin"
    # Read it all before the transaction (a pipe, which may pause for as
    # long as its writer likes), or stream it (a regular file).
    read_first: bool
    on_progress: Callable[[int], None] | None = None


@dataclass(frozen=True)
class Request:
    """One ``pgqctl enqueue``: a job of `kind`, one job per kind of `kinds`,
    or, with `open_input`, one job per line of a file.

    `fields` holds the job's queue, priority, run_at, delay, max_attempts
    and limit_key; for a file, only those given on the command line, which
    fill what a line leaves out. `open_input` opens the file when its turn
    comes, after the options are checked.
    """

    kind: str | None = None
    payload: str | None = None  # JSON text, as typed
    kinds: Sequence[str] = ()
    fields: Mapping[str, Any] = field(default_factory=dict)
    unique_key: str | None = None
    on_conflict: str = "skip"
    policy_file: str | None = None
    max_payload_bytes: int = 0
    open_input: Callable[[], AbstractContextManager[Input]] | None = None


class Enqueued(NamedTuple):
    """The ids of the jobs (`ids.existing`: those whose unique key a job
    held, its id given instead), and the jobs given on the command line
    (none for a file)."""

    ids: Ids
    jobs: list[NewJob]


def enqueue_from_options(
    request: Request, connect: Callable[[], psycopg.Connection[Any]]
) -> Enqueued:
    """Check and insert what `request` asks for, all or nothing; `connect`
    is called once the input is known to hold a valid job (never for a bad
    one, nor for an empty file)."""
    policy = read_policy_file(request.policy_file)
    if request.open_input is not None:
        check_defaults(request.fields)
        with request.open_input() as source:
            ids = load(
                source.lines,
                connect,
                source=source.source,
                defaults=request.fields,
                on_progress=source.on_progress,
                read_first=source.read_first,
                on_conflict=request.on_conflict,
                policy=policy,
                max_payload_bytes=request.max_payload_bytes,
            )
        return Enqueued(ids, [])
    value, jobs = _jobs_of(request)
    if policy is not None:
        for job in jobs:
            check_policy(job.kind, value, policy)
    with connect() as conn:
        return Enqueued(insert_jobs(conn, jobs, on_conflict=request.on_conflict), jobs)


def _jobs_of(request: Request) -> tuple[dict[str, Any] | None, list[NewJob]]:
    """The payload, and the job of KIND or one per --kind, checked."""
    value = parse_payload(request.payload) if request.payload is not None else None
    names = check_kinds(request.kinds, check_kind, "--kind") if request.kinds else None
    job = make_job(
        request.kind if names is None else names[0],
        value,
        unique_key=request.unique_key,
        max_payload_bytes=request.max_payload_bytes,
        **request.fields,
    )
    return value, [job] if names is None else fan_out(job, names)


def read_policy_file(path: str | None) -> Policy | None:
    """The policy --policy names (None: no policy), read before anything is
    checked or written."""
    if path is None:
        return None
    from pgqctl.policy import read_policy

    return read_policy(path)
