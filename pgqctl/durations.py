"""Durations as people type them: `30s`, `5m`, `2h`, `1d`, `1h30m`, or plain seconds."""

from __future__ import annotations

import re

from pgqctl.errors import BadInput

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
# Longer is never meant, and would overflow PostgreSQL's timestamps (a lease
# or a delay added to now()) or the system's timers.
MAX_SECONDS = 100 * 365 * 86400


def parse_duration(text: str, *, what: str = "duration") -> float:
    """Seconds in `text`; BadInput with an example when it is not a duration."""
    value = text.strip().lower()
    try:
        seconds = float(value)
    except ValueError:
        seconds = _parse_units(value, text, what)
    if seconds < 0 or seconds != seconds or seconds == float("inf"):
        raise BadInput(f"{what} must be a non-negative duration, got {text!r}")
    if seconds > MAX_SECONDS:
        raise BadInput(f"{what} must be at most 100 years (36500d), got {text!r}")
    return seconds


def _parse_units(value: str, text: str, what: str) -> float:
    parts = _PART.findall(value)
    if not parts or "".join(n + u for n, u in parts) != value:
        raise BadInput(
            f"{what} {text!r} is not a duration: use a number of seconds or 30s, 5m, 2h, 1d"
        )
    return sum(float(n) * _UNITS[u] for n, u in parts)
