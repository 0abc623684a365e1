"""The JSON shape of leaseq's records over HTTP, shared by the service and RemoteQueue.

Records travel as JSON objects with the dataclass's field names; times are
ISO 8601 strings. Decoding keeps only the fields the local dataclass knows,
so a newer service can add fields without breaking older clients. This
module imports nothing heavy: the HTTP client depends on it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Iterator
from datetime import date, datetime, timezone
from typing import Any, TypeVar

from ..core.model import Claim, Effect, Event, StreamItem, Task, Worker

T = TypeVar("T")

#: What a token without ``read_payloads`` sees instead of a payload, result or error.
REDACTED = "[redacted]"
#: Task fields hidden from tokens without ``read_payloads``. An idempotency key is
#: often made of the payload ("charge-customer-73519"), so it is hidden like one.
REDACTED_TASK_FIELDS = ("payload", "result", "last_error", "idempotency_key")
#: Keys of event details hidden from tokens without ``read_payloads``. Digests of a
#: payload (an approval's ``digest``, a tool call's ``args_digest``) are unsalted: a
#: small payload is recovered from one by trying candidates, so they are hidden too; a question
#: put to a person (ctx.ask) may quote the payload; what a diverged run recorded and what its
#: code asked for (``recorded``, ``requested``) hold such digests.
REDACTED_DETAIL_KEYS = ("error", "result", "response", "idempotency_key", "digest", "args_digest", "question",
                        "recorded", "requested",
                        # a durable wait's ledger key (suspended, answered, wait_timed_out): made from the
                        # task's idempotency key
                        "key")


#: Types passed through as they are (compared exactly: subclasses such as enums take the slow path).
_PLAIN = frozenset({str, int, float, bool, type(None)})


class _Shape:
    """A dataclass's field names, read once per type: in order for encoding, as a set
    for decoding, and which of them hold times (``at`` or ``*_at``)."""

    __slots__ = ("names", "known", "times", "direct")

    def __init__(self, cls: type):
        fields = dataclasses.fields(cls)
        self.names = tuple(f.name for f in fields)
        self.known = frozenset(self.names)
        self.times = tuple(n for n in self.names if n == "at" or n.endswith("_at"))
        #: whether a complete set of values may fill the record's ``__dict__`` directly
        #: (a frozen dataclass's ``__init__`` sets every field through ``object.__setattr__``)
        self.direct = "__dict__" in dir(cls) and not hasattr(cls, "__post_init__")


#: Each type's shape (None: not a dataclass).
_SHAPES: dict[type, _Shape | None] = {}


def _shape(cls: type) -> _Shape | None:
    try:
        return _SHAPES[cls]
    except KeyError:
        shape = _SHAPES[cls] = _Shape(cls) if dataclasses.is_dataclass(cls) else None
        return shape


def to_json(value: Any) -> Any:
    """``value`` as plain JSON data: dataclasses as objects, datetimes as ISO strings."""
    cls = type(value)
    if cls in _PLAIN:  # most values: checked first, by type alone
        return value
    if cls is datetime:
        return value.isoformat()
    shape = _shape(cls)
    if shape is not None:
        # A claim's task has some thirty fields, most of them plain: test those in line
        # rather than call back in (the hot path of every claim the service answers).
        out = {}
        for name in shape.names:
            item = getattr(value, name)
            out[name] = item if type(item) in _PLAIN else to_json(item)
        return out
    if isinstance(value, dict):
        return {str(k): (v if type(v) in _PLAIN else to_json(v)) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [v if type(v) in _PLAIN else to_json(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (datetime, date)):
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
    if shape is None:
        return cls(**overrides)
    known = shape.known
    kwargs = {key: value for key, value in data.items() if key in known}
    for key in shape.times:
        value = kwargs.get(key)
        if value is not None:
            kwargs[key] = parse_time(value)
    kwargs.update(overrides)
    if shape.direct and len(kwargs) == len(shape.names):
        # Every field is here (the common case: a service of the same version): fill the
        # frozen record directly, as the engine does with a task row.
        record: T = object.__new__(cls)
        record.__dict__.update(kwargs)
        return record
    return cls(**kwargs)  # fields missing (an older service): the dataclass's defaults


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


def stream_item_from(data: dict[str, Any]) -> StreamItem:
    """A :class:`StreamItem` from its JSON form."""
    return _build(StreamItem, data)


# -- server-sent events (GET /v1/tasks/{id}/stream) ------------------------------------

def sse_event(event: str, data: Any, *, event_id: int | None = None) -> str:
    """One server-sent event: its ``id:`` (a stream's cursor), its name and its JSON data on one line."""
    head = "" if event_id is None else f"id: {event_id}\n"
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


class SseReader:
    """Server-sent events from the lines of a response, as ``(event, id, data)``: the data
    decoded from JSON, the id None when the event carries none. Comments and ``retry:`` are
    skipped. Feed it bytes as they arrive (:meth:`feed`); it keeps what is not a whole line."""

    def __init__(self) -> None:
        self._buffer = b""
        self._event = "message"
        self._id: str | None = None
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> Iterator[tuple[str, int | None, Any]]:
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for raw in lines:
            line = raw.decode("utf-8").rstrip("\r")
            if not line:
                if self._data:
                    text = "\n".join(self._data)
                    event_id = int(self._id) if self._id is not None and self._id.isdigit() else None
                    yield self._event, event_id, json.loads(text)
                self._event, self._id, self._data = "message", None, []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                self._event = value
            elif name == "data":
                self._data.append(value)
            elif name == "id":
                self._id = value


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
