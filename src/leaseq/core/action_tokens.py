"""Reference action tokens: the string a worker holds, and the digest the queue keeps.

A reference token is ``"lqt1.<id>.<secret>"``: ``id`` names the row of
``leaseq_action_tokens`` holding its claims (so a check is a primary-key
lookup), ``secret`` is 32 random bytes (``secrets.token_urlsafe(32)``). The
queue stores only the SHA-256 of the secret, written by the
``mint_action_token`` query under the lease guard; nothing outside the
database can make a row, and nothing that reads the table learns a token.
A downstream service checks a token online (``verify_action_token``,
:class:`leaseq.fencing.QueueVerifier`).
"""

from __future__ import annotations

import hashlib
import re
import secrets

#: The prefix of every reference token (its format's version).
PREFIX = "lqt1"
_TOKEN = re.compile(r"lqt1\.([1-9][0-9]{0,18})\.([A-Za-z0-9_-]{43})")


def new_secret() -> str:
    """A fresh secret: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def digest(secret: str) -> str:
    """The SHA-256 of a secret, hex: all the queue keeps of a token."""
    return hashlib.sha256(secret.encode("ascii")).hexdigest()


def format_token(token_id: int, secret: str) -> str:
    """The token string of row ``token_id`` with ``secret``."""
    return f"{PREFIX}.{token_id}.{secret}"


def is_reference(token: object) -> bool:
    """Whether ``token`` looks like a reference token (an HMAC token does not)."""
    return isinstance(token, str) and token.startswith(PREFIX + ".")


def parse(token: object) -> tuple[int, str] | None:
    """The row id and the secret's digest of a well-formed reference token, else None."""
    if not isinstance(token, str):
        return None
    m = _TOKEN.fullmatch(token)
    if m is None:
        return None
    return int(m.group(1)), digest(m.group(2))
