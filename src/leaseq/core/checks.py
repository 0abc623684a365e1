"""Input checks, retry maths and error fingerprints. Pure functions, no I/O.

The recovery routing itself (what an expired lease turns into) lives in SQL,
in the ``route_expired`` query of each backend, so that two racing claimers
can never disagree about it.
"""

from __future__ import annotations

import enum
import hashlib
import json
import random
import re
from typing import Any

from .errors import InvalidInput
from .model import EffectKind, Status

#: Largest accepted payload or result, as UTF-8 JSON.
MAX_PAYLOAD_BYTES = 1024 * 1024
#: Deepest accepted nesting of arrays and objects in a payload or result: what
#: Python's json reads back under its default recursion limit, with room for
#: the reader's own stack. Checked explicitly, not left to the recursion limit
#: of the process that writes it (an application may have raised it): a deeper
#: document would be stored, and then fail every default reader.
MAX_JSON_DEPTH = 900
#: Longest accepted lease, in seconds (one week).
MAX_LEASE_SECONDS = 7 * 24 * 3600.0
#: Default lease when neither the task nor the claim names one.
DEFAULT_LEASE_SECONDS = 30.0
#: Failures in a row with the same fingerprint that quarantine a task early.
DEFAULT_MAX_SAME_ERROR = 3
#: Retry backoff: base * 2**(attempt-1), capped, with full jitter on the upper half.
BACKOFF_BASE_SECONDS = 1.0
BACKOFF_CAP_SECONDS = 3600.0

# Matched whole (fullmatch): with re.match, "$" also matches before a final
# newline, and "default\n" would pass as a name distinct from "default".
_NAME = re.compile(r"[A-Za-z0-9_.:\-]{1,100}")
_KEY_MAX = 255
_TEXT_MAX = 10_000


def check_name(field: str, value: Any) -> str:
    """A queue or worker name: 1-100 of letters, digits and ``_ . : -``."""
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise InvalidInput(field, f"must be 1-100 characters of letters, digits, '_', '.', ':' or '-' (got {value!r})")
    return value


_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")
# An escaped NUL (\u0000 not preceded by an odd run of backslashes) in JSON text.
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def check_storable(field: str, value: str) -> str:
    """Text both databases can store: no NUL character, no lone surrogate."""
    if "\x00" in value:
        raise InvalidInput(field, "must not contain a NUL character")
    if _LONE_SURROGATE.search(value):
        raise InvalidInput(field, "must be valid Unicode (it holds a lone surrogate)")
    return value


