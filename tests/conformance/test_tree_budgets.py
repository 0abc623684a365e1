"""Budgets that cover the tree, on both backends: a budget on a task covers everything it
spawns and intends, and theirs. A descendant's consume counts against every budgeted
ancestor's budget, decided in the consume statement (exact under concurrent consumers);
once a tree's budget is spent, each task of the tree stops at its next ledger step and
waits for a person, and an approval that raises the budget resumes it from its ledger.

Spend is read back from the database (the approval's figures, the tasks' budgets and
``spent``, the ledger)."""

from __future__ import annotations

import random
import threading
import time
from typing import Any, Callable

import pytest

import leaseq
from leaseq.core.errors import BudgetSpent, InvalidInput, LeaseLost

TOK = "tok"


def parent_and_children(q: leaseq.Queue, w: leaseq.Worker, budget: int, children: int = 2,
                        **options: Any) -> tuple[leaseq.Task, leaseq.Claim, list[leaseq.Claim]]:
    """A parent with ``budget`` of TOK, claimed, and ``children`` it spawned, each claimed."""
    parent = q.enqueue("parent", budget={TOK: budget}, effect="idempotent", **options)
    [claim] = q.claim(w, kinds=["parent"])
    spawned = [q.spawn(w, claim, "child", {"n": n}, key=f"c{n}", effect="idempotent") for n in range(children)]
    leases = q.claim(w, kinds=["child"], limit=children)
    assert sorted(c.task_id for c in leases) == sorted(c.id for c in spawned)
    return parent, claim, sorted(leases, key=lambda c: c.task_id)


