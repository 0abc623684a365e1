"""The schema and retention: migrations, the applied version, and pruning finished tasks."""

from __future__ import annotations

from .. import engine
from .base import QueueBase


class SchemaOps(QueueBase):
    """Schema and retention operations of :class:`leaseq.Queue`."""

    def migrate(self) -> list[int]:
        """Create or upgrade the schema. Idempotent; returns the versions applied now."""
        return self._run(engine.schema.migrate(self.settings, self.dialect))

    def schema_version(self) -> int:
        """The newest migration applied (0 for an empty database)."""
        return self._run(engine.schema.schema_version(self.settings))

    def prune(self, older_than_seconds: float, *, payloads_older_than_seconds: float | None = None,
              batch: int = 1000, by: str | None = None, via: str | None = None,
              record_empty: bool = True) -> dict[str, int]:
        """Retention: delete finished tasks, with their evidence, older than the cut-off.

        Completed and cancelled tasks untouched for ``older_than_seconds`` are
        deleted with their events and effects. ``payloads_older_than_seconds``
        (usually shorter) only blanks the payload and result of finished
        tasks, keeping the row and its evidence trail for incident review.
        Dead, blocked and needs_reconciliation tasks are never pruned: they wait
        for a person. Works in batches of ``batch`` tasks, one transaction each;
        each batch that changed something writes its audit entry (``by``, with
        that batch's counts) in its own transaction. A pass that changed
        nothing is audited too, unless ``record_empty`` is false.
        Returns counts: ``tasks``, ``events``, ``effects``, ``payloads``.
        """
        return self._run(engine.schema.prune(self.settings, older_than_seconds,
                                             payloads_older_than_seconds=payloads_older_than_seconds, batch=batch,
                                             by=by, via=via, record_empty=record_empty))
