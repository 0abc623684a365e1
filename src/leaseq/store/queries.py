"""The named-query loader: ``sql/<dialect>/queries.sql`` read into annotated queries.

A queries file holds two kinds of block:

``-- template: <name>(<param>=<default>)``
    A fragment of SQL written once and expanded wherever a query writes
    ``/* TEMPLATE: <name> */`` (or ``/* TEMPLATE: <name>(<argument>) */``)
    on a line of its own (in a query, or in another template). The lease
    guard is one: each dialect defines it once, and every lease-backed write
    expands it.

``-- name: <query>``
    One statement. Its leading comment lines may carry annotations, each
    ``-- <key>: <value>``:

    ``-- guard: lease``
        a write (or a lock for a write) on the strength of a lease: it must
        expand the ``lease_guard`` template;
    ``-- guard: none -- <reason>``
        takes a worker id but is not lease-backed, and says why;
    ``-- plan: generic``
        prepared on its first use on a connection and always run with the
        prepared statement's generic plan (PostgreSQL);
    ``-- plan: generic up to <n> <array parameter>``
        as ``plan: generic`` while the array parameter names at most ``n``
        elements; above that, planned for its values at that call (in its
        PostgreSQL function: the statement run as dynamic SQL), so a long
        list reaches the planner as a value (counted, and probed by hash);
    ``-- no-op: <reason>``
        nothing to run on this backend: the backend answers no rows without
        a round trip (the query exists so both dialects name the same
        operations);
    ``-- callers: <role>[, <role>]``
        on PostgreSQL, the roles (worker, operator, viewer) granted EXECUTE on
        the query's definer function (see :mod:`leaseq.store.functions`); no
        annotation: only the schema's owner may run it;
    ``-- direct: <reason>``
        on PostgreSQL, sent as written rather than through its function
        (migration bookkeeping, which runs before the functions exist);
    ``-- unused: <param>[, <param>] -- <reason>``
        parameters every caller passes that this dialect's statement does
        not need (tests/unit/test_queries.py otherwise keeps both dialects'
        parameters equal).

tests/unit/test_queries.py reads these annotations: a query that takes a
worker id without a ``guard`` annotation fails it, and so does a ``guard:
lease`` query whose expanded text lacks any line of the guard.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

__all__ = ["NamedQuery", "Template", "compact", "load_named_queries", "load_queries", "load_wire_queries",
           "parse_named_blocks", "parse_queries_file"]

_BLOCK = re.compile(r"^-- (name|template): (\w+)(?:\((\w+)=(.*)\))?\s*$", re.MULTILINE)
# The argument runs to the last ") */" of the line, so it may hold parentheses of its own.
# A use may end its line with ";" (the statement's end) or "," (more of a WITH follows).
_USE = re.compile(r"^(?P<indent>[ \t]*)/\* TEMPLATE: (?P<name>\w+)(?:\((?P<arg>.*)\))? \*/(?P<tail>[;,]?)[ \t]*$",
                  re.MULTILINE)
_ANNOTATION = re.compile(r"^-- (guard|plan|no-op|unused|callers|direct): (.*)$")
#: the roles a PostgreSQL function may be granted to (``-- callers:``)
CALLER_ROLES = ("worker", "operator", "viewer", "verifier")
#: the guard every lease-backed query expands
LEASE_GUARD = "lease_guard"


@dataclass(frozen=True)
class Template:
    """A fragment of SQL, with at most one parameter (``{<param>}`` in its text)."""

    name: str
    body: str
    param: str | None = None
    default: str | None = None

    def expand(self, arg: str | None, indent: str) -> str:
        """The fragment's lines, each indented by ``indent``, with ``arg`` (or the default) substituted."""
        body = self.body
        if self.param is not None:
            body = body.replace("{" + self.param + "}", (arg if arg is not None else self.default or "").strip())
        elif arg is not None:
            raise ValueError(f"template {self.name!r} takes no argument (given {arg!r})")
        return "\n".join(indent + line for line in body.splitlines())


