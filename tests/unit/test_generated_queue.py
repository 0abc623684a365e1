"""The blocking queue is generated from the awaited one, and nothing is written twice.

:mod:`leaseq.queue.generate` turns each ``<name>_async.py`` of ``leaseq.queue`` into the
checked-in ``<name>.py``; these tests fail when a generated file is stale, when the
generator would write something that does not mean what the source means, and when a public
method of :class:`leaseq.Queue` or :class:`leaseq.AsyncQueue` is written by hand without being
listed (with its reason) in :data:`leaseq.queue.generate.HAND_WRITTEN`.
"""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import leaseq
from leaseq.queue import generate

QUEUE = Path(generate.__file__).resolve().parent


@pytest.mark.parametrize("name", generate.MODULES)
def test_each_generated_module_is_what_its_source_generates(name: str) -> None:
    path = QUEUE / f"{name}.py"
    assert path.read_text() == generate.generate(name), (
        f"{path} is stale or edited by hand: edit {name}_async.py and run python -m leaseq.queue.generate")
    assert path.read_text().startswith(f"# Generated from {name}_async.py by `python -m leaseq.queue.generate`")


def _copy(tmp_path: Path) -> Path:
    folder = tmp_path / "queue"
    shutil.copytree(QUEUE, folder, ignore=shutil.ignore_patterns("__pycache__"))
    return folder


def test_the_staleness_check_notices_an_edit_on_either_side(tmp_path: Path) -> None:
    folder = _copy(tmp_path)
    assert generate.stale(folder) == []
    generated = folder / "leases.py"
    generated.write_text(generated.read_text() + "\n# edited by hand\n")
    assert generate.stale(folder) == [generated]
    generated.write_text(generate.generate("leases", folder))
    source = folder / "schema_async.py"
    source.write_text(source.read_text().replace("(0 for an empty database)", "(0: an empty database)"))
    assert generate.stale(folder) == [folder / "schema.py"]


def test_the_check_command_fails_on_a_stale_file_and_the_writer_mends_it(tmp_path: Path) -> None:
    """``python -m leaseq.queue.generate --check`` (what a developer runs) exits 1 for a
    stale file; without ``--check`` it writes it."""
    folder = _copy(tmp_path)
    (folder / "effects.py").write_text("stale\n")

    def command(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "leaseq.queue.generate", "--folder", str(folder), *args],
                              capture_output=True, text=True, timeout=60)

    stale = command("--check")
    assert stale.returncode == 1 and "effects.py is stale" in stale.stderr, stale.stderr
    assert (folder / "effects.py").read_text() == "stale\n"
    assert command().returncode == 0
    assert (folder / "effects.py").read_text() == (QUEUE / "effects.py").read_text()
    assert command("--check").returncode == 0


SOURCE = '''\
"""Reads of AsyncQueue."""

from collections.abc import AsyncIterator

from .base_async import AsyncQueueBase


class AsyncReadOps(AsyncQueueBase):
    async def get(self, task_id: int, *, first: bool = True,
                  last: bool = False) -> int:  # AsyncQueue.get
        return await self._arun(engine.reads.get(self.settings, task_id,
                                                 first=first, last=last))

    async def follow(self) -> AsyncIterator[int]:
        listener = await self._atask_listener(1) if self else None
        async with self.held() as tx:
            async for page in tx.pages(
                self.settings):
                yield await listener.wait(page)
'''

WANT = '''\
# Generated from reads_async.py by `python -m leaseq.queue.generate`: do not edit.
"""Reads of Queue."""

from collections.abc import Iterator

from .base import QueueBase


class ReadOps(QueueBase):
    def get(self, task_id: int, *, first: bool = True,
            last: bool = False) -> int:  # Queue.get
        return self._run(engine.reads.get(self.settings, task_id,
                                          first=first, last=last))

    def follow(self) -> Iterator[int]:
        listener = self._task_listener(1) if self else None
        with self.held() as tx:
            for page in tx.pages(
                self.settings):
                yield listener.wait(page)
'''


def test_the_generator_drops_async_and_await_renames_and_realigns(tmp_path: Path) -> None:
    """Every character of the source is kept but ``async``, ``await`` and the awaited names; a
    line aligned under a bracket that moved moves with it, a hanging indent stays."""
    (tmp_path / "reads_async.py").write_text(SOURCE)
    assert generate.generate("reads", tmp_path) == WANT


def test_the_generator_refuses_a_rewrite_that_changes_the_meaning() -> None:
    """The token rewrite is checked against psycopg's AST transform: text that does not parse
    to the source's blocking AST is refused, as is text with an await left in it."""
    source = "async def f(x):\n    return await g(x)\n"
    generate._check_meaning(source, "def f(x):\n    return g(x)\n", "f.py")
    with pytest.raises(ValueError, match="does not parse"):
        generate._check_meaning(source, "def f(x):\n    return g\n", "f.py")
    with pytest.raises(ValueError, match="does not parse"):
        generate._check_meaning(source, "async def f(x):\n    return await g(x)\n", "f.py")


def _public(cls: type) -> dict[str, object]:
    return {name: getattr(cls, name) for name in dir(cls)
            if not name.startswith("_") and inspect.isfunction(getattr(cls, name))}


def _defined_in(cls: type, name: str) -> str:
    """The module whose class body defines ``cls.name`` (the first in the method resolution order)."""
    owner = next(klass for klass in cls.__mro__ if name in vars(klass))
    return owner.__module__


GENERATED = {f"leaseq.queue.{name}" for name in generate.MODULES}
SOURCES = {f"leaseq.queue.{name}_async" for name in generate.MODULES}


def test_every_method_is_generated_from_one_source_or_listed_as_written_by_hand() -> None:
    """Queue's methods come from the generated modules and AsyncQueue's from their sources,
    except the ones :data:`HAND_WRITTEN` lists; and each one it lists is written by hand (the
    list holds no name that is in fact generated)."""
    sync, coros = _public(leaseq.Queue), _public(leaseq.AsyncQueue)
    by_hand = ({name for name in sync if _defined_in(leaseq.Queue, name) not in GENERATED}
               | {name for name in coros if _defined_in(leaseq.AsyncQueue, name) not in SOURCES})
    assert by_hand == set(generate.HAND_WRITTEN)
    assert len(generate.HAND_WRITTEN) == 8, "a method written by hand was added or removed: say why in HAND_WRITTEN"
    twins = set(sync) & set(coros)
    generated = twins - set(generate.HAND_WRITTEN)
    assert len(generated) > 60
    for name in generated:  # each generated pair comes from one source: the same name in the same concern
        assert _defined_in(leaseq.Queue, name) + "_async" == _defined_in(leaseq.AsyncQueue, name), name
