"""Durations as people type them: `30s`, `5m`, `2h`, `1d`, `1w`, `250ms`,
`1h30m`, or plain seconds.

Units are lower case; upper case is accepted where it cannot be misread
(`7D`, `2H`), but never for minutes: `5M` could as well mean months, so it
is refused rather than guessed. An age (how long ago: `purge --older-than`,
`--since`) must give a unit, since a bare `7` reads as seven days as easily
as seven seconds.
"""

from __future__ import annotations

import math
import re

from pgqctl.errors import BadInput

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
# Longer is never meant, and would overflow PostgreSQL's timestamps (a lease
# or a delay added to now()) or the system's timers.
MAX_SECONDS = 100 * 365 * 86400
# Every unit, for help texts and errors.
UNITS_TEXT = "ms, s, m, h, d, w"
EXAMPLES = "30s, 5m, 2h, 1d, 1w, 250ms or 1h30m"


def parse_duration(text: str, *, what: str = "duration", age: bool = False) -> float:
    """Seconds in `text`; BadInput with an example when it is not a duration.

    `age`: a bare number is refused (give a unit).
    """
    value = text.strip()
    # what="" when the caller's message names the value already (click's does).
    named = f"{what} " if what else ""
    try:
        seconds = float(value)
    except ValueError:
        seconds = _parse_units(value, text, named, age)
    else:
        if age and math.isfinite(seconds):
            raise BadInput(
                f"{named}{text!r} has no unit: give one of {UNITS_TEXT}, "
                f"e.g. {_number(value)}d for days or {_number(value)}h for hours"
            )
    if seconds < 0 or not math.isfinite(seconds):
        raise BadInput(f"{named}{text!r} is negative or not a number: give a duration")
    if seconds > MAX_SECONDS:
        raise BadInput(f"{named}{text!r} is longer than 100 years (36500d)")
    return seconds


def _number(value: str) -> str:
    return value if value.replace(".", "", 1).isdigit() else "7"


def _parse_units(value: str, text: str, named: str, age: bool) -> float:
    # Upper case reads as lower case but for minutes ("M", "MS", "Ms"...).
    folded = value if "M" in value else value.lower()
    parts = _PART.findall(folded)
    if not parts or "".join(n + u for n, u in parts) != folded:
        if _all_parts(value.lower()):
            raise BadInput(
                f"{named}{text!r} is not a duration: units are case-sensitive for minutes "
                f"(M could be months): write m for minutes, ms for milliseconds"
            )
        seconds = "" if age else ", or a number of seconds"
        raise BadInput(
            f"{named}{text!r} is not a duration: use a number with a unit "
            f"({UNITS_TEXT}), e.g. {EXAMPLES}{seconds}"
        )
    return sum(float(n) * _UNITS[u] for n, u in parts)


def _all_parts(value: str) -> bool:
    parts = _PART.findall(value)
    return bool(parts) and "".join(n + u for n, u in parts) == value