@dataclass(frozen=True)
class NamedQuery:
    """One ``-- name:`` block: its source, its expanded SQL and its annotations."""

    name: str
    source: str           # as written, template uses unexpanded
    sql: str              # what the backend runs
    guard: str | None = None          # "lease", "none" or None (not annotated)
    guard_reason: str = ""
    generic_plan: bool = False
    #: (array parameter, n): generic while the parameter names at most n elements (``plan: generic up to``)
    custom_above: tuple[str, int] | None = None
    noop: str | None = None           # the reason, when the statement is a no-op on this backend
    unused: frozenset[str] = field(default_factory=frozenset)
    callers: frozenset[str] = field(default_factory=frozenset)   # roles granted its function (PostgreSQL)
    direct: str | None = None         # the reason it is sent as written, not as a function (PostgreSQL)
    templates: tuple[tuple[str, str | None], ...] = ()  # (template, argument) per use

    @property
    def lease_guarded(self) -> bool:
        """Whether the query is annotated ``guard: lease``."""
        return self.guard == "lease"


_SIZED_PLAN = re.compile(r"generic up to (\d+) (\w+)")


def _annotations(name: str, body: str, where: str) -> dict[str, object]:
    found: dict[str, object] = {}
    for line in body.splitlines():
        if not line.startswith("--"):
            break  # annotations sit in the block's leading comment
        m = _ANNOTATION.match(line.strip())
        if m is None:
            continue
        key, value = m.group(1), m.group(2).strip()
        if key in found:
            raise RuntimeError(f"{where}: query {name!r} has two {key!r} annotations")
        found[key] = value
    out: dict[str, object] = {}
    if "guard" in found:
        kind, _, reason = str(found["guard"]).partition("--")
        kind, reason = kind.strip(), reason.strip()
        if kind not in ("lease", "none"):
            raise RuntimeError(f"{where}: query {name!r}: guard must be 'lease' or 'none -- <reason>' "
                               f"(got {found['guard']!r})")
        if kind == "none" and not reason:
            raise RuntimeError(f"{where}: query {name!r}: 'guard: none' needs a reason ('-- guard: none -- why')")
        out["guard"], out["guard_reason"] = kind, reason
    if "plan" in found:
        sized = _SIZED_PLAN.fullmatch(str(found["plan"]))
        if sized is not None:
            out["generic_plan"], out["custom_above"] = True, (sized.group(2), int(sized.group(1)))
        elif found["plan"] != "generic":
            raise RuntimeError(f"{where}: query {name!r}: a plan annotation is 'plan: generic' or "
                               "'plan: generic up to <n> <array parameter>'")
        else:
            out["generic_plan"] = True
    if "no-op" in found:
        out["noop"] = str(found["no-op"]) or "no-op"
    if "callers" in found:
        roles = frozenset(r.strip() for r in str(found["callers"]).split("--", 1)[0].split(",") if r.strip())
        if not roles or not roles <= set(CALLER_ROLES):
            raise RuntimeError(f"{where}: query {name!r}: callers are some of {', '.join(CALLER_ROLES)} "
                               f"(got {found['callers']!r})")
        out["callers"] = roles
    if "direct" in found:
        if not str(found["direct"]).strip():
            raise RuntimeError(f"{where}: query {name!r}: 'direct' needs a reason")
        out["direct"] = str(found["direct"]).strip()
    if "unused" in found:
        names = str(found["unused"]).split("--", 1)[0]
        out["unused"] = frozenset(p.strip() for p in names.split(",") if p.strip())
    return out


