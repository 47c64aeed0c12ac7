"""`pgqctl web`: the queue's page in a browser (library: pgqctl/web/)."""

from __future__ import annotations

import errno
import os
import re
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click

from pgqctl.commands.options import Database, command, database_options, say
from pgqctl.errors import BadInput

# Requests wait on locks briefly and run for a few seconds at most: a page
# stuck behind a lock says who holds it rather than spinning.
WEB_LOCK_TIMEOUT = "2s"
WEB_STATEMENT_TIMEOUT = "10s"
_BASE_PATH = re.compile(r"(/[A-Za-z0-9._~-]+)*")


@command("web")
@database_options(lock_timeout=WEB_LOCK_TIMEOUT, statement_timeout=WEB_STATEMENT_TIMEOUT)
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="The address to serve on. Any other than a loopback one needs a token.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8080,
    show_default=True,
    help="0: any free port.",
)
@click.option(
    "--base-path",
    default="",
    metavar="PATH",
    help="Serve under PATH (e.g. /pgqctl), behind a reverse proxy that forwards it.",
)
@click.option(
    "--token-file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A file whose first line is the token every request must carry "
    "(else PGQCTL_WEB_TOKEN; never on the command line).",
)
@click.option(
    "--allow-actions",
    is_flag=True,
    help="Show the buttons that change the queue: retry, run now, cancel, pause and resume "
    "a queue, requeue or cancel the jobs a filter matches. Each action is recorded "
    "(`pgqctl actions`). Without it the page only reads.",
)
def web_command(
    database: Database,
    host: str,
    port: int,
    base_path: str,
    token_file: Path | None,
    allow_actions: bool,
) -> None:
    """Serve the queue in a browser: an overview updated live, jobs,
    a job's attempts and why it waits, workers, schedules, doctor.

    Read-only unless --allow-actions, over the same database and library
    as the other commands (a standby, or a role that may not change the
    queue, keeps it read-only, and the page says why).
    It binds 127.0.0.1 unless told otherwise; another address needs a token
    (PGQCTL_WEB_TOKEN, or --token-file), which a browser gives as the
    password of basic authentication (any user name) and a script as
    `Authorization: Bearer TOKEN`. /healthz answers without it. Needs the
    web extra: pip install 'pgqctl[web]'. SIGTERM or Ctrl-C stops it.

    \b
    Example:
        pgqctl web
        pgqctl web --host 0.0.0.0 --token-file /etc/pgqctl/web-token
        pgqctl web --allow-actions
    """
    try:
        import uvicorn

        from pgqctl.web.app import Settings, make_app
    except ImportError as exc:
        raise BadInput(
            f"pgqctl web needs the web extra ({exc.name} is missing): pip install 'pgqctl[web]'"
        ) from exc
    from pgqctl import config
    from pgqctl.web import access

    token = access.read_token(os.environ, token_file)
    access.check_bind(host, token)
    base = base_path.rstrip("/")
    if not _BASE_PATH.fullmatch(base):
        raise BadInput(
            f"--base-path {base_path!r} is not a path: give one like /pgqctl "
            "(letters, digits, . _ ~ - between slashes)"
        )
    with database.connect() as first:  # fails now, with the usual message, if it cannot
        where = config.describe(first.info.dsn)
    stopping = threading.Event()
    app = make_app(Settings(where, token, base, allow_actions), database.reconnect, stopping)
    listening = _listen(host, port)
    bound_host, bound_port = listening.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    say(f"serving the queue's page on http://{shown}:{bound_port}{base}/ ; SIGTERM or Ctrl-C stops")
    server = _server_class(stopping)(
        uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    )
    server.run(sockets=[listening])
    say("stopped serving the queue's page")


def _server_class(stopping: threading.Event) -> Any:
    import uvicorn

    class Server(uvicorn.Server):  # type: ignore[misc]
        @contextmanager
        def capture_signals(self) -> Iterator[None]:
            # A stop asked for ends the serving, and the command exits 0 as
            # `metrics --listen` does: uvicorn would raise the signal again
            # once stopped, and the process would die of it.
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, self.handle_exit)
            yield

        def handle_exit(self, sig: int, frame: Any) -> None:
            stopping.set()  # the open event streams end, so the server can
            super().handle_exit(sig, frame)

    return Server


def _listen(host: str, port: int) -> socket.socket:
    address = host.strip("[]")  # [::1] as in a URL
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        hint = "pick another --port" if exc.errno == errno.EADDRINUSE else "check --host"
        raise BadInput(f"cannot serve on {host} port {port}: {exc.strerror}; {hint}") from exc
    sock.listen(128)
    return sock
