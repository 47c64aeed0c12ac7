"""The web application: its routes, who may reach them, and how a page is
made (pages.py reads, a template writes).

Pages are plain functions run in the server's thread pool, each on a
connection borrowed for its length (pool.py), each read one transaction
with the command's timeouts. The overview's live part is a stream of
server-sent events, fed by one shared read a second (live.py).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlencode

import psycopg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pgqctl import admin, db
from pgqctl.durations import parse_duration
from pgqctl.errors import BadInput, NotFound, PgqctlError, TimedOut
from pgqctl.jobs import STATUS_NAMES
from pgqctl.output.attempts import stream_parts, timeline_rows
from pgqctl.output.doctor import doctor_lines
from pgqctl.output.why import message as why_sentence
from pgqctl.text import format_seconds, human, size
from pgqctl.web import access, pages
from pgqctl.web.live import Shared
from pgqctl.web.pool import Pool

HERE = Path(__file__).parent
# How often an open overview is sent what changed.
LIVE_EVERY_SECONDS = 1.0


@dataclass(frozen=True)
class Settings:
    where: str  # the database, as `config.describe` names it (no password)
    token: str | None = None
    base_path: str = ""  # "" or "/path", no trailing slash


def templates() -> Environment:
    env = Environment(
        loader=FileSystemLoader(HERE / "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        seconds=lambda s: "" if s is None else format_seconds(float(s)),
        when=_when,
        human=human,
        size=lambda n: "" if n is None else size(int(n)),
        why_sentence=why_sentence,
        doctor_lines=doctor_lines,
        zip_timeline=lambda tried: list(zip(tried, timeline_rows(tried), strict=True)),
        streams=lambda attempt: [
            (name, *stream_parts(attempt, name)) for name in ("stdout", "stderr")
        ],
    )
    return env


def _when(stamp: dt.datetime | None) -> str:
    return "" if stamp is None else stamp.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def make_app(
    settings: Settings, connect: Callable[[], Any], stopping: threading.Event | None = None
) -> Starlette:
    """The application; `stopping`, once set, ends the open event streams
    (within a second), so that a server asked to stop is not held by them."""
    stopping = stopping or threading.Event()
    env = templates()
    pool = Pool(connect)
    base = settings.base_path

    def render(name: str, status: int = 200, **values: Any) -> HTMLResponse:
        html = env.get_template(name).render(base=base, where=settings.where, **values)
        return HTMLResponse(html, status_code=status)

    def read(page: Callable[..., Any], *args: Any) -> Any:
        with pool.borrow() as conn:
            return page(conn, *args)

    def overview_fragment() -> str:
        try:
            view = read(pages.overview)
        except FAILURES as exc:
            return env.get_template("problem.html").render(message=_said(exc)[1])
        return env.get_template("overview_live.html").render(base=base, view=view)

    live = Shared(overview_fragment, LIVE_EVERY_SECONDS)

    async def overview(request: Request) -> Response:
        fragment = await run_in_threadpool(live.latest)
        return render("overview.html", fragment=fragment, page="overview")

    async def overview_events(request: Request) -> Response:
        async def stream() -> AsyncIterator[str]:
            sent = None
            while not stopping.is_set():
                fragment = await run_in_threadpool(live.latest)
                if fragment != sent:
                    sent = fragment
                    yield "".join(f"data: {line}\n" for line in fragment.splitlines()) + "\n"
                await asyncio.sleep(LIVE_EVERY_SECONDS)

        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return StreamingResponse(stream(), media_type="text/event-stream", headers=headers)

    async def jobs(request: Request) -> Response:
        found, before, shown = _job_filter(request.query_params)
        page = await run_in_threadpool(read, pages.jobs_page, found, before)
        return render(
            "jobs.html",
            page="jobs",
            jobs=page,
            shown=shown,
            statuses=STATUS_NAMES,
            next_query=_with(shown, before=page.next_before) if page.next_before else None,
        )

    async def job(request: Request) -> Response:
        job_id = _job_id(request.path_params["job_id"])
        found = await run_in_threadpool(read, pages.job_page, job_id)
        if found is None:
            raise NotFound(f"no job {job_id}: it may have been purged")
        return render("job.html", page="jobs", view=found)

    async def attempt(request: Request) -> Response:
        job_id = _job_id(request.path_params["job_id"])
        number = _job_id(request.path_params["attempt"])
        found = await run_in_threadpool(read, pages.attempt_output, job_id, number)
        if found is None:
            raise NotFound(f"job {job_id} has no attempt {number} on record")
        return render("attempt.html", page="jobs", attempt=found)

    async def workers(request: Request) -> Response:
        fleet = await run_in_threadpool(read, pages.workers)
        return render("workers.html", page="workers", workers=fleet)

    async def schedule_list(request: Request) -> Response:
        found = await run_in_threadpool(read, pages.schedule_list)
        return render("schedules.html", page="schedules", schedules=found)

    async def doctor(request: Request) -> Response:
        report = await run_in_threadpool(read, pages.doctor_report)
        return render("doctor.html", page="doctor", report=report)

    async def healthz(request: Request) -> Response:
        def ping(conn: Any) -> None:
            with conn.transaction():
                conn.execute("SELECT 1")

        try:
            await run_in_threadpool(read, ping)
        except FAILURES as exc:
            return PlainTextResponse(f"database unreachable: {_said(exc)[1]}\n", status_code=503)
        return PlainTextResponse("ok\n")

    async def refused(request: Request, exc: Exception) -> Response:
        status, message = _said(exc)
        return render("error.html", status=status, message=message, page="")

    routes = [
        Route("/", overview),
        Route("/events/overview", overview_events),
        Route("/jobs", jobs),
        Route("/jobs/{job_id}", job),
        Route("/jobs/{job_id}/attempts/{attempt}", attempt),
        Route("/workers", workers),
        Route("/schedules", schedule_list),
        Route("/doctor", doctor),
        Route("/healthz", healthz),
        Mount("/static", app=StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=[Mount(base, routes=routes)] if base else routes,
        middleware=[Middleware(Guard, token=settings.token, base_path=base)],
        exception_handlers={PgqctlError: refused, psycopg.Error: refused},
        lifespan=lambda app: _closing(pool),
    )
    return app


@asynccontextmanager
async def _closing(pool: Pool) -> AsyncIterator[None]:
    try:
        yield
    finally:
        pool.close()


class Guard:
    """Asks for the token (but on /healthz), and tells the browser to run no
    script but ours and to show the page in no frame. Plain ASGI, so that a
    stream of events passes through as it is sent."""

    HEADERS: ClassVar[list[tuple[bytes, bytes]]] = [
        (
            b"content-security-policy",
            b"default-src 'self'; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
        ),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
    ]

    def __init__(self, app: Any, token: str | None, base_path: str) -> None:
        self.app = app
        self.token = token
        self.health = f"{base_path}/healthz"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization", b"").decode("latin-1")
        if scope["path"] != self.health and not access.authorized(self.token, given):
            refusal = PlainTextResponse(
                "this page needs its token (as the password, any user name)\n",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="pgqctl", charset="UTF-8"'},
            )
            await refusal(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)


# What a page can fail of, shown as one line with its HTTP status.
FAILURES = (PgqctlError, psycopg.Error)


def _said(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and the one line a page shows for `exc`."""
    if isinstance(exc, BadInput):
        return 400, str(exc)
    if isinstance(exc, NotFound):
        return 404, str(exc)
    if isinstance(exc, TimedOut):
        return 504, str(exc)
    if isinstance(exc, (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)):
        return 504, f"the database did not answer in time: {db.reason(exc)}"
    if isinstance(exc, psycopg.Error):
        return 503, f"the database failed the page: {db.reason(exc)}"
    return 503, str(exc)


