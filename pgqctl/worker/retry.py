"""When the worker tries the database again after it failed it.

Two waits, each growing while the trouble lasts: a reconnect after the
connection was lost (from RECONNECT_FIRST, doubling, to RECONNECT_CAP, each
jittered so a fleet does not come back in step), and a pause while the
server refuses statements for want of a resource (disk full, out of
memory...: SQLSTATE class 53), on a connection that is fine, which starts
short again after a quiet while. No database and no logging: the loop asks
what is due and says what happened.
"""

from __future__ import annotations

from pgqctl.worker.config import RECONNECT_CAP, RECONNECT_FIRST, jittered


class Retry:
    def __init__(self, now: float) -> None:
        self.reconnect_delay = RECONNECT_FIRST
        self.reconnect_at = now
        self.lost_since: float | None = None
        # No exchange before refused_until, refused_delay longer each time.
        self.refused_until = 0.0
        self.refused_delay = RECONNECT_FIRST

    def may_reconnect(self, now: float) -> bool:
        return now >= self.reconnect_at

    def refusing(self, now: float) -> bool:
        """Whether the server's refusal still holds the exchange back."""
        return now < self.refused_until

    def lost(self, now: float) -> None:
        """The connection is gone (or never came): reconnect after a wait."""
        if self.lost_since is None:
            self.lost_since = now
        self.reconnect_failed(now)

    def reconnect_failed(self, now: float) -> None:
        """Wait longer before the next try."""
        self.reconnect_at = now + jittered(self.reconnect_delay)
        self.reconnect_delay = min(self.reconnect_delay * 2, RECONNECT_CAP)

    def restored(self, now: float) -> float:
        """Connected again: how long the database was away; the next loss
        starts with a short wait."""
        down = now - (self.lost_since if self.lost_since is not None else now)
        self.lost_since = None
        self.reconnect_delay = RECONNECT_FIRST
        return down

    def refused(self, now: float) -> float:
        """The server refused a statement: how long to hold back (longer each
        time while it goes on; a refusal after a quiet while starts short)."""
        if now - self.refused_until > 2 * RECONNECT_CAP:
            self.refused_delay = RECONNECT_FIRST
        delay = jittered(self.refused_delay)
        self.refused_delay = min(self.refused_delay * 2, RECONNECT_CAP)
        self.refused_until = now + delay
        return delay
