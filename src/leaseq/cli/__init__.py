"""The ``leaseq`` command line: a thin layer over :class:`leaseq.Queue`.

The CLI has no SQL and no lease rules of its own; every command calls the
Queue API and presents the result.

Layout
------
``main.py``
    The click group (global ``--dsn``), error handling and :func:`main`.
``session.py``
    What every command module shares: :func:`open_queue` (connects, checks
    the schema), :class:`CliError` and the ``--json`` helpers.
``render.py``
    rich tables and the evidence-trail timeline (also used by ``leaseq demo``).
``logs.py``
    ``leaseq worker``'s logging: text or JSON lines, quiet HTTP client libraries, the progress line.
``tasks.py``, ``operator_actions.py``, ``overview.py``, ``demo_command.py``, ``schedules.py``
    The commands, grouped by who uses them.

Adding commands
---------------
Write a sibling module with a ``register(group)`` function that adds its
commands to the group (``@group.command()`` or ``group.add_command``), then
add the module's name and its commands' names to ``COMMAND_MODULES`` in ``main.py``:
one line (the module is imported only when one of its commands runs). In the
module, open the queue with ``open_queue(ctx)``; a :class:`leaseq.LeaseqError`
raised by a command becomes a one-line ``error: <field>: <problem>`` on
stderr (exit 2, or 1 when the database is unreachable). Every option gets an
environment variable, ``LEASEQ_<COMMAND>_<OPTION>``, from ``main.add_envvars``. Import heavy
dependencies inside the command function, so ``leaseq ls`` stays fast.
"""
