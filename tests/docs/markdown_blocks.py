"""Find the code blocks of a Markdown page, with the directives that say how to run them.

A block is a fenced code block (three or more backticks or tildes). Its
language is the first word of the info string. A line of the form

    <!-- docs-test: skip: <reason> -->

right before a block (blank lines allowed in between) tells the runner not
to run it, and says why; the reason is required.

    <!-- docs-test: background: <reason> -->

runs a shell block that does not end by itself (``leaseq serve``) in the
background while the rest of the page runs, and stops it at the end of the
page. Page-wide directives may stand anywhere on the page:

    <!-- docs-test: page: postgres -->            run the page on a fresh PostgreSQL schema
    <!-- docs-test: page: owns-schema NAME -->    the page creates schema NAME: drop it before and after

A block whose first line is ``# file: NAME`` (``// file:``, ``; file:`` for
other languages) is written to NAME in the page's folder instead of being
run. ``text`` blocks show output, not code, and are not run.
Indented code blocks are not allowed: every example is fenced, so none
escapes the runner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<body>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
FILE_LINE = re.compile(r"^\s*(?:#|//|;|--)\s*file:\s*(?P<name>[\w./-]+)\s*$")

#: Languages the runner executes.
PYTHON = {"python", "py"}
SHELL = {"sh", "bash", "shell", "console"}
#: Blocks that show output or data, never run.
SHOWN_ONLY = {"text"}
#: Data the runner parses (a client's configuration, say): it must be well formed.
PARSED = {"json"}


@dataclass
class Block:
    """One fenced code block."""

    path: Path
    line: int           # 1-based line of the opening fence
    language: str
    code: str
    skip: str | None = None  # the reason, when the block is marked skip
    background: str | None = None  # the reason, when the block runs in the background

    @property
    def file_name(self) -> str | None:
        """The NAME of a leading ``# file: NAME`` line: the block is a file to write."""
        first = self.code.split("\n", 1)[0]
        match = FILE_LINE.match(first)
        return match["name"] if match else None

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass
class Page:
    """A Markdown page's blocks and its page-wide directives."""

    path: Path
    blocks: list[Block] = field(default_factory=list)
    postgres: bool = False
    owned_schemas: list[str] = field(default_factory=list)


class DirectiveError(ValueError):
    """A directive the runner does not understand, or a block it could never run."""


def parse(path: Path) -> Page:
    """Read ``path`` and return its blocks and directives."""
    page = Page(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    pending_skip: str | None = None
    pending_background: str | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        directive = DIRECTIVE.match(line)
        if directive:
            body = directive["body"]
            if body.startswith("skip:"):
                reason = body[len("skip:"):].strip()
                if not reason:
                    raise DirectiveError(f"{path}:{i + 1}: a skip needs a reason")
                pending_skip = reason
            elif body.startswith("background:"):
                reason = body[len("background:"):].strip()
                if not reason:
                    raise DirectiveError(f"{path}:{i + 1}: a background block needs a reason")
                pending_background = reason
            elif body == "page: postgres":
                page.postgres = True
            elif body.startswith("page: owns-schema "):
                page.owned_schemas.append(body.split()[-1])
            else:
                raise DirectiveError(f"{path}:{i + 1}: unknown directive {body!r}")
            i += 1
            continue
        fence = FENCE.match(line)
        if fence:
            marker, indent = fence["fence"], len(fence["indent"])
            language = (fence["info"].strip().split() or [""])[0].lower()
            body_lines = []
            j = i + 1
            while j < len(lines) and not re.match(rf"^ {{0,3}}{marker[0]}{{{len(marker)},}}\s*$", lines[j]):
                body_lines.append(lines[j][indent:] if lines[j][:indent].isspace() else lines[j])
                j += 1
            page.blocks.append(Block(path, i + 1, language, "\n".join(body_lines) + "\n", pending_skip,
                                     pending_background))
            if pending_background is not None and language not in SHELL:
                raise DirectiveError(f"{path}:{i + 1}: only shell blocks run in the background")
            pending_skip = pending_background = None
            i = j + 1
            continue
        if line.strip() and (pending_skip or pending_background) is not None:
            raise DirectiveError(f"{path}:{i + 1}: a block directive must stand right before its block")
        i += 1
    return page


def indented_code(path: Path) -> list[int]:
    """Line numbers of indented (unfenced) code blocks: four spaces after a blank line,
    outside fences and lists. Examples must be fenced so the runner sees them."""
    found, in_fence, previous_blank, in_list = [], False, True, False
    for number, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        if FENCE.match(line) or re.match(r"^ {0,3}(`{3,}|~{3,})\s*$", line):
            in_fence = not in_fence
            previous_blank = False
            continue
        if in_fence:
            continue
        if re.match(r"^\s*([-*+]|\d+\.|!!!|\?\?\?|===)\s", line):
            in_list = True
        elif not line.strip():
            pass
        elif not line.startswith(" "):
            in_list = False
        if line.startswith("    ") and line.strip() and previous_blank and not in_list:
            found.append(number)
        previous_blank = not line.strip()
    return found
