"""The checker: invariants over a run's whole history and final state.

It is a pure function of what the run recorded (:class:`Observed`), so it
can be tested on hand-made histories and re-run on a saved JSON history.
Each invariant names the promise it checks:

``no_task_lost``
    every enqueued task ends ``completed``, ``dead``, ``cancelled``,
    ``needs_reconciliation`` or ``blocked``; none is left ``queued`` or
    ``running`` (with or without an expired lease).
``single_completion``
    no task is completed by more than one generation, and the stored result
    is the completing generation's (which is the task's newest claim).
``stale_write_refused``
    no guarded write (renew, complete, fail, release, begin/finish effect)
    of a generation was accepted once a newer claim of the task, or an
    operator's cancellation, had been recorded; and no claim or guarded write
    of a worker started after its revocation returned was accepted.
``downstream_once``
    no downstream action (idempotency key) applied twice.
``downstream_fenced``
    on every resource, no write accepted with a token older than one
    accepted before it, and the fence remembers the newest.
``reconciliation_evidence``
    every ``needs_reconciliation`` task has an intent without a response in
    its evidence, and no side-effect task went back to the queue while an
    intent of its was open.
``cancel_final``
    a cancelled task stays cancelled and is never completed afterwards.
``model_trace``
    every task's evidence trail, replayed event by event against the model
    of the lease protocol (``model/lease.pml``, transcribed in
    :mod:`leaseq_chaos.model`), holds no event the model does not allow in
    that order (:mod:`leaseq_chaos.traces`); a revocation is placed by the
    database time read after ``revoke_worker()`` returned.
``no_attempt_charged``
    attempts consumed by infrastructure faults = 0: a handler that returned
    (the workload records "returned" as it returns) is recorded as completed
    under that generation, never as a failure, and its task is never run
    again nor left dead for it. The only excuses: the lease had already ended
    before the handler returned (a renewal refused, the lease ended by the
    database's clock, or the worker's shutdown had begun releasing it when
    its grace period ran out) or had less than a round trip (0.35 s) left, an operator revoked the worker or cancelled the task,
    or a fault that can keep a worker from the queue for longer than a lease
    (kill, stop, partition, restart, service) hit that worker, or the whole
    queue, between shortly before the return and the next claim, or the
    worker kept trying to record the success (its completion calls failing
    on the fault) until the lease ran out: a success that cannot be recorded
    before the lease ends is a loss, routed by the recovery policy, never a
    failure. A failure recorded for a returned handler, or a lease the worker
    began to give back after the return, is never excused. Each violation names the faults
    around it.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from .faults import OUTLASTS_LEASE
from .traces import describe as describe_trace
from .traces import epoch_seconds as _epoch
from .traces import validate_trail

RESTING = frozenset({"completed", "dead", "cancelled", "needs_reconciliation", "blocked"})
GUARDED_OPS = frozenset({"renew", "complete", "fail", "release", "begin_effect", "finish_effect"})
INVARIANTS = ("no_task_lost", "single_completion", "stale_write_refused", "downstream_once",
              "downstream_fenced", "reconciliation_evidence", "cancel_final", "model_trace", "no_attempt_charged")
#: How long before a handler's return a fault that outlasts a lease can still
#: cost it its lease: the longest chaos lease (1.5 s) plus the longest hold of
#: a stop (4 s) or partition (3 s) is covered.
FAULT_REACH_SECONDS = 5.5
#: Routing events and the detail field holding where the task went.
_ROUTED = {"lease_expired": "routed_to", "lease_released": "routed_to", "failed": "next_status"}


@dataclass
class Observed:
    """What a run leaves behind: the history and the final state of both databases."""

    history: list[dict[str, Any]]
    tasks: list[dict[str, Any]]
    events: dict[int, list[dict[str, Any]]]
    effects: dict[int, list[dict[str, Any]]]
    ledger: list[dict[str, Any]]
    fence_tokens: dict[str, int] = field(default_factory=dict)


@dataclass
class Report:
    """The verdict: counts for the table and every violation found."""

    counts: dict[str, int]
    statuses: dict[str, int]
    violations: list[dict[str, Any]]

    @property
    def ok(self) -> bool:
        """True when no invariant was violated."""
        return not self.violations

    def by_invariant(self) -> dict[str, int]:
        """Violations per invariant (every invariant listed, zeros included)."""
        found = Counter(v["invariant"] for v in self.violations)
        return {name: found.get(name, 0) for name in INVARIANTS}


def check(obs: Observed) -> Report:
    """Check every invariant; return counts and violations."""
    violations: list[dict[str, Any]] = []

    def violate(invariant: str, task: Any, detail: str) -> None:
        violations.append({"invariant": invariant, "task": task, "detail": detail})

    tasks = {int(t["id"]): t for t in obs.tasks}
    _tasks_settled(obs, tasks, violate)
    _completions(obs, tasks, violate)
    _stale_writes(obs, violate)
    _downstream(obs, violate)
    _reconciliation(obs, tasks, violate)
    _cancellations(obs, tasks, violate)
    traces = _model_traces(obs, tasks, violate)
    counts = _counts(obs)
    counts["trails replayed against the model"] = traces
    counts.update(_returned_attempts(obs, tasks, violate))
    return Report(counts=counts, statuses=dict(Counter(t["status"] for t in obs.tasks)),
                  violations=violations)


def _tasks_settled(obs: Observed, tasks: dict[int, dict], violate) -> None:
    enqueued = {r["task"] for r in obs.history if r["op"] == "enqueue" and r["outcome"] == "ok"}
    for task_id in sorted(enqueued - set(tasks)):
        violate("no_task_lost", task_id, "enqueued, but missing from the database")
    for task_id, t in sorted(tasks.items()):
        if t["status"] not in RESTING:
            stuck = " with its lease held" if t["status"] == "running" else ""
            violate("no_task_lost", task_id, f"ended {t['status']}{stuck} (generation {t['claim_generation']})")


def _completions(obs: Observed, tasks: dict[int, dict], violate) -> None:
    accepted: dict[int, set[int]] = defaultdict(set)
    for r in obs.history:
        if r["op"] == "complete" and r["outcome"] == "ok":
            accepted[r["task"]].add(r["gen"])
    for task_id, events in obs.events.items():
        gens = [e["generation"] for e in events if e["type"] == "completed"]
        gens_all = sorted(set(gens) | accepted.get(task_id, set()))
        if len(gens) > 1 or len(gens_all) > 1:
            violate("single_completion", task_id, f"completed by generations {gens_all}")
        t = tasks.get(task_id)
        if t is None or t["status"] != "completed" or not gens:
            continue
        result = t.get("result")
        result_gen = result.get("generation") if isinstance(result, dict) else None
        if gens[-1] != t["claim_generation"]:
            violate("single_completion", task_id,
                    f"completed by generation {gens[-1]} while generation {t['claim_generation']} held the task")
        if result_gen is not None and result_gen != gens[-1]:
            violate("single_completion", task_id,
                    f"stored result is generation {result_gen}'s, completed by generation {gens[-1]}")


def _stale_writes(obs: Observed, violate) -> None:
    """An accepted write invoked after a newer claim (or a cancellation) was recorded."""
    newest: dict[int, list[tuple[float, int]]] = defaultdict(list)  # task -> [(time, generation)]
    cancelled_at: dict[int, float] = {}
    for r in obs.history:
        if r["op"] == "claim" and r["outcome"] == "ok" and "task" in r:
            newest[r["task"]].append((r["t"], r["gen"]))
        elif r["op"] == "cancel" and r["outcome"] == "ok":
            cancelled_at.setdefault(r["task"], r["t"])
    for r in obs.history:
        if r["op"] not in GUARDED_OPS or r["outcome"] != "ok" or "gen" not in r:
            continue
        start = r.get("t0", r["t"])
        superseded = [g for t, g in newest.get(r["task"], ()) if t < start and g > r["gen"]]
        if superseded:
            violate("stale_write_refused", r["task"],
                    f"{r['op']} by generation {r['gen']} ({r['proc']}) accepted after generation "
                    f"{max(superseded)} had claimed the task")
        elif r["op"] != "renew" and r["task"] in cancelled_at and cancelled_at[r["task"]] < start:
            violate("stale_write_refused", r["task"],
                    f"{r['op']} by generation {r['gen']} ({r['proc']}) accepted after the task was cancelled")
        elif r["op"] == "renew" and r["task"] in cancelled_at and cancelled_at[r["task"]] < start:
            violate("stale_write_refused", r["task"], f"renewal by generation {r['gen']} accepted after cancel")
    # a revoked worker: nothing it starts after revoke_worker() returned may be accepted, claims included
    revoked_at = {r["worker"]: r["t"] for r in obs.history
                  if r["op"] == "fault" and r.get("fault") == "revoke" and r["outcome"] == "ok"}
    for r in obs.history:
        if r["outcome"] == "ok" and (r["op"] in GUARDED_OPS or r["op"] == "claim") \
                and r.get("worker") in revoked_at and r.get("t0", r["t"]) > revoked_at[r["worker"]]:
            violate("stale_write_refused", r.get("task"),
                    f"{r['op']} by worker {r['worker']} ({r['proc']}) accepted after the worker was revoked")
    for r in obs.history:
        if r["op"].startswith("probe.") and r["outcome"] == "ok":
            violate("stale_write_refused", r.get("task"),
                    f"stale-writer probe: {r['op'][6:]} by superseded generation {r.get('gen')} was accepted")


def _downstream(obs: Observed, violate) -> None:
    per_key = Counter(row["idempotency_key"] for row in obs.ledger)
    for key, n in sorted(per_key.items()):
        if n > 1:
            task = next(row["task_id"] for row in obs.ledger if row["idempotency_key"] == key)
            violate("downstream_once", task, f"action {key!r} applied {n} times downstream")
    last: dict[str, int] = {}
    for row in sorted(obs.ledger, key=lambda r: r["id"]):
        res = row["resource"]
        if res in last and row["token"] < last[res]:
            violate("downstream_fenced", row["task_id"],
                    f"{res}: token {row['token']} accepted after token {last[res]}")
        last[res] = max(row["token"], last.get(res, row["token"]))
    for res, top in sorted(last.items()):
        fence = obs.fence_tokens.get(res)
        if obs.fence_tokens and (fence is None or fence < top):
            violate("downstream_fenced", None, f"{res}: the fence remembers {fence}, below accepted token {top}")


def _reconciliation(obs: Observed, tasks: dict[int, dict], violate) -> None:
    for task_id, t in sorted(tasks.items()):
        if t["status"] == "needs_reconciliation":
            open_fx = [fx for fx in obs.effects.get(task_id, []) if fx["status"] == "pending"]
            if not open_fx:
                violate("reconciliation_evidence", task_id, "needs_reconciliation without an open intent")
        if t["effect"] != "side_effect":
            continue
        open_ids: set[int] = set()
        for e in obs.events.get(task_id, []):
            detail = e.get("detail") or {}
            if e["type"] == "effect_intent":
                open_ids.add(detail.get("effect_id"))
            elif e["type"] == "effect_response":
                open_ids.discard(detail.get("effect_id"))
            elif e["type"] == "reconciled":
                open_ids.clear()
            elif e["type"] in _ROUTED and detail.get(_ROUTED[e["type"]]) == "queued" and open_ids:
                violate("reconciliation_evidence", task_id,
                        f"side-effect task requeued ({e['type']}, generation {e['generation']}) "
                        f"with intent(s) {sorted(open_ids)} open")


def _cancellations(obs: Observed, tasks: dict[int, dict], violate) -> None:
    for task_id, events in obs.events.items():
        types = [e["type"] for e in events]
        if "cancelled" not in types:
            continue
        if "completed" in types[types.index("cancelled"):]:
            violate("cancel_final", task_id, "completed after it was cancelled")
        t = tasks.get(task_id)
        if t is not None and t["status"] != "cancelled":
            violate("cancel_final", task_id, f"cancelled, but ended {t['status']}")


def _model_traces(obs: Observed, tasks: dict[int, dict], violate) -> int:
    """``model_trace``: each task's trail replayed against the model; returns how many were replayed."""
    revoked = {}
    for r in obs.history:
        if r["op"] == "fault" and r.get("fault") == "revoke" and r["outcome"] == "ok" and r.get("committed_by"):
            at = _epoch(r["committed_by"])
            if at is not None:
                revoked[r["worker"]] = at
    for task_id, events in sorted(obs.events.items()):
        found = validate_trail(events, task=tasks.get(task_id), revoked=revoked)
        if found is not None:
            violate("model_trace", task_id, describe_trace(found))
    return len(obs.events)


