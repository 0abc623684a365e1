"""TaskDefinition.enqueue checks the payload against the handler's signature, at the
call and for a type checker, and a refused payload writes nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Literal, TypedDict

import pytest

import leaseq
from snapshots import snapshot


class Doc(TypedDict):
    id: int
    title: str


def declare(app: leaseq.App) -> leaseq.TaskDefinition:
    @app.task("summarize")
    def summarize(ctx, doc_id: int, tags: list[str] | None = None, *,
                  mode: Literal["short", "long"] = "short", doc: Doc | None = None, ratio: float = 1.0) -> str:
        return f"{doc_id}"

    return summarize


def test_arguments_are_sent_by_name(app: leaseq.App) -> None:
    summarize = declare(app)
    task = summarize.enqueue(7, ["a"], mode="long", ratio=2)  # an int is a float
    assert app.queue.get(task.id).payload == {"doc_id": 7, "tags": ["a"], "mode": "long", "ratio": 2}
    assert summarize.payload(doc_id=1) == {"doc_id": 1}


BAD_CALLS = [
    ((), {}, "doc_id", "missing"),
    ((1,), {"doc_id": 2}, "doc_id", "given twice"),
    (("7",), {}, "doc_id", "expected int, got str"),
    ((True,), {}, "doc_id", "expected int, got bool"),
    ((1,), {"tags": ["a", 2]}, "tags", "expected list[str] | None"),
    ((1,), {"mode": "medium"}, "mode", "Literal"),
    ((1,), {"doc": {"id": 1}}, "doc", "expected"),
    ((1,), {"doc": {"id": 1, "title": "t", "extra": 0}}, "doc", "expected"),
    ((1,), {"ratio": "fast"}, "ratio", "expected float"),
    ((1,), {"colour": "red"}, "colour", "unknown argument: the handler takes doc_id, tags, mode, doc, ratio"),
    ((1,), {"ctx": None}, "ctx", "unknown argument"),
    ((1, None, "long"), {}, "payload", "3 positional arguments given"),
]


@pytest.mark.parametrize(("args", "kwargs", "field", "message"), BAD_CALLS)
def test_a_bad_payload_names_the_argument_and_writes_nothing(app: leaseq.App, dsn: str, args, kwargs,
                                                             field: str, message: str) -> None:
    summarize = declare(app)
    app.queue  # migrated before the snapshot
    before = snapshot(dsn)
    with pytest.raises(leaseq.InvalidInput) as caught:
        summarize.enqueue(*args, **kwargs)
    assert caught.value.field == field
    assert message in str(caught.value)
    assert snapshot(dsn) == before


def test_options_bind_key_delay_and_priority(app: leaseq.App) -> None:
    summarize = declare(app)
    first = summarize.options(key="doc-1", priority=5).enqueue(doc_id=1)
    again = summarize.options(key="doc-1", priority=5).enqueue(doc_id=1)
    assert again.id == first.id and app.queue.get(first.id).priority == 5
    later = summarize.options(delay=3600).enqueue(doc_id=2)
    assert app.queue.claim(app.queue.register_worker("w"), kinds=["summarize"], limit=10)[0].task_id == first.id
    assert app.queue.get(later.id).status == "queued"
    with pytest.warns(DeprecationWarning, match=r"_key= is deprecated: use \.options\(key=\.\.\.\)"):
        legacy = summarize.options(priority=5).enqueue(doc_id=1, _key="doc-1")
    assert legacy.id == first.id
    # the same key for another payload or priority is another task: refused
    with pytest.raises(leaseq.IdempotencyKeyConflict) as info:
        summarize.options(key="doc-1").enqueue(doc_id=1)
    assert info.value.fields == ("priority",) and info.value.task_id == first.id


@pytest.mark.parametrize("dsn", ["sqlite"], indirect=True)
def test_a_handler_whose_payload_cannot_be_named_is_refused_at_declaration(app: leaseq.App) -> None:
    with pytest.raises(leaseq.InvalidInput, match="'items'.*positional") as caught:
        @app.task("bad")
        def bad(ctx, *items: int) -> None: ...
    assert caught.value.field == "fn"
    with pytest.raises(leaseq.InvalidInput, match="ctx as its first argument"):
        @app.task("worse")
        def worse() -> None: ...
    assert app.definitions == {}


SAMPLE = '''
import leaseq

app = leaseq.App()

@app.task("summarize")
def summarize(ctx: leaseq.TaskContext, doc_id: int, tags: list[str] | None = None) -> str:
    return str(doc_id)

summarize.enqueue(doc_id=1, tags=["a"])
summarize.options(key="k").enqueue(1)
summarize.enqueue(doc_id="one")            # line 11: wrong type
summarize.enqueue(doc=1)                   # line 12: unknown argument
summarize.enqueue()                        # line 13: missing argument
'''


def test_a_type_checker_sees_the_handlers_signature(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(SAMPLE.lstrip("\n"))
    src = Path(leaseq.__file__).resolve().parents[1]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent", "--no-error-summary",
         "--cache-dir", str(tmp_path / "cache"), str(sample)],
        capture_output=True, text=True, cwd=tmp_path, env={"MYPYPATH": str(src), "PATH": "/usr/bin:/bin"},
        timeout=300)
    lines = sorted({int(line.split(":")[1]) for line in proc.stdout.splitlines() if ": error:" in line})
    assert lines == [11, 12, 13], proc.stdout + proc.stderr
    assert 'incompatible type "str"; expected "int"' in proc.stdout
