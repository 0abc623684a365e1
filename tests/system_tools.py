"""System tools some tests need, and the one way to require one.

A fresh machine with the package installed (the README's test command) has
no HAProxy, no Chromium, and perhaps no curl, psql or PostgreSQL server
binaries; ``.ci/run`` installs them. A test that needs one calls
:func:`require_tool` (or uses a fixture that does): it gets the tool's path,
or the test skips with a message naming the tool and what installs it.

With ``LEASEQ_REQUIRE_TOOLS=1`` (CI sets it) a missing tool fails the test
instead, as ``LEASEQ_REQUIRE_PG=1`` does for a missing PostgreSQL: CI must
never pass by skipping. Two older switches still require their own tool:
``LEASEQ_REQUIRE_BROWSER=1`` (Chromium) and ``LEASEQ_REQUIRE_PG=1`` (the
PostgreSQL server binaries, for the tests that start a private server).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

import pytest

#: The switch that makes every missing tool a failure.
REQUIRE_TOOLS = "LEASEQ_REQUIRE_TOOLS"


@dataclass(frozen=True)
class Tool:
    """A program some tests run, found on ``$PATH`` or at one of ``paths``."""

    name: str
    #: what installs it, for the skip message
    install: str
    #: where else to look (Debian puts some in sbin, which a user's $PATH may lack)
    paths: tuple[str, ...] = ()
    #: switches besides LEASEQ_REQUIRE_TOOLS that make it required
    required_by: tuple[str, ...] = ()


#: Every tool a test or a documentation example may need, by the name it is run as.
TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("haproxy", "Debian's haproxy package", ("/usr/sbin/haproxy",)),
    # a pooler in transaction mode in front of the test server (tests/pgbouncer.py)
    Tool("pgbouncer", "Debian's pgbouncer package", ("/usr/sbin/pgbouncer",)),
    Tool("chromium", "Debian's chromium package", ("/usr/bin/chromium",), ("LEASEQ_REQUIRE_BROWSER",)),
    Tool("curl", "the curl package"),
    Tool("psql", "the postgresql-client package"),
    # the model checker of the lease protocol's model (model/lease.pml), and the compiler of its verifiers
    Tool("spin", "Debian's spin package"),
    Tool("gcc", "Debian's gcc package"),
    # initdb and pg_ctl, for the tests that start a private PostgreSQL server
    Tool("pg_ctl", "the PostgreSQL server package, for initdb and pg_ctl", (), ("LEASEQ_REQUIRE_PG",)),
)}


def find_tool(name: str) -> str | None:
    """The path of tool ``name``, or None when it is not installed."""
    tool = TOOLS[name]
    if name == "pg_ctl":  # the server binaries: $PATH, else the newest Debian install
        from leaseq_chaos.pgserver import find_bindir

        bindir = find_bindir()
        return os.path.join(bindir, "pg_ctl") if bindir else None
    found = shutil.which(name)
    if found:
        return found
    return next((path for path in tool.paths if os.access(path, os.X_OK)), None)


def tool_required(name: str) -> str | None:
    """The switch that makes tool ``name`` required here (set to 1), or None."""
    for switch in (REQUIRE_TOOLS, *TOOLS[name].required_by):
        if os.environ.get(switch) == "1":
            return switch
    return None


def missing_message(name: str) -> str:
    return f"needs {name}, which is not installed (install {TOOLS[name].install})"


def require_tool(name: str) -> str:
    """The path of tool ``name``; if it is missing, skip the test naming it (fail, when required)."""
    require_tools([name])
    found = find_tool(name)
    assert found is not None
    return found


def require_tools(names: list[str] | set[str]) -> None:
    """:func:`require_tool` for each of ``names``: one skip (or failure) naming every missing one."""
    missing = sorted(n for n in set(names) if find_tool(n) is None)
    if not missing:
        return
    switches = sorted({s for s in map(tool_required, missing) if s is not None})
    if switches:
        pytest.fail(f"{', '.join(s + '=1' for s in switches)} but {', '.join(missing)} "
                    f"{'is' if len(missing) == 1 else 'are'} not installed "
                    f"(install {'; '.join(TOOLS[n].install for n in missing)})")
    pytest.skip("; ".join(missing_message(n) for n in missing))
