"""Who may look: the address the page binds, and the token it asks for.

Without a token the page binds only a loopback address, reachable from this
machine alone. With one (from the environment or a file, never from the
command line, where `ps` shows it to every user), every request but the
health check must carry it: as a bearer token, or as the password of HTTP
basic authentication (the browser asks for it; any user name).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import secrets
from collections.abc import Mapping
from pathlib import Path

from pgqctl.errors import BadInput

TOKEN_ENV = "PGQCTL_WEB_TOKEN"
# A token shorter than this is refused: it could be guessed.
MIN_TOKEN_CHARS = 16


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def loopback_host(header: str) -> bool:
    """Whether a request's Host header names this machine (`localhost:8080`,
    `127.0.0.1:8080`, `[::1]:8080`)."""
    bracketed = header.startswith("[")  # an IPv6 address
    name = header[1:].partition("]")[0] if bracketed else header.partition(":")[0]
    return is_loopback(name.lower())


def read_token(environ: Mapping[str, str], token_file: Path | None) -> str | None:
    """The token from `token_file` (its first line), else from the
    environment; None for none. A token too short to be safe is refused."""
    if token_file is not None:
        try:
            lines = token_file.read_text().splitlines()
        except OSError as exc:
            raise BadInput(f"cannot read --token-file {token_file}: {exc.strerror}") from exc
        token = lines[0].strip() if lines else ""
        where = f"--token-file {token_file}"
    else:
        token = environ.get(TOKEN_ENV, "").strip()
        where = TOKEN_ENV
        if not token:
            return None
    if len(token) < MIN_TOKEN_CHARS:
        raise BadInput(
            f"the token in {where} is shorter than {MIN_TOKEN_CHARS} characters: "
            "use a longer one, e.g. from `openssl rand -hex 32`"
        )
    return token


def check_bind(host: str, token: str | None) -> None:
    """Refuse to serve a non-loopback address without a token."""
    if token is None and not is_loopback(host):
        raise BadInput(
            f"pgqctl web serves {host} only with a token: set {TOKEN_ENV} or "
            "--token-file FILE (or bind 127.0.0.1 and reach it through a tunnel)"
        )


def authorized(token: str | None, authorization: str | None) -> bool:
    """Whether a request's Authorization header carries `token` (always, when
    no token is set)."""
    if token is None:
        return True
    if not authorization:
        return False
    scheme, _, value = authorization.partition(" ")
    given = ""
    if scheme.lower() == "bearer":
        given = value.strip()
    elif scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return False
        given = decoded.partition(":")[2]
    return secrets.compare_digest(given.encode(), token.encode())


def actor(authorization: str | None, client: str) -> str:
    """Who asked for an action, as the record keeps it: the user name given
    to basic authentication (the token is shared: the name is what each
    person says they are) or `token` for a bearer token, `local` without a
    token, then the address the request came from. Never the token."""
    scheme, _, value = (authorization or "").partition(" ")
    name = "local"
    if scheme.lower() == "bearer":
        name = "token"
    elif scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            decoded = ""
        name = decoded.partition(":")[0].strip()[:64] or "basic"
    return f"{name}@{client}"