def check_kind(value: Any, field: str = "kind") -> str:
    """A task kind (or an effect's action): a non-empty string of at most 200 characters."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(field, "must be a non-empty string")
    if len(value) > 200:
        raise InvalidInput(field, "must be at most 200 characters")
    return check_storable(field, value)


def _check_member(field: str, enum_type: type[enum.Enum], value: Any) -> str:
    try:
        return str(enum_type(value).value)
    except ValueError:
        allowed = ", ".join(e.value for e in enum_type)
        raise InvalidInput(field, f"must be one of {allowed} (got {value!r})") from None


def check_effect(value: Any) -> str:
    """One of ``read_only``, ``idempotent``, ``side_effect``."""
    return _check_member("effect", EffectKind, value)


def check_status(value: Any) -> str:
    """One of the task statuses."""
    return _check_member("status", Status, value)


#: json.dumps(allow_nan=False) without building an encoder at every call
_STRICT_JSON = json.JSONEncoder(allow_nan=False)


def check_json(field: str, value: Any) -> Any:
    """A JSON-serialisable value no larger than :data:`MAX_PAYLOAD_BYTES`."""
    if value is None or value is True or value is False or (type(value) is int and -2**63 <= value < 2**63):
        return value  # nothing to check (the common result of a task)
    encode_json(field, value)
    return value


def parse_json_text(field: str, text: str) -> Any:
    """A JSON document typed by a person (a CLI option, a dashboard field); bad JSON names ``field``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(field, f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except RecursionError:
        raise InvalidInput(field, "nested too deeply to be read") from None


def encode_json(field: str, value: Any) -> str:
    """``value`` as JSON text, after the checks of :func:`check_json`."""
    try:
        encoded = _STRICT_JSON.encode(value)
    except RecursionError:
        raise InvalidInput(field, f"is nested too deeply (at most {MAX_JSON_DEPTH} levels)") from None
    except (TypeError, ValueError) as exc:
        raise InvalidInput(field, f"must be JSON-serialisable ({exc})") from None
    if encoded.count("[") + encoded.count("{") > MAX_JSON_DEPTH and _deeper_than(value, MAX_JSON_DEPTH):
        raise InvalidInput(field, f"is nested too deeply (at most {MAX_JSON_DEPTH} levels)")
    if "\\u0000" in encoded and _JSON_NUL.search(encoded):
        raise InvalidInput(field, "must not contain a NUL character (PostgreSQL cannot store it)")
    if "\\ud" in encoded:  # a surrogate escape: valid only as half of a pair
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidInput(field, "must be valid Unicode (it holds a lone surrogate)") from None
    if len(encoded) > MAX_PAYLOAD_BYTES:  # ASCII: one byte a character
        raise InvalidInput(field, f"is larger than the {MAX_PAYLOAD_BYTES} byte limit")
    return encoded


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether arrays and objects nest more than ``limit`` deep in ``value`` (walked
    without recursion; only where the text holds more brackets than ``limit``)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        inner = item.values() if isinstance(item, dict) else item
        stack.extend((x, depth + 1) for x in inner if isinstance(x, (dict, list, tuple)))
    return False


def check_int(field: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer (not a bool) within bounds."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInput(field, f"must be an integer (got {value!r})")
    if minimum is not None and value < minimum:
        raise InvalidInput(field, f"must be at least {minimum} (got {value})")
    if maximum is not None and value > maximum:
        raise InvalidInput(field, f"must be at most {maximum} (got {value})")
    return value


def check_seconds(field: str, value: Any, *, allow_zero: bool, maximum: float = MAX_LEASE_SECONDS) -> float:
    """A finite number of seconds, positive (or zero when allowed), within ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        raise InvalidInput(field, f"must be a number of seconds (got {value!r})")
    if value < 0 or (value == 0 and not allow_zero):
        raise InvalidInput(field, f"must be {'at least 0' if allow_zero else 'greater than 0'} (got {value})")
    if value > maximum:
        raise InvalidInput(field, f"must be at most {maximum:g} seconds (got {value})")
    return float(value)


def check_key(field: str, value: Any) -> str:
    """An idempotency key: a non-empty string of at most 255 characters."""
    if not isinstance(value, str) or not value:
        raise InvalidInput(field, "must be a non-empty string")
    if len(value) > _KEY_MAX:
        raise InvalidInput(field, f"must be at most {_KEY_MAX} characters")
    return check_storable(field, value)


#: A W3C traceparent: version, trace id, parent (span) id, flags, in lowercase hex.
_TRACEPARENT = re.compile(r"(?P<version>[0-9a-f]{2})-(?P<trace>[0-9a-f]{32})-(?P<span>[0-9a-f]{16})-[0-9a-f]{2}")


def parse_traceparent(value: Any) -> str | None:
    """``value`` if it is a valid W3C traceparent (version 00, or a later one's first four fields), else None.

    As the W3C Trace Context rules say of a received header: an invalid one is
    ignored, and all-zero trace or span ids and version ff are invalid."""
    if not isinstance(value, str) or len(value) > 512:
        return None
    text = value.strip()
    m = _TRACEPARENT.match(text)
    if m is None or m["version"] == "ff" or m["trace"] == "0" * 32 or m["span"] == "0" * 16:
        return None
    if m["version"] == "00" and len(text) != 55:
        return None
    if m["version"] != "00" and len(text) > 55 and text[55] != "-":
        return None
    return text[:55]


def check_trace_context(field: str, value: Any) -> str | None:
    """A W3C traceparent to store with a task, or None."""
    if value is None:
        return None
    parsed = parse_traceparent(value)
    if parsed is None:
        raise InvalidInput(field, "must be a W3C traceparent, '00-<32 hex trace id>-<16 hex span id>-<2 hex flags>' "
                                  f"(got {str(value)[:80]!r})")
    return parsed


def check_text(field: str, value: Any, *, required: bool = False) -> str | None:
    """Free text (an error, a reason, a note) of at most 10,000 characters."""
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value.strip()):
        raise InvalidInput(field, "must be a non-empty string" if required else "must be a string")
    if len(value) > _TEXT_MAX:
        raise InvalidInput(field, f"must be at most {_TEXT_MAX} characters")
    return check_storable(field, value)


def check_task_id(value: Any, field: str = "task_id") -> int:
    """A task id: a positive integer (a digit string is accepted, for the CLI)."""
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value > 2**63 - 1:
        raise InvalidInput(field, f"must be a positive integer (got {value!r})")
    return value


def backoff_seconds(attempt: int, *, base: float = BACKOFF_BASE_SECONDS, cap: float = BACKOFF_CAP_SECONDS,
                    rng: random.Random | None = None) -> float:
    """Delay before retry number ``attempt`` (1-based): exponential, capped, jittered.

    The delay lies in ``[d/2, d]`` where ``d = min(cap, base * 2**(attempt-1))``,
    so retries spread out without ever collapsing to zero.
    """
    attempt = max(1, attempt)
    ceiling = min(cap, base * 2.0 ** min(attempt - 1, 62))
    r = rng.random() if rng is not None else random.random()
    return ceiling / 2 + r * ceiling / 2


_VOLATILE = re.compile(r"0x[0-9a-fA-F]+|\b[0-9a-fA-F]{8}-[0-9a-fA-F-]{27,}\b|\d+")


def error_fingerprint(error: str) -> str:
    """A short hash of an error's first line with numbers, ids and addresses blanked.

    Two failures with the same fingerprint are "the same error" for the
    repeated-failure rule, even when they quote different ids or timings.
    """
    first = (error or "").strip().splitlines()[0] if (error or "").strip() else ""
    normal = _VOLATILE.sub("#", first)
    return hashlib.sha256(normal.encode()).hexdigest()[:16]
