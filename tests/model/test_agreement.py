"""The Python transcription (leaseq_chaos.model, replayed by leaseq_chaos.traces) and the Promela
model give the same verdict on the same traces.

Random runs of the model (spin's simulation, seeded) give traces the model
allows: the Python replay must allow every one. Each is then altered (an
event dropped, two swapped, a generation or a worker changed, an event
repeated) and both replays judge the result: they must agree on whether it
is allowed, and on the first event refused. Cost: about 2 s (spin's
interpreter, no compilation).
"""

from __future__ import annotations

import copy
import random

import pytest

from leaseq_chaos.traces import validate_trail

from .spin import MAX_ATTEMPTS, need_spin, replay, simulate, to_trail

pytestmark = pytest.mark.timeout(300)
SEEDS = range(1, 25)
TASK = {"id": 1, "max_attempts": MAX_ATTEMPTS}


def altered(trail: list[dict], rng: random.Random) -> list[dict]:
    """``trail`` with one random change."""
    out = copy.deepcopy(trail)
    i = rng.randrange(1, len(out))
    how = rng.choice(["drop", "swap", "generation", "worker", "repeat"])
    if how == "drop":
        del out[i]
    elif how == "swap" and i + 1 < len(out):
        out[i], out[i + 1] = out[i + 1], out[i]
    elif how == "generation" and out[i].get("generation"):
        out[i]["generation"] += rng.choice([-1, 1])
    elif how == "worker" and out[i].get("worker_id"):
        out[i]["worker_id"] = "w1" if out[i]["worker_id"] == "w0" else "w0"
    else:
        out.insert(i, copy.deepcopy(out[i]))
    return out


def test_random_runs_of_the_model_are_valid_trails_for_the_python_replay(tmp_path):
    need_spin()
    judged = 0
    for seed in SEEDS:
        trail = to_trail(simulate(tmp_path, seed))
        verdict = validate_trail(trail, task=TASK)
        assert verdict is None, (seed, verdict, trail)
        assert replay(tmp_path, trail) is None, (seed, trail)
        judged += len(trail)
    assert judged > 100  # the runs went somewhere


def test_both_replays_agree_on_altered_traces(tmp_path, capsys):
    need_spin()
    rng = random.Random(7)
    refused = agreed = 0
    for seed in SEEDS:
        trail = to_trail(simulate(tmp_path, seed))
        if len(trail) < 3:
            continue
        for _ in range(3):
            bent = altered(trail, rng)
            python = validate_trail(bent, task=TASK)
            promela = replay(tmp_path, bent)
            assert (python is None) == (promela is None), (seed, python, promela, bent)
            if python is not None:
                assert python["index"] == promela, (seed, python, promela, bent)
                refused += 1
            agreed += 1
    with capsys.disabled():
        print(f"\nagreement: {agreed} altered traces, {refused} refused by both")
    assert refused >= 10  # the alterations do break traces, and both replays see it
