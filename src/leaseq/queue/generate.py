"""The blocking queue, generated from the awaited one: ``python -m leaseq.queue.generate [--check]``.

Each operation module of :mod:`leaseq.queue` is written once, awaited: ``leases_async.py``
holds ``AsyncLeaseOps``, the lease operations of :class:`leaseq.AsyncQueue`. Its blocking
twin ``leases.py`` (``LeaseOps``, those of :class:`leaseq.Queue`) is generated from it and
checked in, with a header saying so; a test (tests/unit/test_generated_queue.py) fails when
a generated file is stale. Edit the ``*_async.py`` source, then run this module.

Why generated, and how:

* Both drivers already run the same operation of :mod:`leaseq.engine` (its checks, its
  statements, its decisions); what each method adds is the signature, the docstring and the
  plumbing from its arguments to the operation, the part that drifted when written twice. A
  decorator building the blocking method at import would hide it from the reader, from mypy
  and from the reference docs; a generated file shows it as written.
* psycopg's way (``tools/async_to_sync.py``) transforms the AST (``await x`` to ``x``,
  ``async def`` to ``def``, names renamed) and unparses it: the text is rebuilt, comments
  kept only by a third-party parser and line breaks only by a formatter run after it, neither
  of which this project uses.
* unasync's way rewrites tokens (drops ``async`` and ``await``, renames names): the output
  is the source's own text, comments, docstrings and line breaks included, but lines
  continued under an opening bracket that moved are left misaligned.
* This module does both: unasync's token rewrite, with each continued line moved as far as
  the bracket it is aligned to moved; then psycopg's AST transform of the source, which the
  generated text must parse to exactly, so a rewrite that changed what the code means stops
  here rather than in a test.

Not every method can be generated: :data:`HAND_WRITTEN` lists those written by hand on
each side (or that have no twin), with the reason; the test checks that every other public
method of both classes comes from a generated pair.
"""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterable
from pathlib import Path

__all__ = ["HAND_WRITTEN", "MODULES", "RENAMES", "generate", "main", "stale", "unasync"]

HERE = Path(__file__).resolve().parent

#: The operation modules: ``<name>_async.py`` is the source of ``<name>.py``.
MODULES = ("reads", "operator", "leases", "effects", "enqueue", "children", "schema")

#: What the blocking code names in place of each awaited name (the ``*_async`` modules
#: themselves become their stems).
RENAMES: dict[str, str] = {
    "AsyncQueue": "Queue",
    "AsyncQueueBase": "QueueBase",
    "base_async": "base",
    "AsyncReadOps": "ReadOps",
    "AsyncOperatorOps": "OperatorOps",
    "AsyncLeaseOps": "LeaseOps",
    "AsyncEffectOps": "EffectOps",
    "AsyncEnqueueOps": "EnqueueOps",
    "AsyncChildOps": "ChildOps",
    "AsyncSchemaOps": "SchemaOps",
    # running an operation (QueueBase's and AsyncQueueBase's drivers)
    "_arun": "_run",
    "_arun_again": "_run_again",
    "_arun_in": "_run_in",
    "_ashared": "_shared",
    "_atask_listener": "_task_listener",
    "atraced_enqueue": "traced_enqueue",
    "atraced_enqueue_many": "traced_enqueue_many",
    # the standard library's
    "AsyncIterator": "Iterator",
    "asynccontextmanager": "contextmanager",
    **{f"{name}_async": name for name in MODULES},
}

#: The public methods of :class:`leaseq.Queue` and :class:`leaseq.AsyncQueue` written by hand,
#: and why: every other one is generated (Queue's from AsyncQueue's, in the modules above).
HAND_WRITTEN: dict[str, str] = {
    "joined": "one transaction across calls: the backend's blocking transaction; awaited, an asyncio "
              "transaction on PostgreSQL, and on SQLite a transaction held on a thread of its own",
    "hold_attempt": "a transaction held open while the caller's block runs: on SQLite, awaited, on a thread "
                    "of its own (a sqlite3 connection belongs to its thread)",
    "listener": "the waiter itself differs: blocking, or one whose wait and close are awaited",
    "close": "the blocking queue closes its backend; the awaited one also the event loop's connections",
    "close_async": "closes the running event loop's connections: awaited on both",
    "ajoined": "Queue only: joined for asyncio code, the view the service's requests run in",
    "end_worker_leases": "Queue only: runs in a transaction the caller holds (revoking a worker)",
    "run_in": "AsyncQueue only: a function run in a joined view's transaction, on its thread on SQLite",
}

HEADER = "# Generated from {source} by `python -m leaseq.queue.generate`: do not edit.\n"

_WORD = re.compile(r"\b(" + "|".join(sorted(map(re.escape, RENAMES), key=len, reverse=True)) + r")\b")
_OPENING, _CLOSING = "([{", ")]}"
# strings and comments, where names are renamed too (an f-string's text is a token of its own from Python 3.12)
_TEXT = {tokenize.STRING, tokenize.COMMENT, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}


def _renamed_text(text: str) -> str:
    """``text`` (a string or a comment) with every awaited name in it renamed."""
    return _WORD.sub(lambda m: RENAMES[m.group(1)], text)


