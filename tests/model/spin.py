"""Running spin on model/lease.pml: the verifier of each variant, random runs, and the replay of a trace.

The verifier is compiled once per set of -D flags (a few seconds, most of it
gcc at -O0). A trace is the model's own events (``EV ...`` lines, printed by
each transition) turned into the evidence trail's form, so that
leaseq_chaos.traces replays it as it replays a real one; :func:`replay`
turns such a trail back into Promela and lets spin say whether the model
allows it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from system_tools import require_tools

MODEL = Path(__file__).resolve().parents[2] / "model" / "lease.pml"
#: the task's max_attempts in the model (MAXA)
MAX_ATTEMPTS = 2
_TO = {"QUEUED": "queued", "DEAD": "dead", "BLOCKED": "blocked", "RECON": "needs_reconciliation",
       "RUNNING": "running", "COMPLETED": "completed", "CANCELLED": "cancelled", "AWAITING": "awaiting_approval",
       "DENIED": "denied"}
_FROM = {v: k for k, v in _TO.items()}
_OUTCOME = {"R_COMPLETED": "completed", "R_REQUEUE": "requeue", "R_CANCEL": "cancel"}
_EFFECT = {"IDEMPOTENT": "idempotent", "SIDE_EFFECT": "side_effect"}


def need_spin() -> None:
    """Skip (fail in CI) without spin and gcc."""
    require_tools(["spin", "gcc"])


@dataclass
class Verdict:
    """What one pan run said."""

    errors: int
    states: int
    transitions: int
    output: str
    trail: list[str]


class Verifier:
    """The model compiled with some -D flags, in a folder of its own."""

    def __init__(self, folder: Path, flags: tuple[str, ...] = (), *, liveness: bool = False):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(MODEL, folder / "lease.pml")
        subprocess.run(["spin", *(f"-D{f}" for f in flags), "-a", "lease.pml"], cwd=folder, check=True,
                       capture_output=True, text=True, timeout=60)
        cc = ["-DNFAIR=3"] if liveness else ["-DSAFETY", "-DNOCLAIM"]
        subprocess.run(["gcc", "-O0", *cc, "-o", "pan", "pan.c"], cwd=folder, check=True,
                       capture_output=True, text=True, timeout=120)
        self.flags = flags

    def run(self, *args: str) -> Verdict:
        out = subprocess.run(["./pan", "-m200000", *args], cwd=self.folder, capture_output=True, text=True,
                             timeout=120).stdout
        errors = int(re.search(r"errors: (\d+)", out).group(1))
        states = int(re.search(r"(\d+) states, stored", out).group(1))
        transitions = int(re.search(r"(\d+) transitions", out).group(1))
        trail: list[str] = []
        if errors and (self.folder / "lease.pml.trail").exists():
            shown = subprocess.run(["spin", *(f"-D{f}" for f in self.flags), "-t", "lease.pml"], cwd=self.folder,
                                   capture_output=True, text=True, timeout=60).stdout
            trail = [line.strip() for line in shown.splitlines() if line.strip().startswith("EV ")]
        return Verdict(errors, states, transitions, out, trail)


def simulate(folder: Path, seed: int, steps: int = 400) -> list[str]:
    """The EV lines of one random run of the model."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "lease.pml").exists():
        shutil.copy(MODEL, folder / "lease.pml")
    out = subprocess.run(["spin", f"-n{seed}", f"-u{steps}", "lease.pml"], cwd=folder, capture_output=True,
                         text=True, timeout=60).stdout
    return [line.strip() for line in out.splitlines() if line.strip().startswith("EV ")]


def to_trail(lines: list[str]) -> list[dict[str, Any]]:
    """The model's EV lines as an evidence trail (with the status events the implementation writes
    after a routing that does not queue the task again)."""
    trail: list[dict[str, Any]] = []

    def ev(type_: str, g: Any = None, w: Any = None, **detail: Any) -> None:
        trail.append({"type": type_, "generation": None if g in (None, 0) else int(g),
                      "worker_id": None if w is None else f"w{w}", "detail": detail})

    for line in lines:
        word = line.split()[1:]
        kind, args = word[0], word[1:]
        if kind == "enqueued":
            ev("enqueued", effect=_EFFECT[args[0]])
            if args[1] == "AWAITING":
                ev("approval_requested")
        elif kind in ("claimed", "renewed", "completed", "effect_intent", "effect_response", "lease_revoked"):
            extra = {"effect_id": 1} if kind.startswith("effect_") else {}
            ev(kind, args[0], args[1], **extra)
        elif kind in ("failed", "lease_released", "lease_expired"):
            to = _TO[args[2]]
            ev(kind, args[0], args[1], **{"next_status" if kind == "failed" else "routed_to": to})
            if to != "queued":
                ev(to, args[0], args[1])
        elif kind == "cancelled":
            ev("cancelled", args[0])
        elif kind == "worker_revoked":
            ev("worker_revoked", None, args[0])
        elif kind == "reconciled":
            ev("reconciled", outcome=_OUTCOME[args[0]])
        elif kind in ("approved", "denied", "requeued", "unblocked"):
            ev(kind)
        elif kind == "downstream":
            continue  # the fence's ledger, not the task's trail
        else:
            raise ValueError(f"unknown model event {line!r}")
    return trail


