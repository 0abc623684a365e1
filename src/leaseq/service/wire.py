"""The JSON shape of leaseq's records over HTTP, shared by the service and RemoteQueue.

Records travel as JSON objects with the dataclass's field names; times are
ISO 8601 strings. Decoding keeps only the fields the local dataclass knows,
so a newer service can add fields without breaking older clients. This
module imports nothing heavy: the HTTP client depends on it.
"""

from __future__ import annotations

import dataclasses
import enum
from datetime import date, datetime, timezone
from typing import Any, TypeVar

from ..core.model import Claim, Effect, Event, Task, Worker

T = TypeVar("T")

#: What a token without ``read_payloads`` sees instead of a payload, result or error.
REDACTED = "[redacted]"
#: Task fields hidden from tokens without ``read_payloads``.
REDACTED_TASK_FIELDS = ("payload", "result", "last_error")
#: Keys of event details hidden from tokens without ``read_payloads``.
REDACTED_DETAIL_KEYS = ("error", "result", "response")


#: Types passed through as they are (compared exactly: subclasses such as enums take the slow path).
_PLAIN = frozenset({str, int, float, bool, type(None)})


#: Each type's dataclass field names, in order and as a set (None: not a dataclass).
_SHAPES: dict[type, tuple[tuple[str, ...], frozenset[str]] | None] = {}


def _shape(cls: type) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """``cls``'s field names, read once per type: in order for encoding, as a set for decoding."""
    try:
        return _SHAPES[cls]
    except KeyError:
        names = tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None
        shape = _SHAPES[cls] = None if names is None else (names, frozenset(names))
        return shape


def to_json(value: Any) -> Any:
    """``value`` as plain JSON data: dataclasses as objects, datetimes as ISO strings."""
    cls = type(value)
    if cls in _PLAIN:  # most values: checked first, by type alone
        return value
    shape = _shape(cls)
    if shape is not None:
        return {name: to_json(getattr(value, name)) for name in shape[0]}
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_json(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return value


def record_json(record: Any) -> dict[str, Any]:
    """A record (a dataclass: a task, an event, an effect...) as a JSON object (see :func:`to_json`)."""
    data: dict[str, Any] = to_json(record)
    return data


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 string (or epoch seconds) as an aware datetime; None stays None."""
    if value is None or isinstance(value, datetime):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, tz=timezone.utc)
    return datetime.fromisoformat(value)


def _build(cls: type[T], data: dict[str, Any], **overrides: Any) -> T:
    shape = _shape(cls)
    known = shape[1] if shape is not None else frozenset()
    kwargs = {}
    for key, value in data.items():
        if key in known:
            kwargs[key] = parse_time(value) if value is not None and (key == "at" or key.endswith("_at")) else value
    kwargs.update(overrides)
    return cls(**kwargs)


def task_from(data: dict[str, Any]) -> Task:
    """A :class:`Task` from its JSON form."""
    return _build(Task, data)


def claim_from(data: dict[str, Any]) -> Claim:
    """A :class:`Claim` (with its task) from its JSON form."""
    return _build(Claim, data, expires_at=parse_time(data["expires_at"]), task=task_from(data["task"]))


def effect_from(data: dict[str, Any]) -> Effect:
    """An :class:`Effect` from its JSON form."""
    return _build(Effect, data)


def worker_from(data: dict[str, Any]) -> Worker:
    """A :class:`Worker` from its JSON form."""
    return _build(Worker, data)


def event_from(data: dict[str, Any]) -> Event:
    """An :class:`Event` from its JSON form."""
    return _build(Event, data)


def redact_task(data: dict[str, Any]) -> dict[str, Any]:
    """A task's JSON form with payload, result and error hidden."""
    out = dict(data)
    for key in REDACTED_TASK_FIELDS:
        if out.get(key) is not None:
            out[key] = REDACTED
    return out


def redact_detail(detail: dict[str, Any]) -> dict[str, Any]:
    """An event's detail with errors, results and responses hidden."""
    return {k: (REDACTED if k in REDACTED_DETAIL_KEYS and v is not None else v) for k, v in detail.items()}