def unasync(source: str) -> str:
    """The blocking module for the awaited ``source``: ``async`` and ``await`` dropped, names
    renamed (in strings and comments too), every other character kept; a line continued under
    an opening bracket moves as far as the bracket did."""
    lines = source.splitlines(keepends=True)
    edits: dict[int, list[tuple[int, int, str]]] = {}  # row: (start, end, replacement), original columns
    shifts: dict[int, int] = {}  # row: how far its first token moves
    opened: list[tuple[int, int]] = []  # the brackets open at this token: (row, column)
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    last_row = 0
    for i, tok in enumerate(tokens):
        if tok.type in (tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
            continue
        (row, col), (end_row, end_col) = tok.start, tok.end
        if row > last_row and opened and tok.type not in (tokenize.NL, tokenize.NEWLINE):
            b_row, b_col = opened[-1]
            moved = sum(len(new) - (end - start) for start, end, new in edits.get(b_row, ()) if end <= b_col)
            # aligned under the bracket: follow it; a hanging indent follows the bracket's line
            shifts[row] = shifts.get(b_row, 0) + (moved if col > b_col else 0)
        if tok.type == tokenize.NAME and tok.string in ("async", "await"):
            following = tokens[i + 1].start
            edits.setdefault(row, []).append((col, following[1] if following[0] == row else end_col, ""))
        elif tok.type == tokenize.NAME and tok.string in RENAMES:
            edits.setdefault(row, []).append((col, end_col, RENAMES[tok.string]))
        elif tok.type in _TEXT:
            for r in range(row, end_row + 1):
                start = col if r == row else 0
                end = end_col if r == end_row else len(lines[r - 1])
                for m in _WORD.finditer(lines[r - 1], start, end):
                    edits.setdefault(r, []).append((m.start(), m.end(), RENAMES[m.group(1)]))
        elif tok.type == tokenize.OP and tok.string in _OPENING:
            opened.append((row, col))
        elif tok.type == tokenize.OP and tok.string in _CLOSING:
            opened.pop()
        last_row = end_row
    out = []
    for row, line in enumerate(lines, 1):
        for start, end, new in sorted(edits.get(row, ()), reverse=True):
            line = line[:start] + new + line[end:]
        shift = shifts.get(row, 0)
        if shift < 0:
            line = line[min(-shift, len(line) - len(line.lstrip(" "))):]
        elif shift > 0:
            line = " " * shift + line
        out.append(line)
    return "".join(out)


class _ToBlocking(ast.NodeTransformer):
    """psycopg's transform: the AST the generated text must parse to."""

    def visit_Await(self, node: ast.Await) -> ast.AST:
        value: ast.AST = self.visit(node.value)
        return value

    def _blocking(self, node: ast.AST, kind: type[ast.AST]) -> ast.AST:
        twin = kind(**{field: getattr(node, field) for field in node._fields})
        visited: ast.AST = self.visit(ast.copy_location(twin, node))
        return visited

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> ast.AST:
        return self._blocking(node, ast.FunctionDef)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> ast.AST:
        return self._blocking(node, ast.With)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> ast.AST:
        return self._blocking(node, ast.For)

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("id", "attr", "name", "asname", "arg"):
            value = getattr(node, field, None)
            if isinstance(value, str):
                setattr(node, field, RENAMES.get(value, value))
        if isinstance(node, ast.ImportFrom) and node.module:
            node.module = ".".join(RENAMES.get(part, part) for part in node.module.split("."))
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = _renamed_text(node.value)
        return super().generic_visit(node)


def _check_meaning(source: str, generated: str, name: str) -> None:
    """Refuse a generated text that does not mean what the awaited source, made blocking, means."""
    want = ast.dump(_ToBlocking().visit(ast.parse(source)))
    if ast.dump(ast.parse(generated)) != want:
        raise ValueError(f"the blocking text generated for {name} does not parse to the source's blocking AST")


def generate(name: str, folder: Path = HERE) -> str:
    """The text of ``<name>.py``, generated from ``<name>_async.py`` in ``folder``."""
    source = (folder / f"{name}_async.py").read_text()
    text = HEADER.format(source=f"{name}_async.py") + unasync(source)
    _check_meaning(source, text, f"{name}.py")
    return text


def stale(folder: Path = HERE, names: Iterable[str] = MODULES) -> list[Path]:
    """The generated files in ``folder`` that differ from what their sources generate now."""
    return [folder / f"{name}.py" for name in names
            if not (folder / f"{name}.py").exists() or (folder / f"{name}.py").read_text() != generate(name, folder)]


def main(argv: list[str] | None = None) -> int:
    """``python -m leaseq.queue.generate [--check]``: write the blocking modules (or check them)."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if a generated file is stale")
    parser.add_argument("--folder", type=Path, default=HERE, help="where the modules are (default: this package)")
    args = parser.parse_args(argv)
    old = stale(args.folder)
    if args.check:
        for path in old:
            print(f"{path} is stale: run python -m leaseq.queue.generate", file=sys.stderr)
        return 1 if old else 0
    for path in old:
        path.write_text(generate(path.stem, args.folder))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
