"""Questions put to a person (``ctx.ask``), as the JSON API and the dashboard show them.

:func:`present_ask` redacts a question for a token that may not read payloads
(a question may quote the task's data). :func:`form_of` builds the dashboard's
answer form from a question's JSON schema: a field for each string, number,
integer, boolean or enum property of an object (or one for a scalar answer),
and a JSON text area for anything else; :func:`answer_from_form` turns a
posted form back into the JSON answer, which :meth:`leaseq.Queue.answer` then
checks against the schema, as it checks any answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from .. import access
from ..access import Principal
from ..core import answers, checks
from ..core.errors import InvalidInput
from ..queue import Queue
from .wire import REDACTED, to_json


def present_ask(ask: dict[str, Any], principal: Principal) -> dict[str, Any]:
    """An open question as JSON, its text and key redacted unless the token may read payloads."""
    data: dict[str, Any] = to_json(ask)
    data["schema_summary"] = answers.summary(ask["schema"])
    if not principal.read_payloads:
        for key in ("question", "key"):
            if data.get(key) is not None:
                data[key] = REDACTED
    return data


def readable_asks(q: Queue, principal: Principal, *, queue: str | None = None,
                  limit: int = 100) -> list[dict[str, Any]]:
    """The open questions, oldest first, of the queues ``principal`` may read."""
    queues = access.readable_queues(principal, queue)
    if queues is None:
        return q.asks(limit=limit)
    found = [a for name in queues for a in q.asks(queue=name, limit=limit)]
    return sorted(found, key=lambda a: (a["asked_at"], a["task_id"]))[:limit]


@dataclass(frozen=True)
class FormField:
    """One input of an answer form."""

    #: the property's name; "" for a scalar answer (the form's one field)
    name: str
    #: text, number, integer, boolean, choice
    kind: str
    label: str
    required: bool
    #: for a choice: (value as JSON text, label)
    choices: tuple[tuple[str, str], ...] = ()
    help: str = ""
    default: str = ""

    @property
    def input_name(self) -> str:
        return f"field.{self.name}" if self.name else "field"


@dataclass(frozen=True)
class AnswerForm:
    """The answer form of a question: its fields, or (``fields`` is None) a JSON text area."""

    fields: tuple[FormField, ...] | None
    summary: str


def _field(schema: dict[str, Any], name: str, node: Any, required: bool) -> FormField | None:
    inner, nullable = answers.optional_inner(schema, node)
    if not isinstance(inner, dict):
        return None
    title = str(inner.get("title") or (node.get("title") if isinstance(node, dict) else None) or name or "answer")
    help_text = str(inner.get("description") or (node.get("description") if isinstance(node, dict) else "") or "")
    default = node.get("default", inner.get("default")) if isinstance(node, dict) else None
    shown = "" if default is None else default if isinstance(default, str) else json.dumps(default)
    needed = required and not nullable
    if "enum" in inner:
        values = inner["enum"]
        if not all(isinstance(v, (str, int, float)) and not isinstance(v, bool) for v in values):
            return None
        return FormField(name, "choice", title, needed, tuple((json.dumps(v), str(v)) for v in values), help_text,
                         "" if default is None else json.dumps(default))
    kind = inner.get("type")
    if kind in ("string", "number", "integer", "boolean") and set(inner) <= (
            answers.ANNOTATIONS | {"type", "minLength", "maxLength", "pattern", "minimum", "maximum",
                                   "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}):
        return FormField(name, "text" if kind == "string" else str(kind), title, needed, (), help_text, shown)
    return None


def form_of(schema: dict[str, Any]) -> AnswerForm:
    """The dashboard's form for an answer of ``schema``."""
    summary = answers.summary(schema)
    root = answers.resolve(schema, schema)
    if isinstance(root, dict) and root.get("type") == "object" and isinstance(root.get("properties"), dict) \
            and root["properties"] and root.get("additionalProperties", False) in (True, False):
        required = set(root.get("required", ()))
        fields = [_field(schema, name, node, name in required) for name, node in root["properties"].items()]
        if all(f is not None for f in fields) and not (set(required) - set(root["properties"])):
            return AnswerForm(tuple(f for f in fields if f is not None), summary)
        return AnswerForm(None, summary)
    scalar = _field(schema, "", root, True)
    return AnswerForm((scalar,) if scalar is not None else None, summary)


def answer_from_form(schema: dict[str, Any], form: dict[str, str]) -> Any:
    """The JSON answer a posted form gives (``field.<name>`` inputs, or ``json``); a value that is
    not a number where one was asked for names its field (:class:`InvalidInput`)."""
    shape = form_of(schema)
    if shape.fields is None:
        return checks.parse_json_text("answer", form.get("json", ""))
    out: dict[str, Any] = {}
    for f in shape.fields:
        field = f"answer.{f.name}" if f.name else "answer"
        raw = form.get(f.input_name)
        if f.kind == "boolean":
            value: Any = raw is not None and raw not in ("", "false", "off")
        elif raw is None or raw == "":
            if f.kind == "text" and f.required:
                value = ""
            else:
                continue  # left empty: not given (the check says if it was required)
        elif f.kind == "text":
            value = raw
        elif f.kind == "choice":
            value = checks.parse_json_text(field, raw)
        else:
            try:
                number = float(raw.strip())
            except ValueError:
                raise InvalidInput(field, f"must be {'an integer' if f.kind == 'integer' else 'a number'} "
                                          f"(got {raw[:40]!r})") from None
            value = int(number) if f.kind == "integer" and number.is_integer() else number
        if not f.name:
            return value
        out[f.name] = value
    return out if shape.fields and shape.fields[0].name else None


def open_question(q: Queue, task_id: int) -> dict[str, Any] | None:
    """The latest question task ``task_id`` asked, as its ledger recorded it (``question``,
    ``schema``, ``key``), open or not (None: it asked none); :meth:`leaseq.Queue.answer` decides."""
    from ..engine.durable import ASK_ACTION

    asked = [fx.response for fx in q.effects(task_id)
             if fx.action == ASK_ACTION and isinstance(fx.response, dict) and fx.response.get("state") == "waiting"]
    return {**asked[-1], "schema": answers.recorded(asked[-1])} if asked else None
