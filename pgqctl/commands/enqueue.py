"""`pgqctl enqueue`: one job, or a JSON-lines file of them (library:
pgqctl/intake/, which this calls once: `enqueue_from_options`)."""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import os
import stat
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from pgqctl.commands.options import (
    DURATION,
    Database,
    OnceOption,
    Timestamp,
    command,
    database_options,
    format_options,
    max_payload_bytes_option,
    say,
)
from pgqctl.formats import HUMAN_FORMATS
from pgqctl.intake.command_line import Input, Request, enqueue_from_options
from pgqctl.intake.unique import ON_CONFLICT
from pgqctl.output.formats import emit_new_ids
from pgqctl.output.progress import file_progress
from pgqctl.text import id_span, plural

if TYPE_CHECKING:
    from pgqctl.intake.loading import Ids


def _one_queue(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """A PGQCTL_QUEUE naming several queues is a worker's: a job would go to
    a queue called "emails reports" that no worker reads."""
    from_env = param.name and ctx.get_parameter_source(param.name) is ParameterSource.ENVIRONMENT
    names = value.split()
    if not from_env or not names:
        return value
    if len(names) > 1:
        raise click.BadParameter(
            f"{value!r} names several queues, as a worker's list does; "
            "a job goes to one queue: pass --queue",
            ctx,
            param,
        )
    return names[0]  # "mail " is the queue a worker reads as mail


# The options of a job's fields, shared with `schedule add` (whose jobs
# have the same fields).
queue_option = click.option(
    "--queue",
    cls=OnceOption,
    default="default",
    show_default=True,
    callback=_one_queue,
    help="Queue to put the job in.",
)
priority_option = click.option(
    "--priority",
    cls=OnceOption,
    type=int,
    default=0,
    show_default=True,
    help="Higher runs first.",
)
max_attempts_option = click.option(
    "--max-attempts",
    cls=OnceOption,
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Attempts before the job fails for good.",
)

policy_option = click.option(
    "--policy",
    "policy_file",
    cls=OnceOption,
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Refuse (exit 2, nothing written) a job that workers with this policy file "
    "would refuse, e.g. --policy /etc/pgqctl/policy.toml.",
)


@command("enqueue")
@database_options
@click.argument("kind", required=False)
@click.argument("payload", required=False)
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    metavar="KIND",
    allow_from_autoenv=False,  # PGQCTL_KIND is the kinds a worker claims
    help="Instead of KIND: one job per --kind (repeatable), all with the same PAYLOAD.",
)
@queue_option
@priority_option
@click.option(
    "--delay",
    cls=OnceOption,
    type=DURATION,
    help="Due after this long: a number with a unit (ms, s, m, h, d, w), "
    "e.g. 30s, 5m, 1h30m, or seconds.",
)
@click.option(
    "--run-at",
    cls=OnceOption,
    type=Timestamp(),
    help="Due at this ISO 8601 time (without offset: local time).",
)
@max_attempts_option
@click.option(
    "--unique-key",
    cls=OnceOption,
    metavar="KEY",
    allow_from_autoenv=False,  # one key in the environment would make every job the same one
    help="At most one pending or running job per queue with this key (with --kind: per "
    'kind; with --file: "unique_key" in a line).',
)
@click.option(
    "--on-conflict",
    cls=OnceOption,
    type=click.Choice(ON_CONFLICT),
    default="skip",
    show_default=True,
    help="When the key is taken: skip (print the holder's id) or error (exit 1, nothing enqueued).",
)
@click.option(
    "--limit-key",
    cls=OnceOption,
    metavar="KEY",
    help="Key of per-key limits (`pgqctl limit set --per-key`): at most that many jobs of one "
    "key run at once.",
)
@click.option(
    "--file",
    "path",
    cls=OnceOption,
    type=click.Path(exists=True, dir_okay=False, allow_dash=True),
    allow_from_autoenv=False,  # a PGQCTL_FILE in the environment would hijack every enqueue
    help="Bulk-load JSON lines from this file (- for stdin).",
)
@policy_option
@max_payload_bytes_option("Refuse, with exit 2 and nothing written,")
@format_options
def enqueue_command(
    database: Database,
    kind: str | None,
    payload: str | None,
    kinds: tuple[str, ...],
    queue: str,
    priority: int,
    delay: float | None,
    run_at: dt.datetime | None,
    max_attempts: int,
    unique_key: str | None,
    on_conflict: str,
    limit_key: str | None,
    path: str | None,
    policy_file: str | None,
    max_payload_bytes: int,
    fmt: str,
) -> None:
    """Add a job (KIND, with a JSON object PAYLOAD, default {}) and print its id.

    With --kind instead of KIND, add one job per --kind for the same PAYLOAD
    (one event, many consumers) and print their ids in that order: all of
    them or none, and from then on each is claimed, retried and failed on
    its own.

    With --file, add one job per line of a JSON-lines file instead, each an
    object with "kind" (or "kinds", a list: one job per kind) and optionally
    "payload", "queue", "priority", "run_at", "delay", "max_attempts",
    "unique_key", "limit_key"; the options above fill what a line leaves
    out. The whole file goes in one transaction: one bad line and nothing is
    added.

    A payload is at most 1 MiB as JSON (--max-payload-bytes raises it); a
    queue or kind at most 128 characters of printable text (no control or
    format character, no separator but a space), a unique or limit key 256
    characters with no control character (tabs and line ends included).

    A unique key allows one pending or running job per queue and key (the
    database enforces it, also against producers racing each other). When a
    job holds it, --on-conflict skip prints that job's id instead (JSON:
    "existing": true) and error exits 1 naming it; in a file, the first line
    with a key wins, and under error nothing is added. The key is free again
    once its job is done or failed. With --kind (or "kinds"), the key holds
    per kind: the job of kind K stores it as K:KEY.

    A limit key puts the job under the per-key limits of its queue and kind
    (`pgqctl limit set --per-key N`): at most N running jobs of each key.
    With --kind, every job gets the same key.

    With --policy FILE, a job that a worker started with the same --policy
    would refuse is refused here (see docs/worker.md, The policy).

    \b
    Example:
        pgqctl enqueue hello '{"argv": ["echo", "hello"]}'
        pgqctl enqueue report '{"argv": ["./report.sh"]}' --delay 5m --queue slow
        pgqctl enqueue sync '{"argv": ["./sync.sh", "7"]}' --unique-key user:7
        pgqctl enqueue export '{"customer": 42}' --limit-key customer:42
        pgqctl enqueue --kind send_receipt --kind update_crm '{"order_id": 42}'
        pgqctl enqueue --file jobs.jsonl
        pgqctl enqueue --policy /etc/pgqctl/policy.toml --file jobs.jsonl
        printf '%s\\n' '{"kind": "ping", "payload": {"argv": ["true"]}}' | pgqctl enqueue --file -
    """
    if delay is not None and run_at is not None:
        raise click.UsageError("give --delay or --run-at, not both")
    if kinds and kind is not None:
        # With --kind, click reads the one argument as KIND: it is the PAYLOAD.
        if payload is not None or not kind.lstrip().startswith("{"):
            raise click.UsageError(
                "give KIND or --kind, not both: with --kind, the one argument is the PAYLOAD"
            )
        kind, payload = None, kind
    fields: dict[str, Any] = {
        "queue": queue,
        "priority": priority,
        "run_at": run_at,
        "delay": delay,
        "max_attempts": max_attempts,
        "limit_key": limit_key,
    }
    open_input = None
    if path is not None:
        if kind is not None:
            raise click.UsageError("give KIND [PAYLOAD] or --file, not both")
        if kinds:
            raise click.UsageError(
                'give --kind or --file, not both: a line gives "kinds" for one job per kind'
            )
        if unique_key is not None:
            raise click.UsageError(
                'give each line of --file its own "unique_key"; --unique-key is for one job'
            )
        # Options given (on the command line or as PGQCTL_*) fill what lines leave out.
        source = click.get_current_context().get_parameter_source
        fields = {k: v for k, v in fields.items() if source(k) is not ParameterSource.DEFAULT}
        open_input = functools.partial(_open_input, path)
    elif kind is None and not kinds:
        raise click.UsageError("missing KIND (or --kind, or --file F to load many jobs)")
    request = Request(
        kind=kind,
        payload=payload,
        kinds=kinds,
        fields=fields,
        unique_key=unique_key,
        on_conflict=on_conflict,
        policy_file=policy_file,
        max_payload_bytes=max_payload_bytes,
        open_input=open_input,
    )
    done = enqueue_from_options(request, lambda: database.connect(writes=True))
    if path is not None:
        _report_file(done.ids, "stdin" if path == "-" else path, fmt)
        return
    for position in sorted(done.ids.existing):
        held = done.jobs[position]
        say(
            f"job {done.ids[position]} already has unique key {held.unique_key!r} in queue "
            f"{queue!r} (pending or running): "
            + ("nothing enqueued" if not kinds else f"no new {held.kind!r} job")
        )
    emit_new_ids(done.ids, fmt, existing=done.ids.existing)


