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
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlencode

import psycopg
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import QueryParams
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from pgqctl import actions, admin, db
from pgqctl.durations import parse_duration
from pgqctl.errors import BadInput, NotFound, PgqctlError, TimedOut
from pgqctl.jobs import STATUS_NAMES
from pgqctl.output.attempts import stream_parts, timeline_rows
from pgqctl.output.doctor import doctor_lines
from pgqctl.output.why import message as why_sentence
from pgqctl.text import CELL_ESCAPES, ONE_LINE_ESCAPES, format_seconds, human, printable, size
from pgqctl.web import access, pages
from pgqctl.web.acting import Acting, Refused
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
    actions: bool = False  # --allow-actions: the buttons that change the queue


# What a page says after an action sent it there (`?done=`): fixed texts,
# never what the request said (but a status, checked, and a queue's name,
# escaped by the template between the two parts).
NOTICES = {
    "retried": "Retried: the job is pending again, due now, with one more try.",
    "ran": "Run now: the job is due now.",
    "cancelled": "Cancelled: a worker running it stops it within a moment.",
}
QUEUE_NOTICES = {
    "paused": ("Queue ", " paused: workers claim none of its jobs until it is resumed."),
    "resumed": ("Queue ", " resumed: workers claim its jobs again."),
    "not_paused": ("Nothing changed: queue ", " was not paused."),
    "already_paused": ("Nothing changed: queue ", " was paused already."),
}
# The job actions, by the last part of their path.
JOB_ACTIONS = {
    "retry": (actions.retry, "retried"),
    "run-now": (actions.run_now, "ran"),
    "cancel": (actions.cancel, "cancelled"),
}


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
        name=lambda v: shown_text(v, ONE_LINE_ESCAPES),
        text=lambda v: shown_text(v, CELL_ESCAPES),
        size=lambda n: "" if n is None else size(int(n)),
        why_sentence=why_sentence,
        target_text=actions.target_text,
        doctor_lines=doctor_lines,
        zip_timeline=lambda tried: list(zip(tried, timeline_rows(tried), strict=True)),
        streams=lambda attempt: [
            (name, *stream_parts(attempt, name)) for name in ("stdout", "stderr")
        ],
    )
    return env


