"""`pgqctl embedded status|start|stop|dsn` (library: pgqctl/embedded.py)."""

from __future__ import annotations

import click

from pgqctl.commands.options import (
    CONTEXT,
    OnceGroup,
    command,
    embedded_started,
    format_options,
    say,
)
from pgqctl.errors import EXIT_CHECK, PgqctlError
from pgqctl.output.formats import emit_record
from pgqctl.text import plural


@click.group("embedded", cls=OnceGroup, context_settings=CONTEXT)
def embedded_group() -> None:
    """Manage the embedded PostgreSQL used when no database is configured.

    \b
    Example:
        pgqctl embedded status
        psql "$(pgqctl embedded dsn)"
        pgqctl embedded stop
        pgqctl embedded start
    """


@command("status")
@format_options
def embedded_status(fmt: str) -> None:
    """Show whether the embedded PostgreSQL exists and runs.

    Exits 0 when it runs and 3 when it does not, so a script can test it.

    \b
    Example:
        pgqctl embedded status
        pgqctl embedded status --json | jq .running
        pgqctl embedded status >/dev/null || echo "not running"
    """
    from pgqctl import embedded

    st = embedded.status()
    emit_record(
        {
            "data_dir": str(st.data_dir),
            "initialized": st.initialized,
            "running": st.running,
            "pid": st.pid,
            "version": st.version,
            "dsn": st.dsn,
        },
        fmt,
    )
    if not st.running:
        raise click.exceptions.Exit(EXIT_CHECK)


@command("start")
def embedded_start() -> None:
    """Start the embedded PostgreSQL (creating it on first use), also after
    `pgqctl embedded stop`, which keeps other commands from starting it.

    \b
    Example:
        pgqctl embedded start
    """
    from pgqctl import embedded

    started = embedded.start()
    if started.started:
        say(embedded_started(started))
    else:
        say(f"the embedded PostgreSQL in {started.data_dir} runs already")


@command("stop")
@click.option(
    "--force",
    is_flag=True,
    help="Stop it even while workers are connected (they lose their jobs' leases "
    "and retry until it is started again).",
)
def embedded_stop(force: bool) -> None:
    """Stop the embedded PostgreSQL (its data is kept).

    It stays stopped: a later command that needs it says how to start it
    (`pgqctl embedded start`) rather than starting it again. While
    workers are connected it is not stopped, and they are named, unless
    --force.

    \b
    Example:
        pgqctl embedded stop
        pgqctl embedded stop --force
    """
    from pgqctl import embedded

    workers = [] if force else embedded.connected_workers()
    if workers:
        names = ", ".join(w.removeprefix("pgqctl worker ") for w in workers)
        raise PgqctlError(
            f"{plural(len(workers), 'worker')} connected ({names}): stop "
            f"{'it' if len(workers) == 1 else 'them'} first (SIGTERM lets running jobs "
            "finish), or give --force"
        )
    if embedded.stop(stay_stopped=True):
        say("stopped the embedded PostgreSQL; `pgqctl embedded start` starts it again")
    else:
        say("the embedded PostgreSQL was not running")


@command("dsn")
def embedded_dsn() -> None:
    """Print the embedded server's connection string, starting it if needed.

    \b
    Example:
        export PGQCTL_DSN="$(pgqctl embedded dsn)"
    """
    from pgqctl import embedded

    started = embedded.ensure_running()
    if started.started:
        say(embedded_started(started))
    click.echo(started.dsn)


for _sub in (embedded_status, embedded_start, embedded_stop, embedded_dsn):
    embedded_group.add_command(_sub)
