"""The model of the lease protocol (model/lease.pml), checked exhaustively by spin.

* Safety: every assertion of the model holds in every reachable state.
* Liveness, under weak fairness: every expired lease is eventually routed;
  every queued task is eventually claimed (or leaves the queue otherwise)
  while a worker is alive.
* The properties are not vacuous: with each guard removed (-D flag), spin
  finds a counterexample, and the assertion it breaks is the one that guard
  keeps.

State counts go to the test output (pytest -s, or the -rA summary). Cost:
one verifier compiled per variant (gcc -O0, about a second each), each
search well under a second at these bounds.
"""

from __future__ import annotations

import pytest

from .spin import Verifier, need_spin

pytestmark = pytest.mark.timeout(300)

#: each guard, the -D flag that removes it, and the property whose assertion must then fail
MUTATIONS = {
    "NO_GEN_CHECK": "g == unended",                    # a superseded generation's write accepted
    "NO_LIVE_CHECK": "g == unended",                   # a write accepted after the lease ran out
    "NO_ROUTING_RULE": "&&intent_open",               # a side-effect task claimed with its intent open
    "NO_REVOKE_SERIAL": "revoked[owner]",              # a revoked worker left holding a live lease
    "NO_FENCE_CHECK": "g == unended",                  # the downstream took a stale token
}


def test_every_safety_property_holds(tmp_path, capsys):
    need_spin()
    verdict = Verifier(tmp_path / "safety").run()
    with capsys.disabled():
        print(f"\nlease.pml safety: {verdict.states} states, {verdict.transitions} transitions, "
              f"{verdict.errors} errors")
    assert verdict.errors == 0, verdict.output
    assert verdict.states > 10_000  # the whole space of two workers, one task, every operator action


@pytest.mark.parametrize("name", ["expired_routed", "queued_claimed"])
def test_liveness_under_weak_fairness(tmp_path, capsys, name):
    need_spin()
    verdict = Verifier(tmp_path / name, liveness=True).run("-a", "-f", "-N", name)
    with capsys.disabled():
        print(f"\nlease.pml {name}: {verdict.states} states, {verdict.errors} errors")
    assert verdict.errors == 0, verdict.output
    assert "acceptance   cycles \t+ (fairness enabled)" in verdict.output


@pytest.mark.parametrize("flag", sorted(MUTATIONS))
def test_each_guard_removed_yields_a_counterexample(tmp_path, capsys, flag):
    need_spin()
    verdict = Verifier(tmp_path / flag, (flag,)).run()
    with capsys.disabled():
        print(f"\nlease.pml -D{flag}: counterexample after {verdict.states} states: " + " | ".join(verdict.trail))
    assert verdict.errors >= 1, f"-D{flag} left every property standing:\n{verdict.output}"
    violated = next(line for line in verdict.output.splitlines() if "assertion violated" in line)
    assert MUTATIONS[flag].replace(" ", "") in violated, violated
    assert verdict.trail and verdict.trail[0].startswith("EV enqueued"), "the counterexample has no events"
