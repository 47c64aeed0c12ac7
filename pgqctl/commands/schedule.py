"""`pgqctl schedule add|list|show|remove|pause|resume|run|sync` (library:
pgqctl/schedules.py)."""

from __future__ import annotations

from typing import IO

import click

from pgqctl import schedules
from pgqctl.commands.enqueue import (
    max_attempts_option,
    policy_option,
    priority_option,
    queue_option,
)
from pgqctl.commands.options import (
    CONTEXT,
    Database,
    OnceGroup,
    command,
    database_options,
    format_options,
    say,
    selection_option,
)
from pgqctl.errors import BadInput
from pgqctl.intake.command_line import read_policy_file
from pgqctl.intake.fields import check_policy, parse_payload
from pgqctl.output.formats import emit_new_ids
from pgqctl.output.schedules import emit_schedule, emit_schedules, emit_sync
from pgqctl.payload import iso_utc
from pgqctl.text import plural


@click.group("schedule", cls=OnceGroup, context_settings=CONTEXT)
def schedule_group() -> None:
    """Cron and interval schedules, enqueued by the running workers: one job per tick.

    Kept in the database. Any worker (without --no-schedules) enqueues a
    due tick, and the database keeps each tick to one job however many
    workers try at once, so no tick is lost while a worker runs and none is
    doubled; no leader, no daemon. A job of a tick has PGQCTL_SCHEDULE and
    PGQCTL_TICK (the tick's time, ISO 8601 in UTC) in its environment.

    \b
    Example:
        pgqctl schedule add nightly --cron '0 3 * * *' --timezone Europe/Paris \\
            report '{"argv": ["./report.sh"]}'
        pgqctl schedule list
        pgqctl schedule sync schedules.toml --dry-run
    """


@command("add")
@database_options
@click.argument("name")
@click.argument("kind")
@click.argument("payload", required=False)
@selection_option("--cron", metavar="EXPR", help="Cron expression: 5 fields, or 6 with seconds.")
@selection_option(
    "--timezone",
    metavar="ZONE",
    help="Time zone of --cron (IANA name, e.g. Europe/Paris). Default: UTC.",
)
@selection_option(
    "--every",
    metavar="DURATION",
    help="Tick at this interval instead, whole seconds of at least 1s (30s, 5m, 1h), "
    "at multiples of it since the epoch.",
)
@queue_option
@priority_option
@max_attempts_option
@selection_option("--paused", is_flag=True, help="Add it paused (`schedule resume` starts it).")
@selection_option(
    "--overlap",
    type=click.Choice(schedules.OVERLAP),
    default="skip",
    show_default=True,
    help="A tick while the previous tick's job is still pending or running: skip it "
    "(counted in skipped_ticks), or allow a second job.",
)
@policy_option
@format_options
def add_command(
    database: Database,
    name: str,
    kind: str,
    payload: str | None,
    cron: str | None,
    timezone: str | None,
    every: str | None,
    queue: str,
    priority: int,
    max_attempts: int,
    paused: bool,
    overlap: str,
    policy_file: str | None,
    fmt: str,
) -> None:
    """Add schedule NAME: a job of KIND (with the JSON object PAYLOAD,
    default {}) at every tick of --cron or --every.

    The job's fields and payload are checked as `enqueue` checks them, the
    expression and the zone by the cron library and the system's time zone
    data (daylight-saving changes included: a time skipped by the change
    runs just after it, a time repeated runs once). Ticks start from now.
    With --overlap skip (the default), a tick comes to nothing while the
    job of the schedule's previous tick is pending or running: a slow job
    never piles up a backlog of itself.
    With --policy FILE, a job that workers with that policy would refuse is
    refused here, as `enqueue --policy` refuses it.

    \b
    Example:
        pgqctl schedule add nightly --cron '0 3 * * *' --timezone Europe/Paris \\
            report '{"argv": ["./report.sh"]}'
        pgqctl schedule add heartbeat --every 30s ping '{"argv": ["true"]}'
        pgqctl schedule add digest --cron '*/15 9-17 * * MON-FRI' --queue emails digest
    """
    definition = schedules.define(
        name,
        cron=cron,
        every=every,
        timezone=timezone,
        kind=kind,
        payload=parse_payload(payload) if payload is not None else None,
        queue=queue,
        priority=priority,
        max_attempts=max_attempts,
        paused=paused,
        overlap=overlap,
    )
    rules = read_policy_file(policy_file)
    if rules is not None:
        check_policy(definition.kind, definition.payload, rules)
    with database.connect(writes=True) as conn:
        added = schedules.add(conn, definition)
    emit_schedule(added, fmt)
    tick = added.next_tick
    when = "paused" if tick is None else f"next tick {iso_utc(tick)}"
    say(f"schedule {name} added ({added.timing.describe()}): {when}")