def shown_text(value: Any, escapes: Mapping[int, str]) -> str:
    """A value from the database as the page shows it: the characters that
    are not printable escaped as the command line escapes them (control
    characters, and the invisible ones that reorder or hide text, bidi
    overrides and zero-width characters, so a queue cannot pass for
    another). HTML escaping is the template's."""
    return printable("" if value is None else str(value), escapes)


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

    def write(change: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run an action on a borrowed connection; never again on failure
        (unlike a read, it may have committed)."""
        with pool.borrow() as conn:
            return change(conn, *args, **kwargs)

    acting = Acting(settings.actions, lambda: read(actions.read_only_reason))

    async def acts() -> Any:
        return await run_in_threadpool(acting.state)

    async def checked(request: Request) -> tuple[QueryParams, str]:
        """A request to act: its form's fields, and who sent it."""
        body = await request.body()
        pairs = await run_in_threadpool(acting.checked_form, request.headers, body)
        client = request.client.host if request.client else "unknown"
        return QueryParams(pairs), access.actor(request.headers.get("authorization"), client)

    def read(page: Callable[..., Any], *args: Any) -> Any:
        conn = None
        try:
            with pool.borrow() as conn:
                return page(conn, *args)
        except psycopg.OperationalError:
            # A timeout leaves the connection open (rolled back, lent again);
            # one the server dropped is closed by now.
            if conn is None or not conn.closed:
                raise
        # The server dropped the connection (a restart drops every one the
        # pool keeps): read once more on a new one. Pages only read.
        pool.clear()
        with pool.borrow() as conn:
            return page(conn, *args)

    def overview_fragment() -> str:
        try:
            view = read(pages.overview)
        except FAILURES as exc:
            return env.get_template("problem.html").render(message=_said(exc)[1])
        return env.get_template("overview_live.html").render(
            base=base, view=view, acts=acting.state()
        )

    live = Shared(overview_fragment, LIVE_EVERY_SECONDS)

    async def overview(request: Request) -> Response:
        fragment = await run_in_threadpool(live.latest)
        return render(
            "overview.html",
            fragment=fragment,
            page="overview",
            notice=QUEUE_NOTICES.get(request.query_params.get("done", "")),
            notice_queue=request.query_params.get("queue", ""),
            acts=await acts(),
        )

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
            acts=await acts(),
            act_query=_with(shown),
            search_span=pages.SEARCH_SPAN,
            statuses=STATUS_NAMES,
            next_query=_with(shown, before=page.next_before) if page.next_before else None,
            first_query=_with(shown) if before is not None else None,
        )

    async def job(request: Request) -> Response:
        job_id = _job_id(request.path_params["job_id"])
        found = await run_in_threadpool(read, pages.job_page, job_id)
        if found is None:
            raise NotFound(f"no job {job_id}: it may have been purged")
        return render(
            "job.html",
            page="jobs",
            view=found,
            acts=await acts(),
            notice=_job_notice(request.query_params),
        )

    async def act_on_job(request: Request) -> Response:
        job_id = _job_id(request.path_params["job_id"])
        verb = request.path_params["verb"]
        if verb not in JOB_ACTIONS:
            raise NotFound(f"no action {verb!r}: one of {', '.join(JOB_ACTIONS)}")
        _, actor = await checked(request)
        change, said = JOB_ACTIONS[verb]
        done = await run_in_threadpool(write, change, job_id, actor)
        if not done.changed and done.left is None:
            raise NotFound(f"no job {job_id}: it may have been purged")
        kept = {"done": "unchanged", "status": done.left or ""}
        where = urlencode({"done": said} if done.changed else kept)
        return RedirectResponse(f"{base}/jobs/{job_id}?{where}", status_code=303)

    async def act_on_queue(request: Request) -> Response:
        verb = request.path_params["verb"]
        if verb not in ("pause", "resume"):
            raise NotFound(f"no action {verb!r}: pause or resume")
        fields, actor = await checked(request)
        queue = fields.get("queue", "")
        if not queue or "\x00" in queue:
            raise BadInput("which queue? The form names none")
        change = actions.pause if verb == "pause" else actions.resume
        done = await run_in_threadpool(write, change, queue, actor)
        live.expire()  # the overview shows the change, not the read before it
        if done.changed:
            notice = {"pause": "paused", "resume": "resumed"}[verb]
        else:
            notice = "already_paused" if verb == "pause" else "not_paused"
        where = urlencode({"done": notice, "queue": queue})
        return RedirectResponse(f"{base}/?{where}", status_code=303)

    async def confirm_matching(request: Request) -> Response:
        action = request.query_params.get("action", "")
        found, _, shown = _job_filter(request.query_params)
        ids = await run_in_threadpool(read, actions.preview, action, found)
        taken = actions.matching_filter(action, found).statuses
        return render(
            "confirm.html",
            page="jobs",
            action=action,
            verb=action.removesuffix("_matching"),
            ids=ids,
            id_ranges=actions.id_ranges(ids),
            most=actions.MOST_MATCHING,
            batch=actions.BATCH,
            described=actions.filter_text({**shown, "status": list(taken)}),
            taken=taken,
            fields=_fields(shown),
            back=_with(shown),
            acts=await acts(),
        )

    async def act_on_matching(request: Request) -> Response:
        fields, actor = await checked(request)
        action = fields.get("action", "")
        ids = actions.parse_id_ranges(fields.get("ids", ""))
        found, _, shown = _job_filter(fields)
        taken = actions.matching_filter(action, found).statuses
        target = {"filter": {k: v for k, v in {**shown, "status": list(taken)}.items() if v}}
        action_id, _ = await run_in_threadpool(
            lambda: write(actions.act_on_matching, action, found, ids, actor, target=target)
        )
        live.expire()
        return RedirectResponse(f"{base}/actions?done={action_id}", status_code=303)

    async def action_log(request: Request) -> Response:
        done = request.query_params.get("done", "")
        found = await run_in_threadpool(read, actions.recent)
        done_id = int(done) if done.isascii() and done.isdigit() else None
        just = next((a for a in found if a.id == done_id), None)
        return render(
            "actions.html",
            page="actions",
            actions=found,
            done=done_id,
            notice=None if just is None else _action_notice(just),
        )

    async def attempt(request: Request) -> Response:
        job_id = _job_id(request.path_params["job_id"])
        number = _number(request.path_params["attempt"], "an attempt number", 2**31 - 1)
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
        except FAILURES:
            # No detail: anyone who reaches the port may ask.
            return PlainTextResponse("unavailable\n", status_code=503)
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
        Route("/jobs/{job_id}/{verb}", act_on_job, methods=["POST"]),
        Route("/queues/{verb}", act_on_queue, methods=["POST"]),
        Route("/act", confirm_matching),
        Route("/act", act_on_matching, methods=["POST"]),
        Route("/actions", action_log),
        Route("/workers", workers),
        Route("/schedules", schedule_list),
        Route("/doctor", doctor),
        Route("/healthz", healthz),
        Route("/favicon.ico", lambda request: Response(status_code=204)),
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

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *self.HEADERS]
            await send(message)

        headers = dict(scope["headers"])
        refusal = None
        if self.token is None and not access.loopback_host(
            headers.get(b"host", b"").decode("latin-1")
        ):
            # Without a token the page serves this machine only: a name that
            # is not a loopback one is a site that pointed its name here (DNS
            # rebinding) to read the page from a browser.
            refusal = PlainTextResponse(
                "without a token this page answers to localhost only\n", status_code=403
            )
        elif scope["path"] != self.health and not access.authorized(
            self.token, headers.get(b"authorization", b"").decode("latin-1")
        ):
            refusal = PlainTextResponse(
                "this page needs its token (as the password, any user name)\n",
                status_code=401,
                headers={"WWW-Authenticate": 'Basic realm="pgqctl", charset="UTF-8"'},
            )
        if refusal is not None:
            await refusal(scope, receive, with_headers)
            return
        await self.app(scope, receive, with_headers)