#: A handler that returns with less of its lease left than this (by the database's clock) cannot be
#: expected to have its success recorded in time: one round trip on a loaded machine takes that long.
RECORDING_SLACK_SECONDS = 0.35
#: How long before its lease's deadline a worker's last failed attempt to record a success may have
#: ended, for the worker to count as having kept trying (the completer's retry backoff is shorter).
RECORDING_GAP_SECONDS = 0.3


def _kept_recording(calls: list[dict[str, Any]], deadline: float) -> bool:
    """Whether failed attempts to record a completion went on until ``deadline`` (monotonic time):
    the last one started before it and ended no earlier than shortly before it."""
    before = [c for c in calls if c.get("t0", c["t"]) <= deadline]
    return bool(before) and max(c["t"] for c in before) >= deadline - RECORDING_GAP_SECONDS


#: Faults on the queue's side that reach every worker (the ledger's do not touch leases).
_QUEUE_WIDE = frozenset({"drop_queue", "restart", "service"})


def _blame(around: list[dict[str, Any]], slot: int | None, returned: float) -> dict[str, Any]:
    """The fault a charged attempt is counted against: the latest one before the return aimed at
    that worker, else the latest queue-wide one before it, else the latest before it, else the first after."""
    before = [f for f in around if f["t"] <= returned]
    for pool in ([f for f in before if f.get("slot") == slot and slot is not None],
                 [f for f in before if f["fault"] in _QUEUE_WIDE], before):
        if pool:
            return max(pool, key=lambda f: f["t"])
    return min(around, key=lambda f: f["t"])


