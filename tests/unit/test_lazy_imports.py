"""Process start: ``import leaseq`` and a CLI command load only what they use.

The suite and every user's command line start thousands of processes; each paid for the
whole package (the worker runtime, the asyncio queue, rich) before doing anything. Each
check runs in a fresh interpreter, where nothing else has imported a module yet.
"""

from __future__ import annotations

import json
import subprocess
import sys

import click

import leaseq
from leaseq.cli.main import COMMAND_MODULES, cli


def loaded_after(code: str) -> set[str]:
    """The ``leaseq`` modules a fresh interpreter holds after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith('leaseq'))))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout.splitlines()[-1]))


def test_import_leaseq_loads_no_submodule():
    assert loaded_after("import leaseq") == {"leaseq"}


def test_every_public_name_resolves_to_its_definition():
    assert len(set(leaseq.__all__)) == len(leaseq.__all__)
    for name in leaseq.__all__:
        value = getattr(leaseq, name)
        assert value is getattr(sys.modules[value.__module__], value.__name__), name
        assert name in dir(leaseq), name
    namespace: dict[str, object] = {}
    exec("from leaseq import *", namespace)
    assert set(leaseq.__all__) <= set(namespace)
    assert loaded_after("from leaseq import Queue, connect, LeaseLost") >= {"leaseq.queue", "leaseq.core.errors"}


def test_a_submodule_is_an_attribute_once_asked_for_and_a_wrong_name_is_an_attribute_error():
    # code written against the eager package (`import leaseq`, then `leaseq.auth.audit_log(q)`) keeps working
    assert loaded_after("import leaseq\nleaseq.auth.audit_log") >= {"leaseq.auth"}
    for name in ("no_such_thing", "_private", "__wrapped__"):
        assert not hasattr(leaseq, name), name


def test_a_command_loads_its_own_module_only():
    loaded = loaded_after("from leaseq.cli.main import cli\nimport click\n"
                          "cli.get_command(click.Context(cli), 'ls')")
    assert "leaseq.cli.tasks" in loaded
    assert not loaded & {"leaseq.cli.worker", "leaseq.cli.service", "leaseq.cli.chaos", "leaseq.worker.runtime",
                         "leaseq.aio", "leaseq.app"}, sorted(loaded)


def test_command_modules_lists_every_command_each_module_adds():
    listed = {name for names in COMMAND_MODULES.values() for name in names}
    assert set(cli.commands) == listed
    assert list(cli.commands) == [name for names in COMMAND_MODULES.values() for name in names]
    for name in listed:
        command = cli.commands[name]
        assert isinstance(command, click.Command) and name in cli.commands
    assert "no-such-command" not in cli.commands and cli.commands.get("no-such-command") is None
    # the options of a command loaded on demand name their environment variables too
    enqueue = cli.commands["enqueue"]
    assert {param.envvar for param in enqueue.params if isinstance(param, click.Option)} >= {"LEASEQ_ENQUEUE_KEY"}