# What a page can fail of, shown as one line with its HTTP status.
FAILURES = (PgqctlError, psycopg.Error)


def _said(exc: BaseException) -> tuple[int, str]:
    """The HTTP status and the one line a page shows for `exc`."""
    if isinstance(exc, BadInput):
        return 400, str(exc)
    if isinstance(exc, NotFound):
        return 404, str(exc)
    if isinstance(exc, Refused):
        return 403, str(exc)
    if isinstance(exc, TimedOut):
        return 504, str(exc)
    if isinstance(exc, (psycopg.errors.QueryCanceled, psycopg.errors.LockNotAvailable)):
        return 504, f"the database did not answer in time: {db.reason(exc)}"
    if isinstance(exc, psycopg.Error):
        return 503, f"the database failed the page: {db.reason(exc)}"
    return 503, str(exc)


def _number(text: str, what: str, most: int) -> int:
    if not (text.isascii() and text.isdigit()) or int(text) > most:
        raise BadInput(f"{text!r} is not {what}: give a whole number up to {most}")
    return int(text)


def _job_id(text: str) -> int:
    return _number(text, "a job id", 2**63 - 1)


def _job_filter(query: Any) -> tuple[admin.JobFilter, int | None, dict[str, Any]]:
    """The jobs page's filter from its query string; what the form shows."""
    statuses = tuple(s for s in query.getlist("status") if s)
    unknown = [s for s in statuses if s not in STATUS_NAMES]
    if unknown:
        raise BadInput(f"unknown status {unknown[0]!r}: one of {', '.join(STATUS_NAMES)}")
    queue, kind, error = (_field(query, name) for name in ("queue", "kind", "error"))
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


def _field(query: Any, name: str) -> str:
    value = str(query.get(name, "")).strip()
    if "\x00" in value:
        raise BadInput(f"{name} holds a NUL character, which no job's {name} can hold")
    return value


def _job_notice(query: Any) -> str | None:
    """What a job's page says after an action sent it there."""
    done = query.get("done", "")
    if done == "unchanged":
        status = query.get("status", "")
        now = f"the job is {status} now" if status in STATUS_NAMES else "see below"
        return f"Nothing changed: {now}."
    return NOTICES.get(done)


def _action_notice(done: actions.Action) -> str | None:
    """What the Actions page says of an action on matching jobs just done."""
    if done.action not in actions.MATCHING_STATUSES:
        return None
    verb = "Requeued" if done.action == "requeue_matching" else "Cancelled"
    jobs = f"{done.jobs:,} job{'' if done.jobs == 1 else 's'}"
    return f"{verb} {jobs}: {actions.target_text(done.target)}."


def _fields(shown: dict[str, Any]) -> list[tuple[str, str]]:
    """The jobs page's filter as (name, value) pairs, for a form's hidden fields."""
    return [
        (name, one)
        for name, value in shown.items()
        for one in (value if isinstance(value, list) else [value])
        if one not in (None, "")
    ]


def _with(shown: dict[str, Any], **more: Any) -> str:
    """The query string of the jobs page for `shown` and `more`."""
    return urlencode(_fields({**shown, **more}))