def _slot_of(proc: str) -> int | None:
    """The fleet slot of a worker process named ``w<slot>.<spawn>``."""
    head = proc.split(".", 1)[0]
    return int(head[1:]) if head.startswith("w") and head[1:].isdigit() else None


def _returned_attempts(obs: Observed, tasks: dict[int, dict], violate) -> dict[str, int]:
    """``no_attempt_charged``: each returned handler's attempt, and what became of it."""
    completed: set[tuple[int, int]] = set()
    failed: set[tuple[int, int]] = set()
    renew_refused: dict[tuple[int, int], float] = {}
    recording: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)  # completion calls that failed
    claims: dict[int, list[tuple[float, int]]] = defaultdict(list)
    faults: list[dict[str, Any]] = []
    released_from: dict[tuple[int, int], float] = {}  # when the worker began giving a lease back
    for r in obs.history:
        op, ok = r["op"], r["outcome"] == "ok"
        if op == "complete" and ok and "task" in r:
            completed.add((r["task"], r["gen"]))
        elif op == "complete" and r["outcome"] in ("unknown", "refused"):
            for pair in ([[r["task"], r["gen"]]] if "task" in r else r.get("tasks", [])):
                recording[(pair[0], pair[1])].append(r)
        elif op == "fail" and ok:
            failed.add((r["task"], r["gen"]))
        elif op == "renew" and r["outcome"] == "refused" and "task" in r:
            renew_refused.setdefault((r["task"], r["gen"]), r["t"])
        elif op == "claim" and ok and "task" in r:
            claims[r["task"]].append((r["t"], r["gen"]))
        elif op == "release" and "task" in r:
            released_from.setdefault((r["task"], r["gen"]), r.get("t0", r["t"]))
        elif op == "fault" and ok:
            faults.append(r)
    ended: dict[tuple[int, int], tuple[str, float | None]] = {}  # how and when (database time) a lease ended
    for task_id, events in obs.events.items():
        for e in events:
            if e["type"] == "completed":
                completed.add((task_id, e["generation"]))
            elif e["type"] == "failed":
                failed.add((task_id, e["generation"]))
            elif e["type"] in ("lease_expired", "lease_revoked", "lease_released"):
                # an expired lease ended at its deadline, not when a claimer routed it
                when = (e.get("detail") or {}).get("lease_expires_at") if e["type"] == "lease_expired" else None
                ended.setdefault((task_id, e["generation"]), (e["type"], _epoch(when or e.get("at"))))
    end_of_run = obs.history[-1]["t"] if obs.history else 0.0
    c: Counter = Counter()
    for r in obs.history:
        if r["op"] != "returned":
            continue
        task_id, gen = r["task"], r["gen"]
        c["handlers returned"] += 1
        if (task_id, gen) in completed:
            continue
        t = tasks.get(task_id, {})
        later = sorted(tt for tt, g in claims.get(task_id, ()) if g > gen)
        resting_on_it = t.get("claim_generation") == gen and t.get("status") in ("dead", "needs_reconciliation",
                                                                                  "blocked", "queued")
        how, at = ended.get((task_id, gen), ("", None))
        if t.get("status") == "cancelled" or how == "lease_revoked":
            c["returned attempts ended by an operator (cancel, revoke)"] += 1
            continue
        if (task_id, gen) not in failed:
            if not later and not resting_on_it:
                continue  # nothing charged (yet): the checker's other invariants judge the rest
            refused_at = renew_refused.get((task_id, gen))
            # a release the worker had begun before the return (its shutdown's grace ran out and
            # the attempt was stopped) ended the lease before the return, as a refusal does
            given_up_at = released_from.get((task_id, gen))
            if (refused_at is not None and refused_at < r["t"]) or (at is not None and at < r.get("wall", 0)) \
                    or (how == "lease_released" and given_up_at is not None and given_up_at < r["t"]):
                c["returned attempts whose lease had ended before the return"] += 1
                continue
            if how == "lease_expired" and at is not None and at - r.get("wall", 0) < RECORDING_SLACK_SECONDS:
                c["returned attempts with too little lease left to record"] += 1
                continue
        until = later[0] if later else end_of_run
        slot = _slot_of(r["proc"])
        around = [f for f in faults if r["t"] - FAULT_REACH_SECONDS <= f["t"] <= until
                  and f.get("slot") in (None, slot)]
        outlasting = sorted({f["fault"] for f in around if f["fault"] in OUTLASTS_LEASE
                             and not (f["fault"] == "partition" and f.get("mode") == "drop")})
        if outlasting and (task_id, gen) not in failed:
            c["returned attempts lost to a fault that outlasted the lease"] += 1
            continue
        if (task_id, gen) not in failed and how == "lease_expired" and at is not None and around \
                and _kept_recording(recording.get((task_id, gen), []), at - (r["wall"] - r["t"])):
            # the worker kept trying to record the success until its lease ran out, and the queue
            # stayed out of reach (reconnecting after the fault) for the rest of the lease: reported
            # as a loss and routed by the recovery policy, as designed; never a failure
            c["returned attempts whose lease ran out while recording through a fault"] += 1
            continue
        def name(f: dict[str, Any]) -> str:
            return f["fault"] + (f"({f['mode']})" if f.get("mode") else "")

        nearest = name(_blame(around, slot, r["t"])) if around else "no fault"
        timeline = ", ".join(f"{name(f)} {f['t'] - r['t']:+.2f}s" for f in sorted(around, key=lambda f: f["t"]))
        what = ("recorded as a failure" if (task_id, gen) in failed
                else f"run again (generation {later and max(g for _, g in claims[task_id])})" if later
                else f"left {t.get('status')}")
        violate("no_attempt_charged", task_id,
                f"handler returned under generation {gen} ({r['proc']}), then {what}; "
                f"lease ended: {how or 'not by expiry'}; nearest fault: {nearest}; "
                f"faults around the return: {timeline or 'none'}")
        c["attempts consumed by infrastructure faults"] += 1
        c[f"charged near {nearest}"] += 1
    c.setdefault("attempts consumed by infrastructure faults", 0)
    return dict(c)