@command("list")
@database_options
@format_options
def list_command(database: Database, fmt: str) -> None:
    """The schedules: timing, next tick, the last tick enqueued and its job,
    and since when a tick was missed.

    A tick is missed when no worker enqueued it within MISSED_GRACEs of its
    time (no worker ran, or all ran --no-schedules): missed_since says
    which tick, until a later tick is enqueued. `check --schedules` alerts
    on it. job_status is the last tick's job's (purged: no longer there).

    \b
    Example:
        pgqctl schedule list
        pgqctl schedule list --json | jq '.[] | select(.missed_since != null) | .name'
    """
    with database.connect() as conn:
        found = schedules.list_all(conn)
    emit_schedules(found, fmt, schedules.FIELDS)
    missed = [s.name for s in found if s.missed_since is not None]
    if missed:
        say(
            f"{plural(len(missed), 'schedule')} missed a tick ({', '.join(missed)}): "
            "is a worker running (without --no-schedules)?"
        )
    elif not found:
        say("no schedules: `pgqctl schedule add` or `pgqctl schedule sync FILE` makes some")


list_command.help = (list_command.help or "").replace("MISSED_GRACE", f"{schedules.MISSED_GRACE:g}")


@command("show")
@database_options
@click.argument("name")
@format_options
def show_command(database: Database, name: str, fmt: str) -> None:
    """One schedule, whole.

    \b
    Example:
        pgqctl schedule show nightly
        pgqctl schedule show nightly --json | jq .next_tick
    """
    with database.connect() as conn:
        found = schedules.show(conn, name)
    emit_schedule(found, fmt)


@command("remove")
@database_options
@click.argument("name")
@format_options
def remove_command(database: Database, name: str, fmt: str) -> None:
    """Remove a schedule: no more ticks. Its jobs stay, with its name.

    \b
    Example:
        pgqctl schedule remove nightly
    """
    with database.connect(writes=True) as conn:
        removed = schedules.remove(conn, name)
    emit_schedule(removed, fmt)
    say(f"schedule {name} removed")


@command("pause")
@database_options
@click.argument("name")
@format_options
def pause_command(database: Database, name: str, fmt: str) -> None:
    """Pause a schedule: workers enqueue none of its ticks until resumed.

    \b
    Example:
        pgqctl schedule pause nightly
    """
    with database.connect(writes=True) as conn:
        found, changed = schedules.set_paused(conn, name, True)
    emit_schedule(found, fmt)
    say(f"schedule {name} paused" if changed else f"schedule {name} was paused already")


@command("resume")
@database_options
@click.argument("name")
@format_options
def resume_command(database: Database, name: str, fmt: str) -> None:
    """Resume a paused schedule; it ticks from now on (the ticks of its
    pause are not caught up).

    \b
    Example:
        pgqctl schedule resume nightly
    """
    with database.connect(writes=True) as conn:
        found, changed = schedules.set_paused(conn, name, False)
    emit_schedule(found, fmt)
    if changed and found.next_tick is not None:
        say(f"schedule {name} resumed: next tick {iso_utc(found.next_tick)}")
    else:
        say(f"schedule {name} is not paused: nothing to do")


@command("run")
@database_options
@click.argument("name")
@format_options
def run_command(database: Database, name: str, fmt: str) -> None:
    """Enqueue one job of a schedule now, outside its ticks, and print its id.

    The job has the schedule's name and no tick (PGQCTL_TICK is not set);
    the schedule's own ticks go on as they would have.

    \b
    Example:
        pgqctl schedule run nightly
    """
    with database.connect(writes=True) as conn:
        job_id = schedules.run_now(conn, name)
    emit_new_ids([job_id], fmt)