def _replay_step(e: dict[str, Any]) -> str:
    """One event of a trail as Promela: applied if the model allows it, else the replay stops."""
    t, g = e["type"], e.get("generation") or 0
    w = int(e["worker_id"][1:]) if e.get("worker_id") else 0
    d = e.get("detail") or {}
    to = _FROM.get(d.get("next_status") or d.get("routed_to") or "", "QUEUED")
    guard, act, then = "false", "skip", ""
    if t == "enqueued":
        guard, act = "true", f"eff = {'SIDE_EFFECT' if d.get('effect') == 'side_effect' else 'IDEMPOTENT'}"
    elif t == "approval_requested":
        guard, act = "status == QUEUED", "status = AWAITING"
    elif t == "claimed":
        guard, act = f"CAN_CLAIM({w}) && gen + 1 == {g}", f"do_claim({w})"
    elif t == "renewed":
        guard, act = f"CAN_RENEW({w}, {g})", f"do_renew({w}, {g})"
    elif t == "completed":
        guard, act = f"CAN_COMPLETE({w}, {g})", f"do_complete({w}, {g})"
    elif t == "failed":
        guard, act = f"CAN_FAIL({w}, {g}, {to})", f"do_fail({w}, {g}, {to})"
    elif t == "lease_released":
        guard, act = f"CAN_RELEASE({w}, {g}) && ROUTE_TO == {to}", f"do_release({w}, {g})"
    elif t == "lease_expired":
        guard = f"status == RUNNING && gen == {g} && owner == {w}"
        act = f"if :: live -> do_expire() :: else -> skip fi; if :: ROUTE_TO == {to} -> do_route() :: else -> goto rejected fi"
    elif t == "effect_intent":
        guard, act = f"CAN_BEGIN({w}, {g}) && !(intent_open && intent_gen == {g})", f"do_begin({w}, {g})"
    elif t == "effect_response":
        guard, act = f"CAN_FINISH({w}, {g})", f"do_finish({w}, {g})"
    elif t == "cancelled":
        guard, act = f"CAN_CANCEL && ({g} == 0 || gen == {g})", "do_cancel()"
    elif t == "worker_revoked":
        guard = "true"
        act = f"if :: status == RUNNING && owner == {w} -> want_revoked = true; want_gen = gen :: else -> skip fi; do_revoke({w})"
    elif t == "lease_revoked":
        guard = f"status == RUNNING && owner == {w} && gen == {g}"
        act = f"do_revoke({w})"
    elif t == "reconciled":
        out = {"completed": "R_COMPLETED", "requeue": "R_REQUEUE", "cancel": "R_CANCEL"}[d.get("outcome", "requeue")]
        guard, act = "CAN_RECONCILE", f"do_reconcile({out})"
    elif t in ("approved", "denied", "requeued", "unblocked"):
        name = {"approved": "APPROVE", "denied": "DENY", "requeued": "REQUEUE", "unblocked": "UNBLOCK"}[t]
        guard, act = f"CAN_{name}", f"do_{name.lower()}()"
    if t in ("dead", "blocked", "needs_reconciliation"):  # the status event a routing owes
        return (f"  if :: want_status == {_FROM[t]} && (want_gen == 0 || {g} == 0 || want_gen == {g}) -> "
                f"want_status = NOSTATUS; want_gen = 0 :: else -> goto rejected fi;\n  n++;\n")
    pending = ("  if :: want_status != NOSTATUS -> goto rejected :: else -> skip fi;\n"
               "  if :: want_revoked -> if :: " + (f"{g} == want_gen" if t == "lease_revoked" else "false")
               + " -> want_revoked = false; want_gen = 0; revoked[" + str(w) + "] = true; n++; goto next" + str(id(e))
               + " :: else -> goto rejected fi :: else -> skip fi;\n")
    if t in ("failed", "lease_released", "lease_expired"):
        then = f"; if :: {to} != QUEUED -> want_status = {to}; want_gen = {g} :: else -> skip fi"
    return (pending + f"  if :: {guard} -> {act}{then} :: else -> goto rejected fi;\n  n++;\n"
            f"next{id(e)}: skip;\n")


def replay(folder: Path, trail: list[dict[str, Any]]) -> int | None:
    """Whether the Promela model allows ``trail``: None if it does, else the index of the first
    event it refuses (spin's own interpreter, no compilation)."""
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "lease.pml").exists():
        shutil.copy(MODEL, folder / "lease.pml")
    body = "".join(_replay_step(e) for e in trail)
    text = ("#define REPLAY\n#include \"lease.pml\"\nmtype = { NOSTATUS };\n"
            "mtype want_status = NOSTATUS;\nbyte want_gen = 0;\nbool want_revoked = false;\nint n = 0;\n"
            "init {\n" + body +
            "  if :: want_status != NOSTATUS || want_revoked -> goto rejected :: else -> skip fi;\n"
            "  printf(\"ACCEPT\\n\"); goto done;\nrejected: printf(\"REJECT %d\\n\", n);\ndone: skip\n}\n")
    (folder / "replay.pml").write_text(text)
    out = subprocess.run(["spin", "replay.pml"], cwd=folder, capture_output=True, text=True, timeout=60)
    found = re.search(r"(ACCEPT|REJECT (\d+))", out.stdout)
    if found is None:
        raise RuntimeError(f"spin could not replay the trail:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}\n{text}")
    return None if found.group(1) == "ACCEPT" else int(found.group(2))
