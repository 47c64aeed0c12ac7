"""pgqctl: run and administer a job queue stored in one PostgreSQL table."""

from __future__ import annotations

__version__ = "0.1.0"
