"""MkDocs hook: the reference pages that are generated from the code at build time.

A page asks for a generated section with a marker line:

- ``<!-- generated: cli -->``      the ``--help`` of every ``leaseq`` command, from the click tree
- ``<!-- generated: cli-env -->``  every option's environment variable, from the same tree
- ``<!-- generated: http -->``     every HTTP route, from the service's OpenAPI schema
- ``<!-- generated: errors -->``   the error registry: code, HTTP status, CLI exit status, class
- ``<!-- generated: async-operations -->``  the Queue methods AsyncQueue offers as coroutines
- ``<!-- generated: changelog -->``  CHANGELOG.md from the repository root, below its title
- ``<!-- generated: query DIALECT NAME -->``  one named query of ``sql/DIALECT/queries.sql``, as it is

The schema itself is written to ``reference/openapi.json`` in the built site.
Nothing here is typed by hand, so the reference cannot drift from the code.
"""

from __future__ import annotations

import json
import re
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

import click

WIDTH = 100
_openapi: dict[str, Any] | None = None


def _commands(command: click.Command, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, command)]
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            found.extend(_commands(command.commands[name], (*path, name)))
    return found


def _help(path: tuple[str, ...], command: click.Command) -> str:
    from leaseq.cli.main import cli

    ctx = click.Context(cli, info_name="leaseq", terminal_width=WIDTH, max_content_width=WIDTH)
    for name in path:
        group = ctx.command
        assert isinstance(group, click.Group)
        ctx = click.Context(group.commands[name], info_name=name, parent=ctx,
                            terminal_width=WIDTH, max_content_width=WIDTH)
    return ctx.command.get_help(ctx)


