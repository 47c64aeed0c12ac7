"""Flow limits: limit set, list, remove (library: pgqctl/flow.py)."""

from __future__ import annotations

from typing import Any

import click

from pgqctl import flow
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
from pgqctl.output.limits import emit_limits, limit_name


@click.group("limit", cls=OnceGroup, context_settings=CONTEXT)
def limit_group() -> None:
    """Fleet-wide limits on a queue or a kind: jobs running at once, started
    per period, running per key.

    Kept in the database and kept by the claim itself: every worker on
    every host honours them from its next claim (it hears of a change at
    once, or at the latest with its next heartbeat), with no leader. Jobs
    held back stay pending and are claimed, in claim order, as running ones
    end or the rate allows.

    \b
    Example:
        pgqctl limit set --kind report --concurrency 5
        pgqctl limit set --queue smtp --rate 10/s
        pgqctl limit set --queue imports --per-key 2
        pgqctl limit list
        pgqctl limit remove --kind report
    """


def _target(func: Any) -> Any:
    func = selection_option("--kind", metavar="KIND", help="Limit the jobs of this kind.")(func)
    return selection_option("--queue", metavar="QUEUE", help="Limit the jobs of this queue.")(func)


def _scope(queue: str | None, kind: str | None) -> tuple[str, str]:
    if (queue is None) == (kind is None):
        raise BadInput("give one of --queue NAME or --kind NAME")
    return ("queue", queue) if queue is not None else ("kind", kind or "")


@command("set")
@database_options
@_target
@selection_option(
    "--concurrency",
    type=int,
    metavar="N",
    help="At most N of its jobs running at any instant, across every worker.",
)
@selection_option(
    "--rate",
    metavar="N/PERIOD",
    help="At most N of its jobs started per PERIOD (s, m, h, d, or a duration such as "
    "30s), across every worker: a token bucket refilled at N per PERIOD that holds "
    "--burst tokens.",
)
@selection_option(
    "--burst",
    type=int,
    metavar="N",
    default=flow.DEFAULT_BURST,
    show_default=True,
    help="With --rate: tokens the bucket holds, the starts allowed at once after a quiet "
    "spell. Any window of PERIOD starts at most N + burst jobs.",
)
@selection_option(
    "--per-key",
    type=int,
    metavar="N",
    help="At most N running jobs of each --limit-key (set at enqueue), so that one key's "
    "backlog cannot take every slot. Jobs without a key are not bound by it.",
)
@format_options
def set_command(
    database: Database,
    queue: str | None,
    kind: str | None,
    concurrency: int | None,
    rate: str | None,
    burst: int,
    per_key: int | None,
    fmt: str,
) -> None:
    """Set the limit of a queue or a kind, replacing the one it had.

    What is not given no longer limits it: `limit set --kind report
    --concurrency 5` after `--rate 10/s` leaves only the concurrency. Jobs
    of it running now count against a new concurrency at once; the others
    hold from the workers' next claims.

    \b
    Example:
        pgqctl limit set --kind report --concurrency 5
        pgqctl limit set --queue smtp --rate 10/s --burst 5
        pgqctl limit set --queue imports --concurrency 20 --per-key 2
    """
    scope, name = _scope(queue, kind)
    parsed = None if rate is None else flow.parse_rate(rate)
    if parsed is not None:
        parsed = flow.Rate(parsed.count, parsed.period, burst)
    with database.connect(writes=True) as conn:
        limit, replaced = flow.set_limit(
            conn, scope, name, concurrency=concurrency, per_key=per_key, rate=parsed
        )
    emit_limits([limit], fmt)
    say(
        f"{'replaced the' if replaced else 'set a'} limit of {limit_name(limit)}: "
        f"{limit.rule()}; every worker keeps it from its next claim"
    )


@command("list")
@database_options
@format_options
def list_command(database: Database, fmt: str) -> None:
    """Every limit: what it allows, the jobs running under it, and the due
    jobs it holds back now with how long the oldest has waited.

    \b
    Example:
        pgqctl limit list
        pgqctl limit list --json
    """
    with database.connect() as conn:
        found = flow.limits(conn)
    emit_limits(found, fmt)
    if not found:
        say("no limits: `pgqctl limit set --kind KIND --concurrency N` sets one")


@command("remove")
@database_options
@_target
def remove_command(database: Database, queue: str | None, kind: str | None) -> None:
    """Remove the limit of a queue or a kind: its jobs are claimed as freely
    as any from the workers' next claims.

    \b
    Example:
        pgqctl limit remove --kind report
    """
    scope, name = _scope(queue, kind)
    with database.connect(writes=True) as conn:
        removed = flow.remove_limit(conn, scope, name)
    if removed:
        say(f"removed the limit of {scope} {name}")
    else:
        say(f"{scope} {name} has no limit: nothing to do")


for _command in (set_command, list_command, remove_command):
    limit_group.add_command(_command)