@command("sync")
@database_options
@click.argument("path", metavar="FILE", type=click.File("rb"))
@selection_option("--dry-run", is_flag=True, help="Show the changes; change nothing.")
@selection_option(
    "--source",
    metavar="NAME",
    help="The name the file's schedules are kept under: a sync removes only the "
    "schedules of its own source. Default: FILE's name (e.g. team-a.toml); "
    "needed for FILE -.",
)
@selection_option(
    "--allow-empty",
    is_flag=True,
    help="Sync a FILE that names no schedule: remove every schedule of the source.",
)
@selection_option("--prune-all", is_flag=True, hidden=True)
@policy_option
@format_options
def sync_command(
    database: Database,
    path: IO[bytes],
    dry_run: bool,
    source: str | None,
    allow_empty: bool,
    prune_all: bool,
    policy_file: str | None,
    fmt: str,
) -> None:
    """Make the schedules of a TOML file's source match it: add, update and remove.

    One table per schedule, [schedules.NAME], with the keys cron or every,
    timezone, kind, payload (an inline table), queue, priority,
    max_attempts, paused and overlap. Each file is a source, named by
    --source or else by the file's name: a sync removes the schedules of
    its source that the file no longer names, never those of another
    source nor those made by `schedule add`, so teams' files never undo
    each other. A file naming a schedule of another source is refused; one
    made by `schedule add` (or synced before sources existed) that the
    file names becomes its source's. A file that names no schedule (empty,
    only comments) is refused unless --allow-empty. A `paused` or `overlap`
    the file leaves out leaves the schedule's as it is (a new schedule: not
    paused, overlap skip). Syncing the same file again changes nothing. The
    whole file is checked first: a bad one changes nothing (exit 2, naming
    the schedule and the key), and so does a job that workers with the
    --policy FILE would refuse. Prints the changes (--dry-run: that would be
    made).

    \b
    Example:
        pgqctl schedule sync deploy/schedules.toml --dry-run
        pgqctl schedule sync deploy/schedules.toml
        render-schedules | pgqctl schedule sync - --source billing
    """
    if prune_all:
        raise BadInput(
            "--prune-all is gone: a sync removes only the schedules of its own --source; "
            "remove others with `pgqctl schedule remove NAME`"
        )
    # click names its stdin <stdin> (a test runner's has no name).
    file_name = getattr(path, "name", "<stdin>")
    from_stdin = file_name in ("-", "<stdin>")
    named = "stdin" if from_stdin else file_name
    source = schedules.source_of(None if from_stdin else file_name, source)
    wanted = schedules.read_file(path.read(), named)
    if not wanted and not allow_empty:
        raise BadInput(
            f"{named} names no schedule (empty, or only comments): syncing it would remove "
            f"every schedule of source {source!r}; give --allow-empty if that is meant"
        )
    rules = read_policy_file(policy_file)
    if rules is not None:
        for definition in wanted:
            try:
                check_policy(definition.kind, definition.payload, rules)
            except BadInput as exc:
                raise BadInput(f"{named}: schedule {definition.name!r}: {exc}") from None
    with database.connect(writes=True) as conn:
        synced = schedules.sync(conn, wanted, source=source, dry_run=dry_run)
    changes = synced.changes
    emit_sync(changes, fmt)
    if synced.unowned:
        say(
            f"{plural(len(synced.unowned), 'schedule')} made by a sync before sources "
            f"existed belong to no source ({', '.join(synced.unowned)}): name them in their "
            "file to adopt them, or `pgqctl schedule remove NAME`"
        )
    if not changes:
        say(f"schedules match {named} (source {source}): nothing to change")
        return
    counts = {a: sum(c.action == a for c in changes) for a in ("add", "update", "remove")}
    done = {"add": "added", "update": "updated", "remove": "removed"}
    what = ", ".join(f"{n} to {a}" if dry_run else f"{n} {done[a]}" for a, n in counts.items() if n)
    say(f"dry run, nothing changed: {what}" if dry_run else f"synced {named}: {what}")


for _command in (
    add_command,
    list_command,
    show_command,
    remove_command,
    pause_command,
    resume_command,
    run_command,
    sync_command,
):
    schedule_group.add_command(_command)