def cli_reference() -> str:
    """One section per command, its full ``--help`` as the command prints it."""
    from leaseq.cli.main import cli

    parts = []
    for path, command in _commands(cli):
        title = " ".join(("leaseq", *path))
        parts.append(f"### `{title}`\n\n```text\n{_help(path, command)}\n```\n")
    return "\n".join(parts)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def cli_environment() -> str:
    """A table of every option's environment variable."""
    from leaseq.cli.main import cli

    rows = ["| variable | command | option | default | meaning |", "|---|---|---|---|---|"]
    for path, command in _commands(cli):
        for param in command.params:
            if not isinstance(param, click.Option) or not param.envvar:
                continue
            default = param.default if param.show_default or param.default not in (None, False) else ""
            if callable(default) or default in (None, ()) or type(default).__name__ == "Sentinel":
                default = ""
            flag = max(param.opts, key=len)
            meaning = (param.help or "").split(". ")[0].rstrip(".")
            rows.append(f"| `{param.envvar}` | `{' '.join(('leaseq', *path))}` | `{flag}` | "
                        f"{_cell(f'`{default}`') if default != '' else ''} | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def openapi_schema() -> dict[str, Any]:
    """The service's OpenAPI document, from an app over a throwaway SQLite queue."""
    global _openapi
    if _openapi is None:
        import leaseq
        from leaseq.service.app import create_app

        with tempfile.TemporaryDirectory() as folder:
            queue = leaseq.connect(f"sqlite:///{Path(folder) / 'openapi.db'}")
            try:
                _openapi = create_app(queue).openapi()
            finally:
                queue.close()
    return _openapi


def _schema_name(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " or ".join(_schema_name(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_schema_name(schema.get('items', {}))}"
    return schema.get("type", "any")


def _body_fields(spec: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    if "$ref" not in schema:
        return []
    model = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[-1]]
    required = set(model.get("required", ()))
    rows = []
    for name, field in model.get("properties", {}).items():
        default = f" (default `{json.dumps(field['default'])}`)" if "default" in field else ""
        rows.append(f"| `{name}` | {_cell(_schema_name(field))} | {'yes' if name in required else 'no'}{default} | "
                    f"{_cell(field.get('description', ''))} |")
    return rows


def http_reference() -> str:
    """Every route of the service: method, path, what it does, its parameters, body and answers."""
    spec = openapi_schema()
    parts = []
    for route, methods in spec["paths"].items():
        for method, op in methods.items():
            parts.append(f"### `{method.upper()} {route}`\n")
            if op.get("summary"):
                parts.append(f"**{_cell(op['summary'])}**\n")
            if op.get("description"):
                parts.append(op["description"].strip() + "\n")
            params = op.get("parameters", [])
            if params:
                parts.append("| parameter | in | type | required |\n|---|---|---|---|")
                parts.extend(f"| `{p['name']}` | {p['in']} | {_cell(_schema_name(p.get('schema', {})))} | "
                             f"{'yes' if p.get('required') else 'no'} |" for p in params)
                parts.append("")
            body = op.get("requestBody", {}).get("content", {})
            for media, content in body.items():
                fields = _body_fields(spec, content.get("schema", {}))
                parts.append(f"Body (`{media}`): {_schema_name(content.get('schema', {}))}\n")
                if fields:
                    parts.append("| field | type | required | meaning |\n|---|---|---|---|")
                    parts.extend(fields)
                    parts.append("")
            codes = ", ".join(f"`{code}`" for code in op.get("responses", {}))
            if codes:
                parts.append(f"Answers: {codes}.\n")
    return "\n".join(parts)


def error_table() -> str:
    """One row per registered error code, from ``leaseq.core.errors.ERRORS``."""
    from leaseq.core.errors import ERRORS

    rows = ["| code | HTTP status | CLI exit status | class | meaning |", "|---|---|---|---|---|"]
    for cls in ERRORS:
        meaning = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
        meaning = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", meaning).replace("``", "`")
        module = "leaseq.fencing" if cls.__name__ == "IdempotencyKeyReused" else "leaseq"
        name = f"{module}.{cls.__name__}" if hasattr(__import__(module, fromlist=["x"]), cls.__name__) else cls.__name__
        rows.append(f"| `{cls.code}` | {cls.http_status} | {cls.cli_exit_code} | `{name}` | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


def async_operations() -> str:
    import inspect

    from leaseq import AsyncQueue

    names = [name for name, fn in inspect.getmembers(AsyncQueue, inspect.iscoroutinefunction)
             if not name.startswith("_")]
    return ", ".join(f"`{name}`" for name in sorted(names))


GENERATORS = {
    "<!-- generated: errors -->": error_table,
    "<!-- generated: async-operations -->": async_operations,
    "<!-- generated: cli -->": cli_reference,
    "<!-- generated: cli-env -->": cli_environment,
    "<!-- generated: http -->": http_reference,
}


#: tests/docs reads these; the site shows a skip's reason next to its block.
SKIP_MARKER = re.compile(r"^<!-- docs-test: skip: (.+?) -->$", re.M)

QUERY_MARKER = re.compile(r"<!-- generated: query (\w+) ([\w:]+) -->")


def named_query(dialect: str, name: str) -> str:
    """The block ``-- name: NAME`` of the dialect's queries.sql, comments included, as a sql fence."""
    text = resources.files("leaseq").joinpath("sql", dialect, "queries.sql").read_text()
    if name.startswith("template:"):  # a fragment the loader expands where a query names it
        start = text.index(f"-- template: {name.split(':', 1)[1]}")
        body = text[start:].split("\n\n", 1)[0].rstrip()
        return f"```sql\n-- {dialect}\n{body}\n```"
    blocks = {b.split("\n", 1)[0].strip(): b for b in text.split("-- name: ")[1:]}
    if name not in blocks:
        raise KeyError(f"no query {name!r} in sql/{dialect}/queries.sql")
    body = blocks[name].split("\n", 1)[1].rstrip()
    return f"```sql\n-- {dialect}: {name}\n{body}\n```"


def changelog(config: Any) -> str:
    text = (Path(config["config_file_path"]).parent / "CHANGELOG.md").read_text()
    return text.split("\n", 1)[1]  # the page has its own title


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "<!-- generated: changelog -->" in markdown:
        markdown = markdown.replace("<!-- generated: changelog -->", changelog(config))
    for marker, generate in GENERATORS.items():
        if marker in markdown:
            markdown = markdown.replace(marker, generate())
    markdown = SKIP_MARKER.sub(lambda m: f"*Not run by the documentation tests: {m[1]}.*\n", markdown)
    return QUERY_MARKER.sub(lambda m: named_query(m[1], m[2]), markdown)


#: Sphinx roles in docstrings (``:class:`Queue```) arrive as the role's name before the code.
SPHINX_ROLE = re.compile(r":(?:class|meth|func|attr|data|mod|exc|obj):(?=<code>)")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    return SPHINX_ROLE.sub("", html)


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, "reference/openapi.json", content=json.dumps(openapi_schema(), indent=2)))
    return files