def parse_queries_file(text: str, source: str) -> tuple[dict[str, Template], dict[str, NamedQuery]]:
    """Every template and named query of a queries file, templates expanded."""
    parts = _BLOCK.split(text)
    templates: dict[str, Template] = {}
    raw: list[tuple[str, str]] = []
    for i in range(1, len(parts), 5):
        kind, name, param, default, body = parts[i:i + 5]
        if kind == "template":
            if name in templates:
                raise RuntimeError(f"template {name!r} defined twice in {source}")
            # the template's own comment lines document it; its code is the rest
            code = "\n".join(line for line in body.strip("\n").splitlines() if not line.lstrip().startswith("--"))
            lines = [line for line in code.splitlines() if line.strip()]
            margin = min((len(line) - len(line.lstrip()) for line in lines), default=0)
            templates[name] = Template(name, "\n".join(line[margin:] for line in lines), param, default)
        else:
            raw.append((name, body.strip()))
    queries: dict[str, NamedQuery] = {}
    for name, body in raw:
        if name in queries:
            raise RuntimeError(f"query {name!r} defined twice in {source}")
        uses: list[tuple[str, str | None]] = []

        def expand(m: re.Match[str], name: str = name, uses: list[tuple[str, str | None]] = uses,
                   depth: int = 0) -> str:
            template = templates.get(m.group("name"))
            if template is None:
                raise RuntimeError(f"{source}: query {name!r} uses unknown template {m.group('name')!r}")
            if depth > 5:
                raise RuntimeError(f"{source}: query {name!r}: templates nested too deep at {template.name!r}")
            uses.append((template.name, m.group("arg")))
            # a template may use others (the claim's head expands the claimable test)
            text = _USE.sub(lambda inner: expand(inner, depth=depth + 1), template.expand(m.group("arg"), m.group("indent")))
            return text + m.group("tail")

        sql = _USE.sub(expand, body)
        queries[name] = NamedQuery(name=name, source=body, sql=sql, templates=tuple(uses),
                                   **_annotations(name, body, source))  # type: ignore[arg-type]
    return templates, queries


@cache
def load_named_queries(dialect: str) -> dict[str, NamedQuery]:
    """The annotated named queries of ``sql/<dialect>/queries.sql``."""
    return parse_queries_file(_read(dialect), f"{dialect}/queries.sql")[1]


@cache
def load_templates(dialect: str) -> dict[str, Template]:
    """The templates of ``sql/<dialect>/queries.sql``."""
    return parse_queries_file(_read(dialect), f"{dialect}/queries.sql")[0]


@cache
def load_queries(dialect: str) -> dict[str, str]:
    """The named queries of ``sql/<dialect>/queries.sql``, expanded: ``{name: sql}``."""
    return {name: q.sql for name, q in load_named_queries(dialect).items()}


@cache
def load_wire_queries(dialect: str) -> dict[str, str]:
    """:func:`load_queries` as sent to the server: :func:`compact`."""
    return {name: compact(sql) for name, sql in load_queries(dialect).items()}


def compact(sql: str) -> str:
    """``sql`` without its ``--`` comments, indentation and blank lines; string literals
    and quoted identifiers are kept exactly, whatever they hold.

    The statement the server runs is the same one. What changes is its size:
    psycopg caches its conversion of a query (placeholders to ``$n``) only up to
    4 KB of text, and the claim, with its comments, is twice that; parsed again on
    every call it cost about 60-100 µs (tests/unit/test_queries.py holds every
    statement under the limit).
    """
    out: list[str] = []
    line: list[str] = []
    i, n = 0, len(sql)

    def end_line() -> None:
        text = "".join(line).strip()
        if text:
            out.append(text)
        line.clear()

    while i < n:
        ch = sql[i]
        if ch in "'\"":  # a literal or a quoted identifier, to its closing quote (doubled quotes stay inside)
            j = i + 1
            while j < n:
                if sql[j] == ch:
                    if j + 1 < n and sql[j + 1] == ch:
                        j += 2
                        continue
                    break
                j += 1
            line.append(sql[i:j + 1])
            i = j + 1
        elif ch == "-" and sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end
        elif ch == "\n":
            end_line()
            i += 1
        else:
            line.append(ch)
            i += 1
    end_line()
    return "\n".join(out)


def _read(dialect: str) -> str:
    """The dialect's queries file, after the templates both dialects share (``sql/shared/templates.sql``)."""
    sql = resources.files("leaseq").joinpath("sql")
    return sql.joinpath("shared", "templates.sql").read_text() + "\n" + sql.joinpath(dialect, "queries.sql").read_text()


def parse_named_blocks(text: str, source: str) -> dict[str, str]:
    """Split a .sql file into its ``-- name: <query>`` blocks: ``{name: sql}`` (templates expanded)."""
    return {name: q.sql for name, q in parse_queries_file(text, source)[1].items()}
