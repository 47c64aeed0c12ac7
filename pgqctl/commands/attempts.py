"""`pgqctl logs ID` (library: pgqctl/attempts.py)."""

from __future__ import annotations

import click

from pgqctl.attempts import get_attempt
from pgqctl.commands.options import (
    JOB_ID,
    Database,
    command,
    database_options,
    format_options,
    say,
)
from pgqctl.errors import NotFound
from pgqctl.output.attempts import attempt_heading, emit_logs


@command("logs")
@database_options
@click.argument("job_id", metavar="ID", type=JOB_ID)
@click.option(
    "--attempt",
    type=click.IntRange(min=1),
    metavar="N",
    help="The try numbered N (as `show` lists them; the latest claim of that number). "
    "Default: the latest attempt.",
)
@click.option("--stdout", "only_stdout", is_flag=True, help="Only what the job wrote to stdout.")
@click.option("--stderr", "only_stderr", is_flag=True, help="Only what the job wrote to stderr.")
@format_options
def logs_command(
    database: Database,
    job_id: int,
    attempt: int | None,
    only_stdout: bool,
    only_stderr: bool,
    fmt: str,
) -> None:
    """The output an attempt of a job wrote, as the worker kept it.

    The worker keeps the first and the last part of each stream of every
    attempt (`pgqctl worker --keep-output`); what lies between is shown as
    one line, `[... N bytes left out ...]`. Piped, the text is as the job
    wrote it; on a terminal, control characters are shown escaped. Without
    --stdout or --stderr, both streams, each under a heading. --json gives
    the attempt's every field: outcome, times, exit status or signal, CPU
    time, peak memory, and each stream's head, tail and size.

    \b
    Example:
        pgqctl logs 42
        pgqctl logs 42 --attempt 1 --stderr
        pgqctl logs 42 --json | jq .max_rss_bytes
    """
    with database.connect() as conn:
        found = get_attempt(conn, job_id, attempt)
    if found is None:
        which = f"attempt {attempt} of job {job_id}" if attempt else f"job {job_id}"
        raise NotFound(
            f"no attempt recorded for {which} in schema {database.schema}: "
            f"`pgqctl show {job_id}` lists the job's attempts"
        )
    streams = ["stdout"] if only_stdout else ["stderr"] if only_stderr else ["stdout", "stderr"]
    if only_stdout and only_stderr:
        streams = ["stdout", "stderr"]
    say(attempt_heading(found))
    emit_logs(found, streams, fmt)