def _regular_file(f: object) -> bool:
    try:
        return stat.S_ISREG(os.fstat(f.fileno()).st_mode)  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False


@contextlib.contextmanager
def _open_input(path: str) -> Iterator[Input]:
    """The file --file names (- for stdin), with a progress bar on a terminal."""
    with click.open_file(path, "rb") as f, file_progress(f) as progress:
        yield Input(
            f if progress is None else progress.lines(f),
            "stdin" if path == "-" else path,
            # A pipe may pause for as long as its writer likes: read it all
            # before the transaction. A regular file streams.
            read_first=not _regular_file(f),
            on_progress=None if progress is None else progress.sent,
        )


def _report_file(ids: Ids, source: str, fmt: str) -> None:
    if not ids:
        say(f"nothing to enqueue: {source} has no jobs")
        emit_new_ids([], fmt)
        return
    if ids.existing:
        held = len(ids.existing)
        added = len(ids) - held
        say(
            f"enqueued {plural(added, 'job')}; {plural(held, 'job')} skipped: "
            f"their unique key is held by a pending or running job (its id printed instead)"
        )
    else:
        say(f"enqueued {plural(len(ids), 'job')} {id_span(ids)}")
    # Thousands of ids on a terminal are noise: there, the line above says it all.
    if not (sys.stdout.isatty() and fmt in ("auto", *HUMAN_FORMATS)):
        emit_new_ids(ids, fmt, existing=ids.existing)