def _job_id(text: str) -> int:
    if not text.isdigit() or len(text) > 19:
        raise BadInput(f"{text!r} is not a job id: a job id is a whole number")
    return int(text)


def _job_filter(query: Any) -> tuple[admin.JobFilter, int | None, dict[str, Any]]:
    """The jobs page's filter from its query string; what the form shows."""
    statuses = tuple(s for s in query.getlist("status") if s)
    unknown = [s for s in statuses if s not in STATUS_NAMES]
    if unknown:
        raise BadInput(f"unknown status {unknown[0]!r}: one of {', '.join(STATUS_NAMES)}")
    queue = query.get("queue", "").strip()
    kind = query.get("kind", "").strip()
    error = query.get("error", "").strip()
    ids = query.get("id", "").strip()
    since = query.get("since", "").strip()
    before = query.get("before", "").strip()
    found = admin.JobFilter(
        statuses=statuses,
        queues=(queue,) if queue else (),
        kinds=(kind,) if kind else (),
        ids=(_job_id(ids),) if ids else (),
        since=parse_duration(since, what="since", age=True) if since else None,
        error=error or None,
    )
    shown = {
        "status": list(statuses),
        "queue": queue,
        "kind": kind,
        "error": error,
        "id": ids,
        "since": since,
    }
    return found, _job_id(before) if before else None, shown


def _with(shown: dict[str, Any], **more: Any) -> str:
    """The query string of the jobs page for `shown` and `more`."""
    pairs: list[tuple[str, Any]] = []
    for name, value in {**shown, **more}.items():
        for one in value if isinstance(value, list) else [value]:
            if one not in (None, ""):
                pairs.append((name, one))
    return urlencode(pairs)