def test_a_childs_usage_counts_against_its_parents_budget_and_the_consume_past_it_pauses_the_child(
        q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    parent, claim, [one, two] = parent_and_children(q, w, 100)
    assert q.consume(w, one, "c0:consume:0", TOK, 40)["state"] == "charged"
    assert q.consume(w, claim, "p:consume:0", TOK, 30)["state"] == "charged"  # the parent's own counts too
    paused = q.consume(w, two, "c1:consume:0", TOK, 50)  # 120 of 100: the call was made, its usage recorded
    assert paused["state"] == "paused"
    assert paused["figures"] == {"key": TOK, "budget": 100, "spent": 120, "units": 50, "owner": parent.id}
    assert (paused["spent"], paused["budget"]) == (50, None)  # the child's own: it has no budget of its own
    child = q.get(two.task_id)
    assert (child.status, child.lease_owner, child.attempts, child.spent) == ("awaiting_approval", None, 0,
                                                                              {TOK: 50})
    request = q.approval(two.task_id)
    assert (request.reason, request.requested_by) == ("budget", f"task:{two.task_id}")
    assert request.detail == {"key": TOK, "budget": 100, "spent": 120, "units": 50, "owner": parent.id}
    assert q.get(parent.id).spent == {TOK: 30} and q.get(parent.id).status == "running"
    with pytest.raises(LeaseLost):  # the child's attempt has ended
        q.consume(w, two, "c1:consume:1", TOK, 1)


def test_a_key_no_budget_of_the_tree_names_is_charged_and_pauses_nothing(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    _, _, [one, _] = parent_and_children(q, w, 10)
    assert q.consume(w, one, "c0:consume:0", "other", 1_000)["state"] == "charged"
    assert q.begin_effect(w, one, "search", "c0:search").status == "pending"


STEPS: dict[str, Callable[[leaseq.Queue, leaseq.Worker, leaseq.Claim], Any]] = {
    "begin_effect": lambda q, w, c: q.begin_effect(w, c, "search", f"{c.task_id}:search"),
    "tool call": lambda q, w, c: q.begin_effect(w, c, "llm.call", f"{c.task_id}:llm:0", effect="read_only",
                                                args_digest="0" * 64),
    "spawn": lambda q, w, c: q.spawn(w, c, "grandchild", key="g"),
    "intend": lambda q, w, c: q.intend(w, c, "refund", key="r"),
    "sleep": lambda q, w, c: q.sleep(w, c, f"{c.task_id}:sleep:0", seconds=60),
    "signal wait": lambda q, w, c: q.wait_signal(w, c, f"{c.task_id}:signal:go:0", "go"),
    "consume": lambda q, w, c: q.consume(w, c, f"{c.task_id}:consume:9", TOK, 0),
}


@pytest.mark.parametrize("step", sorted(STEPS))
def test_a_task_of_a_spent_tree_stops_at_its_next_ledger_step(q: leaseq.Queue, step: str) -> None:
    """A sibling spent the parent's budget: the other child, which consumed nothing, stops at
    its next ledger step, nothing of the step written, and asks for an approval with the
    figures; so does the parent, whose own budget it is."""
    w = q.register_worker("w")
    parent, claim, [one, two] = parent_and_children(q, w, 100, actions=["search", "llm.call", "intend:refund"])
    assert q.consume(w, one, "c0:consume:0", TOK, 150)["state"] == "paused"
    before = q.effects(two.task_id)
    if step == "consume":  # a consume records its usage (the call was made), then stops
        assert q.consume(w, two, "c1:consume:9", TOK, 0)["state"] == "paused"
    else:
        with pytest.raises(BudgetSpent) as stopped:
            STEPS[step](q, w, two)
        assert stopped.value.figures == {"key": TOK, "budget": 100, "spent": 150, "owner": parent.id}
        assert q.effects(two.task_id) == before  # nothing of the step was begun
        assert [t.kind for t in q.list_tasks() if t.kind in ("grandchild", "refund")] == []
    held = q.get(two.task_id)
    assert (held.status, held.lease_owner) == ("awaiting_approval", None)
    assert q.approval(two.task_id).detail in ({"key": TOK, "budget": 100, "spent": 150, "owner": parent.id},
                                              {"key": TOK, "budget": 100, "spent": 150, "units": 0,
                                               "owner": parent.id})
    with pytest.raises(BudgetSpent) as stopped:  # the parent's own budget: no owner named
        q.begin_effect(w, claim, "search", "p:search")
    assert stopped.value.figures == {"key": TOK, "budget": 100, "spent": 150}
    assert q.get(parent.id).status == "awaiting_approval"
    assert sorted(a.task_id for a in q.approvals()) == sorted([parent.id, one.task_id, two.task_id])


def test_a_step_replayed_from_the_ledger_passes_a_spent_tree(q: leaseq.Queue) -> None:
    """Replaying a recorded step is not new work: only a step begun anew stops."""
    w = q.register_worker("w")
    parent, claim, [one, two] = parent_and_children(q, w, 100, actions=["search"])
    fx = q.begin_effect(w, two, "search", "c1:search")
    q.finish_effect(w, two, fx, {"hits": 3})
    assert q.consume(w, one, "c0:consume:0", TOK, 150)["state"] == "paused"
    assert q.begin_effect(w, two, "search", "c1:search").replayed
    assert q.spawn(w, claim, "child", {"n": 0}, key="c0", effect="idempotent").id == one.task_id  # replayed
    assert q.get(two.task_id).status == "running" and q.get(parent.id).status == "running"


def test_approving_with_a_raise_raises_the_owners_budget_and_resumes_repeating_nothing(q: leaseq.Queue) -> None:
    w, ops = q.register_worker("w"), q.register_worker("ops")
    parent, claim, [one, two] = parent_and_children(q, w, 100)
    assert q.consume(w, one, "c0:consume:0", TOK, 80)["state"] == "charged"
    assert q.consume(w, one, "c0:consume:1", TOK, 40)["state"] == "paused"
    with pytest.raises(BudgetSpent):
        q.begin_effect(w, two, "search", "c1:search")
    request = q.approval(one.task_id)
    with pytest.raises(InvalidInput) as err:  # the key must be one the owner's budget names
        q.approve(one.task_id, request.digest, raise_budget={"other": 5})
    assert err.value.field == "raise_budget" and q.get(parent.id).budget == {TOK: 100}
    approved = q.approve(one.task_id, request.digest, raise_budget={TOK: 100}, note="finish it", worker=ops)
    assert approved.status == "queued" and approved.budget is None
    assert q.get(parent.id).budget == {TOK: 200}  # the budget that ran out is the one raised
    [event] = [e for e in q.events(one.task_id) if e.type == "approved"]
    assert (event.detail["raise_budget"], event.detail["budget"], event.detail["owner"]) == (
        {TOK: 100}, {TOK: 200}, parent.id)
    [again] = q.claim(w, kinds=["child"])
    assert again.task_id == one.task_id
    for n in range(2):  # the recorded consumes are replayed: charged once
        assert q.consume(w, again, f"c0:consume:{n}", TOK, 999)["state"] == "replayed"
    assert q.consume(w, again, "c0:consume:2", TOK, 50)["state"] == "charged"  # 170 of 200
    q.complete(w, again, "done")
    assert q.get(one.task_id).spent == {TOK: 170}
    # the sibling stopped on the same budget asks on its own: approved, it resumes with room left
    q.approve(two.task_id, q.approval(two.task_id).digest, worker=ops)
    [sibling] = q.claim(w, kinds=["child"])
    assert q.begin_effect(w, sibling, "search", "c1:search").status == "pending"
    assert q.consume(w, sibling, "c1:consume:0", TOK, 40)["state"] == "paused"  # 210 of 200
    assert q.approval(two.task_id).detail == {"key": TOK, "budget": 200, "spent": 210, "units": 40,
                                              "owner": parent.id}


def test_the_parents_own_request_raises_its_own_budget(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    parent, claim, [one] = parent_and_children(q, w, 50, children=1)
    assert q.consume(w, one, "c0:consume:0", TOK, 60)["state"] == "paused"
    with pytest.raises(BudgetSpent):
        q.sleep(w, claim, "p:sleep:0", seconds=1)
    q.approve(parent.id, q.approval(parent.id).digest, raise_budget={TOK: 50})
    assert q.get(parent.id).budget == {TOK: 100} and q.get(parent.id).status == "queued"
    [claim] = q.claim(w, kinds=["parent"])
    assert q.sleep(w, claim, "p:sleep:0", seconds=0)["state"] == "resumed"  # 60 of 100: room again


def test_grandchildren_and_intents_count_against_every_budget_above_them(q: leaseq.Queue) -> None:
    """A grandchild's usage counts against the root's budget; an intent's execution against the
    budgets that cover the task that intended it; a nested budget (a budgeted task's tree
    inside another's) is charged too, and the one spent first (the root's) is named first."""
    w = q.register_worker("w")
    root, claim, [child] = parent_and_children(q, w, 1_000, children=1, actions=["intend:refund"])
    grandchild = q.spawn(w, child, "grandchild", key="g", effect="idempotent")
    intent = q.intend(w, child, "refund", key="r", queue="executors")
    [g] = q.claim(w, kinds=["grandchild"])
    [x] = q.claim(w, queue="executors")
    assert (g.task_id, x.task_id) == (grandchild.id, intent.id)
    assert q.consume(w, g, "g:consume:0", TOK, 600)["state"] == "charged"
    paused = q.consume(w, x, "x:consume:0", TOK, 500)
    assert paused["state"] == "paused" and paused["figures"] == {"key": TOK, "budget": 1_000, "spent": 1_100,
                                                                  "units": 500, "owner": root.id}
    with pytest.raises(BudgetSpent) as stopped:  # the child that intended it stops at its next step
        q.begin_effect(w, child, "search", "c:search")
    assert stopped.value.figures["owner"] == root.id
    # a budgeted task enqueued on its own is no one's descendant: untouched
    alone = q.enqueue("parent", budget={TOK: 10}, effect="idempotent")
    [mine] = q.claim(w, kinds=["parent"])
    assert mine.task_id == alone.id
    assert q.consume(w, mine, "a:consume:0", TOK, 5)["state"] == "charged"


def test_a_task_no_budget_covers_is_untouched(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    q.enqueue("parent")
    [claim] = q.claim(w, kinds=["parent"])
    child = q.spawn(w, claim, "child", key="c", effect="idempotent")
    [lease] = q.claim(w, kinds=["child"])
    assert q.consume(w, lease, "c:consume:0", TOK, 10**9)["state"] == "charged"
    assert q.begin_effect(w, lease, "search", "c:search").status == "pending"
    assert q.get(child.id).spent == {TOK: 10**9} and q.get(child.id).budget is None


# -- enqueue_many ----------------------------------------------------------------------------

def test_enqueue_many_gives_each_new_task_the_budget(q: leaseq.Queue) -> None:
    w = q.register_worker("w")
    kept = q.enqueue("agent", {"n": 0}, idempotency_key="k0", budget={TOK: 7})
    ids = q.enqueue_many("agent", [{"n": 0}, {"n": 1}, {"n": 2}], idempotency_keys=["k0", "k1", None],
                         budget={TOK: 100})
    assert ids[0] == kept.id and q.get(kept.id).budget == {TOK: 7}  # a task that was there keeps its own
    assert [q.get(i).budget for i in ids[1:]] == [{TOK: 100}, {TOK: 100}]
    claims = {c.task_id: c for c in q.claim(w, kinds=["agent"], limit=3)}
    # each its own budget: one task's spend is not another's
    assert q.consume(w, claims[ids[1]], "1:consume:0", TOK, 100)["state"] == "charged"
    assert q.consume(w, claims[ids[2]], "2:consume:0", TOK, 100)["state"] == "charged"
    assert q.consume(w, claims[ids[2]], "2:consume:1", TOK, 1)["state"] == "paused"
    assert q.consume(w, claims[kept.id], "0:consume:0", TOK, 8)["state"] == "paused"
    child = q.spawn(w, claims[ids[1]], "child", key="c")  # and it covers each task's tree
    [lease] = q.claim(w, kinds=["child"])
    assert lease.task_id == child.id
    assert q.consume(w, lease, "c:consume:0", TOK, 1)["figures"]["owner"] == ids[1]


@pytest.mark.parametrize("budget, field", [
    ({}, "budget"),
    ({TOK: 0}, f"budget[{TOK!r}]"),
    ("tokens", "budget"),
])
def test_enqueue_many_refuses_a_bad_budget_naming_the_field_and_writes_nothing(q: leaseq.Queue, budget: Any,
                                                                               field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        q.enqueue_many("agent", [{"n": 0}, {"n": 1}], budget=budget)
    assert err.value.field == field
    assert q.list_tasks() == []


# -- exact under concurrent consumers ------------------------------------------------------

CALL = 100  # one call's worth


def test_children_consuming_at_once_overshoot_the_parents_budget_by_at_most_one_call_each(
        q: leaseq.Queue, dsn: str) -> None:
    """Children on their own connections (threads) consume one call's worth at a time against
    their parent's budget: the consume statement decides, row-locked root-first, so the tree's
    spend passes the budget by at most one call for each child, every child stops, and the
    spend the database holds is exactly what the children's ledgers record."""
    budget, children = 2_000, 6
    w = q.register_worker("w")
    parent, claim, leases = parent_and_children(q, w, budget, children=children, lease_seconds=120)
    errors: list[BaseException] = []
    start = threading.Barrier(children)

    def work(n: int, lease: leaseq.Claim) -> None:
        queue = leaseq.connect(dsn)
        rng = random.Random(n)
        try:
            start.wait()
            for step in range(budget):
                time.sleep(rng.uniform(0, 0.003))  # the call
                try:
                    answer = queue.consume(w, lease, f"c{n}:consume:{step}", TOK, rng.randint(CALL // 2, CALL))
                except BudgetSpent:
                    return
                if answer["state"] == "paused":
                    return
                try:  # the next call's ledger step: a spent tree stops the child here
                    queue.begin_effect(w, lease, "llm.call", f"c{n}:llm:{step}", effect="read_only",
                                       args_digest="0" * 64)
                except BudgetSpent:
                    return
        except BaseException as exc:
            errors.append(exc)
        finally:
            queue.close()

    threads = [threading.Thread(target=work, args=(n, lease)) for n, lease in enumerate(leases)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors
    assert all(q.get(c.task_id).status == "awaiting_approval" for c in leases)
    used = sum(e.response["units"] for c in leases for e in q.effects(c.task_id) if e.action == "leaseq.consume")
    assert sum(q.get(c.task_id).spent[TOK] for c in leases) == used
    assert budget < used <= budget + children * CALL, used
    # the database's figure for the tree is the ledgers' sum: no charge lost or doubled
    with pytest.raises(BudgetSpent) as stopped:
        q.begin_effect(w, claim, "llm.call", "p:llm:0", effect="read_only", args_digest="0" * 64)
    assert stopped.value.figures == {"key": TOK, "budget": budget, "spent": used}
    assert q.get(parent.id).status == "awaiting_approval"
