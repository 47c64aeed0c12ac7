"""Errors pgqctl raises on purpose.

Each carries the exit code the CLI returns for it and a message that ends
with what to do next. Lower layers raise these; only ``cli.main`` prints them.
"""

from __future__ import annotations

# Exit codes, documented in docs/operating.md (Exit codes).
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_CHECK = 3


class PgqctlError(Exception):
    """An expected failure: one line for the user, no traceback."""

    exit_code = EXIT_FAILURE


class BadInput(PgqctlError, ValueError):
    """The user gave something pgqctl cannot use; nothing was written.

    Also a ValueError, which is what Python callers of the API expect.
    """

    exit_code = EXIT_USAGE


class CheckFailed(PgqctlError):
    """A check ran and said no (for example `migrate --check` with pending work)."""

    exit_code = EXIT_CHECK


class DatabaseUnavailable(PgqctlError):
    """The database could not be reached or refused the connection."""


class NotMigrated(PgqctlError):
    """The queue schema is missing or older than this pgqctl."""


class MigrationError(PgqctlError):
    """Migrations cannot be applied safely (changed file, foreign table...)."""


class NotFound(PgqctlError):
    """A job (or other object) the user named does not exist."""


class EmbeddedError(PgqctlError):
    """The embedded PostgreSQL could not be created, started or stopped."""


class ReadOnlyServer(PgqctlError):
    """The server only reads (a hot standby): writes must go to the primary."""


class PrivilegeMissing(PgqctlError):
    """The role lacks a privilege the command needs; the message names the GRANT."""


class TimedOut(PgqctlError):
    """A statement waited for a lock, or ran, longer than its timeout; the
    message names the session that held it up."""
