"""Signed action tokens: the queue vouches for one action of one attempt.

A token is ``base64url(payload) + "." + base64url(HMAC-SHA256(secret, …))``
with no padding. The payload is compact JSON naming the key id, the task,
the claim generation (and the lease epoch of its claim, when not 0), the
action, the idempotency key, the resource when the effect named one, when it was issued and when it expires (Unix
milliseconds). A downstream service holding the same secrets checks it
without any database access::

    signer = ActionSigner.from_env()           # LEASEQ_ACTION_KEYS="k2:…,k1:…"
    claims = signer.verify(token, action="email.send", idempotency_key=key,
                           resource="user:7", leeway_seconds=1.0)

Lifetime. The queue never lets a token outlive the lease it was issued
under: its expiry is the earlier of ``action_token_ttl`` and the lease
deadline (the database's clock). A worker that pauses past its lease holds
an expired token, so a service refuses its write even before the worker
that recovered the task has written anything. While the lease is renewed,
the worker's runtime re-issues the token from the new deadline
(``fx.token`` is always current). The verifier's ``leeway_seconds``
tolerates skew between the queue database's clock and the service's;
keep it small (the middleware's default is 1 second), since it is also
how long a paused worker's token outlives its lease.

Lease authority stays separate from tool authority. Holding a lease lets a
worker act on its task in the queue; a token lets it ask for one named
action, under one idempotency key, for one attempt (task and generation),
until it expires. It is not a credential for the downstream system as a
whole: the service still applies its own permissions, and a token for
``email.send`` is refused for ``email.delete`` (:class:`FencingMiddleware`
takes each request's action from its route, ``actions=``). A token may be presented
again within its lifetime (a retry of the same action); pair it with the
idempotency key and the fencing token (``claims.generation``) so a retry is
replayed rather than repeated, and a superseded attempt is refused.

Rotation: sign with the current key, verify with every key still listed.
Put a new key first in ``LEASEQ_ACTION_KEYS`` on the queue and the services,
keep the old one listed for at least the longest token lifetime, then drop it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.errors import ConfigError, InvalidInput
from ..core.model import format_fencing_token
from .errors import InvalidActionToken

#: The environment variable :meth:`ActionSigner.from_env` reads.
ENV_VAR = "LEASEQ_ACTION_KEYS"
#: Shortest secret accepted (HMAC-SHA256 wants 32 bytes; 16 is the floor).
MIN_SECRET_BYTES = 16
#: Longest token string looked at; anything longer is malformed.
MAX_TOKEN_LENGTH = 4096
#: 2: times in milliseconds, optional resource (version 1 tokens are refused as malformed).
TOKEN_VERSION = 2

_KEY_ID = re.compile(r"[A-Za-z0-9._-]{1,64}")
_B64URL = re.compile(r"[A-Za-z0-9_-]*")
# Bound into every MAC so a secret shared with another HMAC format cannot
# be used to forge action tokens from it, or the reverse.
_DOMAIN = b"leaseq-action-token-v2."


@dataclass(frozen=True)
class ActionClaims:
    """What a verified token authorises: one action of one attempt of one task."""

    key_id: str
    task_id: int
    #: The claim generation of the attempt.
    generation: int
    action: str
    idempotency_key: str
    #: Unix seconds (millisecond precision).
    issued_at: float
    #: Unix seconds (millisecond precision); the token is refused from this
    #: instant on (plus the verifier's leeway). Never later than the lease
    #: deadline the token was issued under.
    expires_at: float
    #: The resource the effect named (``ctx.effect(..., resource=…)``), or None.
    resource: str | None = None
    #: The lease epoch of the attempt's claim (:attr:`leaseq.Claim.epoch`; 0 on SQLite).
    epoch: int = 0

    @property
    def fencing_token(self) -> str:
        """The attempt's fencing token, ``"<task_id>.<epoch>.<generation>"`` (``"<task_id>.<generation>"``
        when the epoch is 0), for :meth:`FencedStore.apply`."""
        return format_fencing_token(self.task_id, self.generation, self.epoch)


def _b64encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _b64decode(text: str) -> bytes:
    """Strict base64url without padding; raises ValueError on any other spelling.

    The re-encoding check matters: the last character of a base64 string has
    unused low bits, so without it two different tokens could decode to the
    same MAC and a changed character would go unnoticed.
    """
    if not _B64URL.fullmatch(text) or len(text) % 4 == 1:
        raise ValueError("not base64url")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64encode(data) != text:
        raise ValueError("not canonical base64url")
    return data


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ActionSigner:
    """Issues and verifies action tokens with HMAC-SHA256 keys named by key id.

    ``keys`` maps key ids (letters, digits, ``.``, ``_``, ``-``) to secrets
    of at least 16 random bytes; ``current_key_id`` signs new tokens, and
    every key in ``keys`` verifies.
    """

    def __init__(self, keys: Mapping[str, bytes], current_key_id: str):
        if not isinstance(keys, Mapping) or not keys:
            raise ConfigError("keys: need at least one key id and secret")
        checked: dict[str, bytes] = {}
        for kid, secret in keys.items():
            if not isinstance(kid, str) or not _KEY_ID.fullmatch(kid):
                raise ConfigError(f"keys: key id {kid!r} must be 1-64 letters, digits, '.', '_' or '-'")
            if not isinstance(secret, (bytes, bytearray)) or len(secret) < MIN_SECRET_BYTES:
                raise ConfigError(f"keys: the secret of key {kid!r} must be at least {MIN_SECRET_BYTES} bytes")
            checked[kid] = bytes(secret)
        if current_key_id not in checked:
            raise ConfigError(f"current_key_id: {current_key_id!r} is not one of the keys {sorted(checked)}")
        self._keys = checked
        self.current_key_id = current_key_id

    def __repr__(self) -> str:  # never show secrets
        return f"ActionSigner(current_key_id={self.current_key_id!r}, key_ids={self.key_ids!r})"

    @property
    def key_ids(self) -> tuple[str, ...]:
        """Every key id that verifies, the current one first."""
        return (self.current_key_id, *(k for k in self._keys if k != self.current_key_id))

    @classmethod
    def from_env(cls, var: str = ENV_VAR, environ: Mapping[str, str] | None = None) -> ActionSigner:
        """A signer from ``$LEASEQ_ACTION_KEYS``: ``kid:base64secret,kid2:base64secret``.

        The first key signs; all verify. Secrets are standard or URL-safe
        base64, padding optional. A missing or malformed value raises
        :class:`leaseq.ConfigError` naming the variable and the entry (never
        the secret).
        """
        env = os.environ if environ is None else environ
        raw = env.get(var, "")
        example = f"{var}=kid:base64secret[,kid2:base64secret] (e.g. k1:{cls.generate_secret()})"
        if not raw.strip():
            raise ConfigError(f"{var}: not set; expected {example}")
        keys: dict[str, bytes] = {}
        for index, entry in enumerate(raw.split(","), start=1):
            kid, sep, encoded = entry.strip().partition(":")
            kid, encoded = kid.strip(), encoded.strip()
            where = f"{var}: entry {index}"
            if not sep or not kid or not encoded:
                raise ConfigError(f"{where} is not kid:base64secret; expected {example}")
            if not _KEY_ID.fullmatch(kid):
                raise ConfigError(f"{where}: key id {kid!r} must be 1-64 letters, digits, '.', '_' or '-'")
            if kid in keys:
                raise ConfigError(f"{where}: key id {kid!r} is listed twice")
            try:
                normal = encoded.replace("-", "+").replace("_", "/").rstrip("=")
                secret = base64.b64decode(normal + "=" * (-len(normal) % 4), validate=True)
            except (binascii.Error, ValueError):
                raise ConfigError(f"{where}: the secret of key {kid!r} is not valid base64") from None
            if len(secret) < MIN_SECRET_BYTES:
                raise ConfigError(f"{where}: the secret of key {kid!r} is {len(secret)} bytes; "
                                  f"use at least {MIN_SECRET_BYTES} (32 recommended)")
            keys[kid] = secret
        return cls(keys, next(iter(keys)))

    @staticmethod
    def generate_secret() -> str:
        """A fresh 32-byte secret, base64-encoded for ``LEASEQ_ACTION_KEYS``."""
        return base64.b64encode(secrets.token_bytes(32)).decode("ascii")

    def issue(self, task_id: int, generation: int, action: str, idempotency_key: str,
              ttl_seconds: float, *, resource: str | None = None, not_after: float | None = None,
              now: float | None = None, epoch: int = 0) -> str:
        """A token letting attempt ``generation`` of task ``task_id`` perform ``action``.

        The token expires ``ttl_seconds`` after ``now`` (default: the clock),
        or at ``not_after`` (Unix seconds: the lease deadline) if that is
        earlier, in whole milliseconds rounded down. ``resource``, when
        given, binds the token to that resource key. ``epoch``: the lease
        epoch of the attempt's claim (written into the token when not 0).
        """
        for field, value in (("task_id", task_id), ("generation", generation), ("epoch", epoch)):
            if not _is_int(value) or value < 0:
                raise InvalidInput(field, f"must be a non-negative integer, not {value!r}")
        for field, text in (("action", action), ("idempotency_key", idempotency_key)):
            if not isinstance(text, str) or not text:
                raise InvalidInput(field, "must be a non-empty string")
        if resource is not None and (not isinstance(resource, str) or not resource):
            raise InvalidInput("resource", "must be a non-empty string or None")
        if (isinstance(ttl_seconds, bool) or not isinstance(ttl_seconds, (int, float))
                or not math.isfinite(ttl_seconds) or ttl_seconds <= 0):
            raise InvalidInput("ttl_seconds", f"must be a positive number of seconds, not {ttl_seconds!r}")
        now = time.time() if now is None else now
        expires = now + ttl_seconds if not_after is None else min(now + ttl_seconds, not_after)
        payload = {"v": TOKEN_VERSION, "kid": self.current_key_id, "task": task_id, "gen": generation,
                   "act": action, "key": idempotency_key,
                   "iat": math.floor(now * 1000), "exp": math.floor(expires * 1000)}
        if resource is not None:
            payload["res"] = resource
        if epoch:
            payload["ep"] = epoch
        body = _b64encode(json.dumps(payload, separators=(",", ":"), sort_keys=True).encode("utf-8"))
        if len(body) + 44 > MAX_TOKEN_LENGTH:
            raise InvalidInput("action", f"the token would exceed {MAX_TOKEN_LENGTH} characters; "
                               "shorten the action, idempotency key or resource")
        return f"{body}.{_b64encode(self._mac(self._keys[self.current_key_id], body))}"

    def verify(self, token: str, *, action: str | None = None, idempotency_key: str | None = None,
               generation: int | None = None, task_id: int | None = None, resource: str | None = None,
               now: float | None = None, leeway_seconds: float = 0.0) -> ActionClaims:
        """The claims of ``token`` if it is genuine, unexpired and in scope.

        Checks, in order: the shape (``malformed``), the key id (``unknown_key``:
        a retired key no longer verifies), the MAC in constant time
        (``forged``), expiry against ``now`` minus ``leeway_seconds`` for clock
        skew (``expired``), then each scope given: ``action``
        (``wrong_action``), ``idempotency_key`` (``wrong_idempotency_key``),
        ``generation`` (``wrong_generation``), ``task_id`` (``wrong_task``),
        ``resource`` (``wrong_resource``: the token names another resource;
        a token naming none passes). Any failure raises
        :class:`InvalidActionToken` with that ``reason``.
        """
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH:
            raise InvalidActionToken("malformed", "not a token string")
        body, sep, signature = token.partition(".")
        if not sep or "." in signature:
            raise InvalidActionToken("malformed", "expected payload.signature")
        try:
            payload = json.loads(_b64decode(body))
            mac = _b64decode(signature)
        except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            raise InvalidActionToken("malformed", "not base64url-encoded JSON") from None
        kid = payload.get("kid") if isinstance(payload, dict) else None
        if not isinstance(kid, str):
            raise InvalidActionToken("malformed", "no key id")
        secret = self._keys.get(kid)
        if secret is None:
            raise InvalidActionToken("unknown_key", f"key id {kid!r} is not (or no longer) configured")
        if not hmac.compare_digest(mac, self._mac(secret, body)):
            raise InvalidActionToken("forged", "the signature does not match")
        claims = self._claims(payload)
        now = time.time() if now is None else now
        if now >= claims.expires_at + leeway_seconds:
            raise InvalidActionToken("expired", f"expired at {claims.expires_at}")
        if action is not None and claims.action != action:
            raise InvalidActionToken("wrong_action", f"issued for {claims.action!r}, not {action!r}")
        if idempotency_key is not None and claims.idempotency_key != idempotency_key:
            raise InvalidActionToken("wrong_idempotency_key", "issued for another idempotency key")
        if generation is not None and claims.generation != generation:
            raise InvalidActionToken("wrong_generation",
                                     f"issued for generation {claims.generation}, not {generation}")
        if task_id is not None and claims.task_id != task_id:
            raise InvalidActionToken("wrong_task", f"issued for task {claims.task_id}, not task {task_id}")
        if resource is not None and claims.resource is not None and claims.resource != resource:
            raise InvalidActionToken("wrong_resource",
                                     f"issued for resource {claims.resource!r}, not {resource!r}")
        return claims

    @staticmethod
    def _mac(secret: bytes, body: str) -> bytes:
        return hmac.new(secret, _DOMAIN + body.encode("ascii"), hashlib.sha256).digest()

    @staticmethod
    def _claims(payload: dict[str, Any]) -> ActionClaims:
        # Genuine tokens always pass; this guards against a key shared with
        # a different issuer that signs other shapes.
        ints = ("task", "gen", "iat", "exp")
        if (payload.get("v") != TOKEN_VERSION or not all(_is_int(payload.get(k)) for k in ints)
                or not all(isinstance(payload.get(k), str) for k in ("act", "key"))
                or not isinstance(payload.get("res", ""), str) or not _is_int(payload.get("ep", 0))):
            raise InvalidActionToken("malformed", "the payload does not name task, generation, action, "
                                     "idempotency key and expiry")
        return ActionClaims(key_id=payload["kid"], task_id=payload["task"], generation=payload["gen"],
                            action=payload["act"], idempotency_key=payload["key"],
                            issued_at=payload["iat"] / 1000, expires_at=payload["exp"] / 1000,
                            resource=payload.get("res"), epoch=payload.get("ep", 0))
