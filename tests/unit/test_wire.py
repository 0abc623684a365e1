"""The HTTP wire shape of leaseq's records, and the request bodies' text check.

A claim travels as JSON: the service encodes it (:func:`to_json`) and
RemoteQueue rebuilds it (:func:`claim_from`). Both take shortcuts on the hot
path (plain fields tested in line; a complete record filled directly), so
these tests pin what the shortcuts must keep: the same record back, the
defaults of a record an older service sent without some fields, and no
field the local record does not know.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

import leaseq
from leaseq.core.model import Claim, Task
from leaseq.service.wire import claim_from, event_from, task_from, to_json
from leaseq.service.worker_batch import CompleteManyBody


@pytest.fixture
def claims(tmp_path) -> list[Claim]:
    q = leaseq.connect(f"sqlite:///{tmp_path / 'wire.db'}")
    q.migrate()
    q.enqueue("job", {"text": "héllo", "n": [1, 2.5, None]}, limits=["api"])
    q.enqueue("job", None)
    claimed = q.claim(q.register_worker("w"), limit=2)
    q.close()
    assert len(claimed) == 2
    return claimed


def test_a_claim_comes_back_as_it_went(claims):
    wire = json.loads(json.dumps(to_json(claims)))
    back = [claim_from(item) for item in wire]
    assert back == claims
    assert back[0].task.payload == {"text": "héllo", "n": [1, 2.5, None]}
    assert isinstance(back[0].expires_at, datetime) and back[0].expires_at.tzinfo is not None
    assert isinstance(back[0].task.created_at, datetime)
    # the rebuilt record is a real one: frozen, and equal field by field
    with pytest.raises(AttributeError):
        back[0].task.status = "queued"  # type: ignore[misc]
    assert to_json(back) == wire


def test_a_record_from_an_older_service_takes_the_defaults(claims):
    wire = to_json(claims[0].task)
    for newer in ("units", "limits", "trace_context", "snoozes"):
        del wire[newer]
    task = task_from(wire)
    assert (task.units, task.limits, task.trace_context, task.snoozes) == (1, None, None, 0)
    assert task.id == claims[0].task_id


def test_a_field_left_out_gets_its_default_factory():
    event = event_from({"id": 1, "task_id": 2, "type": "claimed", "generation": 1, "worker_id": "w",
                        "at": "2026-01-02T03:04:05+00:00"})
    assert event.detail == {} and event.at == datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    with pytest.raises(TypeError):  # a required field left out is no record at all
        task_from({"id": 1, "queue": "q", "kind": "k"})


def test_fields_this_client_does_not_know_are_dropped(claims):
    wire = to_json(claims[0])
    wire["task"]["added_in_a_later_version"] = 1
    wire["also_new"] = {"x": 1}
    claim = claim_from(wire)
    assert claim == claims[0]
    assert "added_in_a_later_version" not in vars(claim.task)


def test_times_are_iso_strings_and_none_stays_none():
    at = datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=timezone.utc)
    task = Task(id=1, queue="q", kind="k", payload=None, effect="read_only", status="queued", priority=0,
                available_at=at, created_at=at, lease_owner=None, lease_expires_at=None, lease_seconds=30,
                claim_generation=0, idempotency_key="k1", attempts=0, max_attempts=5, last_error=None, result=None)
    wire = to_json(task)
    assert wire["available_at"] == "2026-01-02T03:04:05.006000+00:00"
    assert wire["claimed_at"] is None
    assert task_from(wire) == task


@pytest.mark.parametrize("bad, field", [
    ({"tasks": [{"task_id": 1, "generation": 1, "result": {"a": ["ok", {"b": "x\x00"}]}}]}, "tasks[0].result.a[1].b"),
    ({"tasks": [{"task_id": 1, "generation": 1, "result": {"k\x00": 1}}]}, "tasks[0].result.k\x00"),
    ({"tasks": [{"task_id": 2, "generation": 1, "result": None},
                {"task_id": 1, "generation": 1, "result": "\ud800"}]}, "tasks[1].result"),
    ({"tasks": [], "claim": {"limit": 1, "queue": "q\x00"}}, "claim.queue"),
])
def test_unstorable_text_anywhere_in_a_batch_is_named(bad, field):
    with pytest.raises(ValidationError) as caught:
        CompleteManyBody.model_validate(bad)
    assert f"{field}:" in str(caught.value)


def test_storable_text_passes_the_check_unchanged():
    body = {"tasks": [{"task_id": i, "generation": 1, "result": {"text": "naïve ☃", "n": i, "ok": True,
                                                               "none": None, "list": [1.5, "x"]}}
                      for i in range(1, 50)],
            "claim": {"limit": 5, "kinds": ["a", "b"]}}
    parsed = CompleteManyBody.model_validate(body)
    assert [t.result for t in parsed.tasks] == [t["result"] for t in body["tasks"]]
