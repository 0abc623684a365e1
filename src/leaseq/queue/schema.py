# Generated from schema_async.py by `python -m leaseq.queue.generate`: do not edit.
"""The schema and retention: migrations, the applied version, pruning ended tasks, the evidence record."""

from __future__ import annotations

from typing import Any

from .. import engine
from ..store.base import KeyConflict
from .base import QueueBase


class SchemaOps(QueueBase):
    """Schema and retention operations of :class:`leaseq.Queue`."""

    def migrate(self) -> list[int]:
        """Create or upgrade the schema. Idempotent; returns the versions applied now."""
        try:
            return self._run(engine.schema.migrate(self.settings, self.dialect))
        except KeyConflict:
            if self.settings.backend.advisory_locks:
                raise
            # The portable mode locks the bookkeeping table, which the first migrate creates:
            # two that both found none raced to create it, and this one lost. The winner has
            # committed (the loser waited for it): this time the table is there to lock.
            return self._run(engine.schema.migrate(self.settings, self.dialect))

    def schema_version(self) -> int:
        """The newest migration applied (0 for an empty database)."""
        return self._run(engine.schema.schema_version(self.settings))

    def prune(self, older_than_seconds: float, *, payloads_older_than_seconds: float | None = None,
              evidence_older_than_seconds: float | None = None, batch: int = 1000, by: str | None = None,
              via: str | None = None, record_empty: bool = True,
              streams_older_than_seconds: float | None = None) -> dict[str, int]:
        """Retention: clear the user data of ended tasks, delete them, and later their evidence record.

        Ended tasks (completed, cancelled, dead, denied and expired) untouched
        for ``older_than_seconds`` are deleted with their events, effects,
        approval and action tokens; each leaves an evidence record (see
        :meth:`evidence_record`): its trail with every detail reduced to
        :data:`leaseq.engine.schema.EVIDENCE_KEYS` (who held which generation,
        who decided what, why each lease ended; no payload, result, error text
        or note). The evidence record is deleted once the task ended
        ``evidence_older_than_seconds`` ago (default: a year, or
        ``older_than_seconds`` if longer; never less than it), and so is
        every audit entry written longer ago than that: the audit log is
        evidence too, kept on the same clock.
        ``payloads_older_than_seconds`` (usually shorter) clears the user data
        of ended tasks and keeps the rows: payload, result and last error,
        the stream (:meth:`stream`: deleted), effect responses (model and tool output), approval notes, and every
        event detail and audit entry of the task beyond those keys. Blocked and
        needs_reconciliation tasks wait for a person, and live tasks are never
        touched. ``streams_older_than_seconds`` deletes the streams of tasks that
        ended longer ago than that (counted in ``streams``: the tasks whose stream
        went), on a retention of their own, usually the shortest: a stream is
        read while its task runs. Works in batches of ``batch`` tasks, one transaction each;
        each batch that changed something writes its audit entry (``by``, with
        that batch's counts) in its own transaction. A pass that changed
        nothing is audited too, unless ``record_empty`` is false. Returns
        counts: ``tasks``, ``events``, ``effects`` (deleted), ``payloads``
        (tasks cleared), ``evidence`` (evidence entries kept) and
        ``evidence_pruned`` (evidence entries deleted), ``audit_pruned`` (audit
        entries deleted), ``streams`` (tasks whose stream was deleted by its retention),
        ``spend_pruned`` (days of a limit's settled spend older than the evidence retention,
        deleted), ``flow_keys_pruned`` (singleton and debounce keys no enqueue named within
        ``older_than_seconds``, forgotten: the next enqueue of a key makes its row again) and
        ``fairness_pruned`` (fair-share rows of keys with no task queued that no claim served
        within ``older_than_seconds``: a key back later starts level with the keys served).
        """
        return self._run(engine.schema.prune(self.settings, older_than_seconds,
                                             payloads_older_than_seconds=payloads_older_than_seconds,
                                             evidence_older_than_seconds=evidence_older_than_seconds,
                                             batch=batch, by=by, via=via, record_empty=record_empty,
                                             streams_older_than_seconds=streams_older_than_seconds))

    def evidence_record(self, task_id: int) -> list[dict[str, Any]]:
        """The evidence record retention kept of a pruned task, in order (empty if none).

        One entry per event of its trail, the first the ``enqueued`` entry made
        from the row: ``task_id``, ``queue``, ``kind``, ``task_status`` (how the
        task ended), ``ended_at``, ``event_id``, ``type``, ``generation``,
        ``worker_id``, ``at``, ``detail`` (only the keys of
        :data:`leaseq.engine.schema.EVIDENCE_KEYS`) and ``kept_at``.
        """
        return self._run(engine.schema.evidence_record(self.settings, task_id))