def _counts(obs: Observed) -> dict[str, int]:
    c: Counter = Counter()
    for r in obs.history:
        op, outcome = r["op"], r["outcome"]
        if op == "enqueue" and outcome == "ok":
            c["tasks enqueued"] += 1
        elif op == "claim" and outcome == "ok" and "task" in r:
            c["claims"] += 1
        elif op in GUARDED_OPS and outcome == "refused":
            c["stale writes refused by the queue"] += 1
        elif op in GUARDED_OPS and outcome == "unknown":
            c["calls with unknown outcome"] += 1
        elif op == "downstream" and outcome == "refused":
            c["stale writes refused downstream"] += 1
        elif op == "downstream" and outcome == "ok" and r.get("replayed"):
            c["downstream replays"] += 1
        elif op == "cancel" and outcome == "ok":
            c["operator cancellations"] += 1
        elif op.startswith("probe.") and outcome == "refused":
            c["probe stale writes refused"] += 1
        elif op == "fault":
            c[f"fault: {r['fault']}"] += 1
        elif op == "worker_start":
            c["worker processes started"] += 1
        elif op == "worker_stop" and outcome == "error":
            c["worker processes that failed"] += 1
        elif op == "probe" and outcome == "error":
            c["probe cycles cut short by a fault"] += 1
    for events in obs.events.values():
        for e in events:
            if e["type"] in ("lease_expired", "lease_released"):
                c["leases recovered"] += 1
            elif e["type"] == "completed":
                c["completions"] += 1
    c["downstream writes"] = len(obs.ledger)
    return dict(c)
