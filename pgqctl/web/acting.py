"""Whether the page may act on the queue, and what makes a request to act
a real one.

Actions are off unless `pgqctl web --allow-actions`; with it, the page is
still read-only while the database is a standby or its role lacks the
privileges (checked again every RIGHTS_SECONDS, so a failover or a REVOKE
shows). A request to act is a POST of a form from this page: it carries the
form token this server made when it started (a page from another site
cannot read it, so it cannot make the browser send it), and the browser
does not say it comes from another site (Sec-Fetch-Site).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl

from pgqctl.errors import BadInput, PgqctlError

# How long a check of the role's privileges and of the server's standby
# state holds.
RIGHTS_SECONDS = 10.0
# The largest form the page takes: its filter fields, the token, and up to
# 10,000 job ids as ranges.
FORM_BYTES = 256 * 1024
FORM_TYPE = "application/x-www-form-urlencoded"


class Refused(PgqctlError):
    """A request to act that this page does not take (HTTP 403)."""


@dataclass(frozen=True)
class State:
    """What a page shows of the actions: whether its buttons are live, why
    not, and the form token they send."""

    allowed: bool
    why_not: str | None
    form_token: str


class Acting:
    def __init__(self, enabled: bool, rights: Callable[[], str | None]) -> None:
        """`rights`: why this page's connection may not act (read_only_reason), or None."""
        self.enabled = enabled
        self.form_token = secrets.token_urlsafe(32)
        self._rights = rights
        self._lock = threading.Lock()
        self._checked_at = -RIGHTS_SECONDS
        self._why_not: str | None = None

    def state(self) -> State:
        """As it stands now; reads the database at most every RIGHTS_SECONDS."""
        if not self.enabled:
            return State(
                False, "read-only: start pgqctl web with --allow-actions to act", self.form_token
            )
        with self._lock:
            now = time.monotonic()
            if now - self._checked_at >= RIGHTS_SECONDS:
                self._why_not = self._rights()
                self._checked_at = now
            why_not = self._why_not
        if why_not is not None:
            return State(False, f"read-only: {why_not}", self.form_token)
        return State(True, None, self.form_token)

    def checked_form(self, headers: Mapping[str, str], body: bytes) -> list[tuple[str, str]]:
        """The fields of a request to act, as (name, value) pairs in order,
        once it is known to come from this page and actions are allowed;
        Refused otherwise. `headers`: the request's, with lower-case names."""
        # Browsers say whether a request comes from another site; a proxy
        # in front leaves the header as it is (unlike Host and the scheme).
        if headers.get("sec-fetch-site", "same-origin") in ("cross-site", "same-site"):
            raise Refused("a request to act from another site is refused")
        if headers.get("content-type", "").partition(";")[0].strip() != FORM_TYPE:
            raise BadInput("a request to act is a form of this page")
        if len(body) > FORM_BYTES:
            raise BadInput("the form is too large")
        try:
            pairs = parse_qsl(body.decode("utf-8"), keep_blank_values=True)
        except UnicodeDecodeError:
            raise BadInput("the form is not UTF-8") from None
        state = self.state()
        if not state.allowed:
            raise Refused(state.why_not or "read-only")
        given = next((value for name, value in reversed(pairs) if name == "form_token"), "")
        if not secrets.compare_digest(given.encode(), self.form_token.encode()):
            raise Refused(
                "the form's token is missing or stale (the page was served by an earlier "
                "run of pgqctl web): reload the page and try again"
            )
        return pairs
