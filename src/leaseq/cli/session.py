"""What every command module shares: the queue connection, errors and JSON output."""

from __future__ import annotations

import dataclasses
import enum
import json
import os
import sys
from collections.abc import Callable
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import click

from ..core import checks
from ..core.errors import BackendUnavailable, ConfigError, InvalidInput, LeaseqError
from ..queue import Queue, connect
from ..store.base import DEFAULT_DSN, load_migrations, parse_dsn

#: what a click decorator takes and gives back: a callback or a built command
FC = TypeVar("FC", bound=Callable[..., Any] | click.Command)


def one_line(text: str) -> str:
    """``text`` with every run of whitespace (newlines from drivers included) made one space."""
    return " ".join(str(text).split())


class CliError(click.ClickException):
    """An error the CLI reports as one line, ``error: <field>: <problem>``, on stderr.

    Exit status 2 for bad input, missing records and refused transitions;
    1 when the database cannot be reached.
    """

    def __init__(self, field: str, problem: str, *, exit_code: int = 2):
        super().__init__(f"{field}: {one_line(problem)}")
        self.exit_code = exit_code

    @classmethod
    def from_leaseq(cls, exc: LeaseqError) -> CliError:
        """Translate a library error, keeping the field it names (else the registry's ``cli_field``)."""
        exit_code = exc.cli_exit_code
        field = getattr(exc, "field", None)
        if field is not None:
            return cls(field, getattr(exc, "problem", str(exc)), exit_code=exit_code)
        message = one_line(str(exc))
        if isinstance(exc, ConfigError) and message.startswith("dsn: "):
            return cls("dsn", message[len("dsn: "):], exit_code=exit_code)
        return cls(exc.cli_field or exc.code, message, exit_code=exit_code)

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", file=file or sys.stderr)


@dataclasses.dataclass
class CliState:
    """Per-invocation state kept on the click context (``ctx.obj``)."""

    dsn: str | None
    queue: Queue | None = None

    @property
    def embedded_default(self) -> bool:
        """True when neither ``--dsn`` nor ``$LEASEQ_DSN`` names a database."""
        return self.dsn is None and not os.environ.get("LEASEQ_DSN")


def cli_state(ctx: click.Context) -> CliState:
    """The invocation's :class:`CliState`, which the root command sets before any subcommand runs."""
    state = ctx.find_object(CliState)
    if state is None:  # never, under the leaseq command
        raise RuntimeError("no CliState on the click context: run the command under `leaseq`")
    return state


def open_queue(ctx: click.Context, *, need_schema: bool = True) -> Queue:
    """The queue the global options name, opened once per invocation and closed at exit.

    With ``need_schema``, a database without leaseq's tables (or with an older
    schema) is refused with a hint to run ``leaseq migrate``, and a SQLite
    file that does not exist is not created. The embedded default
    (``sqlite:///leaseq.db``, used when neither ``--dsn`` nor ``$LEASEQ_DSN``
    is set) is created and migrated on first use instead.
    """
    state = cli_state(ctx)
    if state.queue is not None:
        return state.queue
    queue = connect_checked(state.dsn, need_schema=need_schema, migrate=state.embedded_default,
                            embedded=state.embedded_default)
    state.queue = queue
    ctx.call_on_close(queue.close)
    return queue


def connect_checked(dsn: str | None, *, need_schema: bool = True, migrate: bool = False, embedded: bool = False,
                    hint: str = "", unavailable: bool = False) -> Queue:
    """Connect to ``dsn``; with ``need_schema``, refuse a database without leaseq's
    current schema (``hint`` is added to the refusal), unless ``migrate``.

    A SQLite file that does not exist is only created when ``migrate`` is set.
    With ``unavailable``, a database that cannot be reached raises
    :class:`BackendUnavailable` as it is, for a caller that waits and tries
    again (``leaseq worker``); else every error is a :class:`CliError`.
    The caller closes the queue.
    """
    try:
        dialect, target = parse_dsn(dsn)
        if need_schema and not migrate and dialect == "sqlite" and not os.path.exists(target):
            raise CliError("dsn", f"no SQLite database at {target!r}; run `leaseq migrate` to create it{hint}")
        queue = connect(dsn)
    except LeaseqError as exc:
        if unavailable and isinstance(exc, BackendUnavailable):
            raise
        raise CliError.from_leaseq(exc) from None
    if need_schema:
        try:
            _check_schema(queue, migrate=migrate, embedded=embedded, hint=hint)
        except BaseException:
            queue.close()
            raise
    return queue


def _check_schema(queue: Queue, *, migrate: bool, embedded: bool, hint: str) -> None:
    latest = max((m.version for m in load_migrations(queue.dialect)), default=0)
    current = queue.schema_version()
    if current >= latest:
        return
    if migrate:
        applied = queue.migrate()
        if embedded:
            click.echo(f"note: prepared the embedded database ({DEFAULT_DSN}); set --dsn or "
                       f"$LEASEQ_DSN to use another", err=True)
        elif applied:
            click.echo(f"note: applied migration(s) {', '.join(map(str, applied))} ({queue.dialect})", err=True)
    elif current == 0:
        raise CliError("database", f"has no leaseq schema; run `leaseq migrate` first{hint}")
    else:
        raise CliError("database", f"schema version {current} is older than this leaseq's ({latest}); "
                                   f"run `leaseq migrate`{hint}")


def parse_json_option(field: str, text: str | None) -> Any:
    """Decode a JSON command-line value; bad JSON is an error naming ``field``.

    ``-`` reads the document from stdin and ``@path`` from a file (a JSON
    document cannot start with ``@``), for documents too large for argv.
    """
    if text is None:
        return None
    if text == "-":
        text = click.get_text_stream("stdin").read()
    elif text.startswith("@"):
        try:
            text = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise CliError(field, f"cannot read {text[1:]!r}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:  # no strerror: its own text says which byte
            raise CliError(field, f"cannot read {text[1:]!r}: {exc}") from None
    try:
        return checks.parse_json_text(field, text)
    except InvalidInput as exc:
        raise CliError(field, exc.problem) from None


def as_datetime(value: Any) -> Any:
    """A timestamp as an aware datetime (epoch seconds are converted); other values unchanged."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, tz=timezone.utc)
    return value


def jsonable(value: Any) -> Any:
    """``value`` as plain JSON data: dataclasses as objects, datetimes as ISO strings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


def emit_json(value: Any) -> None:
    """Print ``value`` as indented JSON on stdout (no rich markup, no wrapping)."""
    click.echo(json.dumps(jsonable(value), indent=2, ensure_ascii=False))


def json_option(fn: FC) -> FC:
    """The ``--json`` flag every read command takes."""
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")(fn)
