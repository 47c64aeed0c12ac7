"""`pgqctl embedded status|stop|dsn` (library: pgqctl/embedded.py)."""

from __future__ import annotations

import click

from pgqctl import output
from pgqctl.commands.options import (
    CONTEXT,
    OnceGroup,
    command,
    embedded_started,
    format_options,
    say,
)
from pgqctl.errors import EXIT_CHECK


@click.group("embedded", cls=OnceGroup, context_settings=CONTEXT)
def embedded_group() -> None:
    """Manage the embedded PostgreSQL used when no database is configured.

    \b
    Example:
        pgqctl embedded status
        psql "$(pgqctl embedded dsn)"
        pgqctl embedded stop
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
    output.emit_record(
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


@command("stop")
def embedded_stop() -> None:
    """Stop the embedded PostgreSQL (its data is kept).

    \b
    Example:
        pgqctl embedded stop
    """
    from pgqctl import embedded

    if embedded.stop():
        say("stopped the embedded PostgreSQL")
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


for _sub in (embedded_status, embedded_stop, embedded_dsn):
    embedded_group.add_command(_sub)
