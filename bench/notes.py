"""Why a lead ratio falls short, and what would close it: the closing note.

Keyed by ratio name; printed only for a ratio whose median misses its target
in the run being reported. Written from measurements, and revised when the
figures move.
"""

from __future__ import annotations

NO_ANALYSIS = "no analysis recorded for this shortfall yet: profile it before quoting the figure."

SHORTFALLS: dict[str, str] = {}
