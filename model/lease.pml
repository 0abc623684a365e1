/*
 * leaseq's lease protocol, as a Promela model for the spin model checker.
 *
 * One task, NW workers, the queue, the effect ledger, a downstream fence,
 * the clock and an operator. Every transition is one transaction of the
 * queue (atomic here, as the database makes it), written once as a pair:
 *
 *   CAN_<T>(args)   when the queue accepts it (the guard of the SQL)
 *   do_<T>(args)    what it changes, and the event it records
 *
 * The processes at the bottom (workers, claimers, clock, sweeper, operator)
 * choose transitions nondeterministically; the REPLAY process instead
 * applies a recorded trace, one event at a time, and says which event, if
 * any, the model does not allow. leaseq_chaos.model is a transcription of
 * this file into Python, kept in step with it by tests/model.
 *
 * What a worker knows: every generation it was ever handed (known[w]). It
 * may use any of them at any later time, which models a paused worker, a
 * message delayed in the network, and a worker that never noticed it lost
 * its lease. A lost request is a step never taken; a lost reply is a claim
 * whose generation the worker never learns. The clock is nondeterministic:
 * a live lease may run out at any moment.
 *
 * Mutations (each a guard removed; each must yield a counterexample):
 *   -DNO_GEN_CHECK      the lease guard ignores the claim generation
 *   -DNO_LIVE_CHECK     the lease guard ignores the deadline
 *   -DNO_ROUTING_RULE   an expired side-effect lease with an open intent is queued again
 *   -DNO_REVOKE_SERIAL  a claim reads the worker row, and takes the task in a later step
 *   -DNO_FENCE_CHECK    the downstream accepts any token
 *
 * Run it: see docs/explanation/model.md (or tests/model/test_spin.py).
 */

#ifndef NW
#define NW 2
#endif
#define NONE 255        /* no owner */
#define MAXA 2          /* the task's max_attempts */
#define MAXG 8          /* generations are below this (bits of the masks) */

mtype = { QUEUED, RUNNING, COMPLETED, CANCELLED, DEAD, RECON, BLOCKED, AWAITING, DENIED };
mtype = { IDEMPOTENT, SIDE_EFFECT };
/* reconcile outcomes */
mtype = { R_COMPLETED, R_REQUEUE, R_CANCEL };

/* ---- the task row (what the queue's database holds) -------------------- */
mtype status = QUEUED;
mtype eff = IDEMPOTENT;  /* the effect class, which decides routing */
byte gen = 0;            /* claim_generation */
byte owner = NONE;       /* lease_owner */
bool live = false;       /* lease_expires_at is in the future */
byte attempts = 0;
bool revoked[NW];        /* the worker rows */

/* ---- the effect ledger: one action of the task ------------------------- */
bool intent_open = false;
byte intent_gen = 0;

/* ---- the downstream fence: the newest token it accepted ------------------ */
byte fence_newest = 0;
bool online = true;      /* reference tokens: the fence asks the queue; else signed tokens, offline */

/* ---- what the workers hold ---------------------------------------------- */
int known[NW];           /* generations handed to worker w (bit g) */
int begun[NW];           /* generations under which worker w began the effect (it holds a token) */

/* ---- ghosts: bookkeeping for the properties, never read by a guard ------- */
byte unended = 0;        /* the generation whose lease has not ended, by whatever means (0: none) */
byte completed_by = 0;   /* the generation that completed the task */
bool cancelled_ever = false;
byte ds_max = 0;         /* the newest token the downstream accepted */

/* ---- the operator's budget (keeps the state space finite) --------------- */
bool did_cancel, did_revoke, did_reconcile, did_requeue, did_unblock, did_approve;

#define BIT(g) (1 << (g))

/* THE LEASE GUARD: running, held by w, under generation g, live by the clock. */
#ifdef NO_GEN_CHECK
#define GEN_OK(g) true
#else
#define GEN_OK(g) (gen == (g))
#endif
#ifdef NO_LIVE_CHECK
#define LIVE_OK true
#else
#define LIVE_OK live
#endif
#define HOLDS(w, g) (status == RUNNING && owner == (w) && GEN_OK(g) && LIVE_OK)

/* The properties that hold in every state. */
#define REVOKED_HOLD_NOTHING (!(status == RUNNING && live && owner != NONE && revoked[owner]))
inline invariants() {
  assert(REVOKED_HOLD_NOTHING);            /* a revoked worker holds no live lease */
  assert(gen < MAXG)
}

/* A lease-backed write by (w, g) was accepted: the attempt must be the one live attempt. */
inline accepted(w, g) {
  assert(g == unended);                    /* nothing is accepted from an attempt whose lease ended */
  assert(g == gen);                        /* ...nor from one a newer claim superseded */
  assert(!cancelled_ever)                  /* a cancelled task never runs again */
}

inline end_lease() {
  live = false;
  unended = 0
}

/* THE RECOVERY POLICY (route_expired, fail_task): where an ended attempt sends the task. */
#ifdef NO_ROUTING_RULE
#define RECON_DUE false
#else
#define RECON_DUE (eff == SIDE_EFFECT && intent_open)
#endif
#define ROUTE_TO (RECON_DUE -> RECON : (attempts >= MAXA -> DEAD : QUEUED))

/* ---- transitions --------------------------------------------------------- */

/* claim: a queued task to a worker that is not revoked (claim_batch) */
#ifdef NO_REVOKE_SERIAL
#define CAN_CLAIM(w) (status == QUEUED)
#else
#define CAN_CLAIM(w) (status == QUEUED && !revoked[w])
#endif
inline do_claim(w) {
  assert(unended == 0);                    /* at most one attempt at a time: every earlier lease ended */
  assert(!(eff == SIDE_EFFECT && intent_open));  /* never re-claimed with an open side-effect intent */
  assert(!cancelled_ever);
  status = RUNNING; gen++; attempts++; owner = w; live = true;
  unended = gen;
  printf("EV claimed %d %d\n", gen, w)
}

/* renew (renew_leases): nothing changes but the deadline, which the clock here does not see */
#define CAN_RENEW(w, g) HOLDS(w, g)
inline do_renew(w, g) {
  accepted(w, g);
  printf("EV renewed %d %d\n", g, w)
}

/* complete (complete_batch) */
#define CAN_COMPLETE(w, g) HOLDS(w, g)
inline do_complete(w, g) {
  accepted(w, g);
  assert(completed_by == 0);               /* completed once */
  completed_by = g;
  end_lease(); status = COMPLETED; owner = NONE;
  printf("EV completed %d %d\n", g, w)
}

/* fail (fail_task): the worker asks for a retry, a permanent failure or a block; an open
   side-effect intent overrides it all */
#define CAN_FAIL(w, g, to) (HOLDS(w, g) && \
    (RECON_DUE -> to == RECON : \
     (to == DEAD || to == BLOCKED || (to == QUEUED && attempts < MAXA))))
inline do_fail(w, g, to) {
  accepted(w, g);
  end_lease(); status = to; owner = NONE;
  printf("EV failed %d %d %e\n", g, w, to)
}

/* release (expire_lease + route_expired in one transaction) */
#define CAN_RELEASE(w, g) HOLDS(w, g)
inline do_release(w, g) {
  accepted(w, g);
  end_lease(); status = ROUTE_TO; owner = NONE;
  printf("EV lease_released %d %d %e\n", g, w, status)
}

/* begin_effect: the intent is recorded before the action (a second call of the
   same attempt records nothing new) */
#define CAN_BEGIN(w, g) HOLDS(w, g)
inline do_begin(w, g) {
  accepted(w, g);
  if
  :: intent_open && intent_gen == g -> skip
  :: else ->
     intent_open = true; intent_gen = g;
     printf("EV effect_intent %d %d\n", g, w)
  fi
}

/* finish_effect: the response recorded, under the attempt that holds the intent */
#define CAN_FINISH(w, g) (HOLDS(w, g) && intent_open && intent_gen == g)
inline do_finish(w, g) {
  accepted(w, g);
  intent_open = false;
  printf("EV effect_response %d %d\n", g, w)
}

/* the clock: a live lease runs out (no event: the next routing records it) */
#define CAN_EXPIRE (status == RUNNING && live)
inline do_expire() {
  end_lease()
}

/* routing an expired lease (lock_expired + route_expired) */
#define CAN_ROUTE (status == RUNNING && !live)
inline do_route() {
  printf("EV lease_expired %d %d %e\n", gen, owner, ROUTE_TO);
  status = ROUTE_TO; owner = NONE
}

/* cancel (cancel_task): any unfinished task; a lease it held ends */
#define CAN_CANCEL (status != COMPLETED && status != CANCELLED && status != DENIED)
inline do_cancel() {
  if
  :: status == RUNNING -> end_lease()
  :: else -> skip
  fi;
  status = CANCELLED; owner = NONE; cancelled_ever = true;
  printf("EV cancelled %d\n", gen)
}

/* revoke_worker + end_worker_leases, one transaction: the lease of a running task it
   holds ends, expired or not (the routing follows) */
#define CAN_REVOKE(w) (!revoked[w])
inline do_revoke(w) {
  revoked[w] = true;
  printf("EV worker_revoked %d\n", w);
  if
  :: status == RUNNING && owner == w ->
     end_lease();
     printf("EV lease_revoked %d %d\n", gen, w)
  :: else -> skip
  fi
}

#define CAN_APPROVE (status == AWAITING)
inline do_approve() { status = QUEUED; printf("EV approved\n") }
#define CAN_DENY (status == AWAITING)
inline do_deny() { status = DENIED; printf("EV denied\n") }

/* reconcile: a person settles the open intents and decides */
#define CAN_RECONCILE (status == RECON)
inline do_reconcile(outcome) {
  intent_open = false;
  if
  :: outcome == R_COMPLETED -> status = COMPLETED
  :: outcome == R_REQUEUE -> status = QUEUED
  :: outcome == R_CANCEL -> status = CANCELLED; cancelled_ever = true
  fi;
  printf("EV reconciled %e\n", outcome)
}

#define CAN_REQUEUE (status == DEAD)
inline do_requeue() { status = QUEUED; attempts = 0; printf("EV requeued\n") }
#define CAN_UNBLOCK (status == BLOCKED)
inline do_unblock() { status = QUEUED; printf("EV unblocked\n") }

/* the downstream fence: a write carrying the attempt's token g */
#ifdef NO_FENCE_CHECK
#define FENCE_OK(g) true
#else
#define FENCE_OK(g) (g >= fence_newest && (!online || (status == RUNNING && gen == g && live)))
#endif
inline do_write(g) {
  assert(g >= ds_max);                     /* never older than a write it accepted */
  assert(!online || g == unended);         /* online, never from an attempt whose lease ended */
  ds_max = g;
  if :: g > fence_newest -> fence_newest = g :: else -> skip fi;
  printf("EV downstream %d\n", g)
}

#ifndef REPLAY
/* ---- the system: who takes which step ------------------------------------ */

/* g := one of the generations in mask m for which OK(g) holds; not executable if none */
#define PICK(m, g, OK) \
  if \
  :: ((m) & BIT(1)) && OK(1) -> g = 1 \
  :: ((m) & BIT(2)) && OK(2) -> g = 2 \
  :: ((m) & BIT(3)) && OK(3) -> g = 3 \
  :: ((m) & BIT(4)) && OK(4) -> g = 4 \
  :: ((m) & BIT(5)) && OK(5) -> g = 5 \
  :: ((m) & BIT(6)) && OK(6) -> g = 6 \
  :: ((m) & BIT(7)) && OK(7) -> g = 7 \
  fi

/* A worker: any lease-backed call, with any generation it was ever handed. A refused
   call changes nothing (and is left out: it would only repeat the state). */
proctype worker(byte w) {
  byte g;
#define RENEW_OK(x) CAN_RENEW(w, x)
#define COMPLETE_OK(x) CAN_COMPLETE(w, x)
#define FAIL_OK(x) (CAN_FAIL(w, x, QUEUED) || CAN_FAIL(w, x, DEAD) || CAN_FAIL(w, x, BLOCKED) || CAN_FAIL(w, x, RECON))
#define RELEASE_OK(x) CAN_RELEASE(w, x)
#define BEGIN_OK(x) CAN_BEGIN(w, x)
#define FINISH_OK(x) CAN_FINISH(w, x)
end:
  do
  :: atomic { PICK(known[w], g, RENEW_OK); do_renew(w, g); invariants(); g = 0 }
  :: atomic { PICK(known[w], g, COMPLETE_OK); do_complete(w, g); invariants(); g = 0 }
  :: atomic { PICK(known[w], g, FAIL_OK);
       if
       :: CAN_FAIL(w, g, QUEUED) -> do_fail(w, g, QUEUED)
       :: CAN_FAIL(w, g, DEAD) -> do_fail(w, g, DEAD)
       :: CAN_FAIL(w, g, BLOCKED) -> do_fail(w, g, BLOCKED)
       :: CAN_FAIL(w, g, RECON) -> do_fail(w, g, RECON)
       fi;
       invariants(); g = 0 }
  :: atomic { PICK(known[w], g, RELEASE_OK); do_release(w, g); invariants(); g = 0 }
  :: atomic { PICK(known[w], g, BEGIN_OK); do_begin(w, g); begun[w] = begun[w] | BIT(g); invariants(); g = 0 }
  :: atomic { PICK(known[w], g, FINISH_OK); do_finish(w, g); invariants(); g = 0 }
  :: atomic { PICK(begun[w], g, FENCE_OK); do_write(g); g = 0 }
  od
}

/* A worker's claim loop, a process of its own so that weak fairness speaks of it. The
   reply may be lost: then the worker never learns its generation. */
proctype claimer(byte w) {
#ifdef NO_REVOKE_SERIAL
  bool seen = false;
end_seen:
  do
  :: atomic { !seen && status == QUEUED && !revoked[w] -> seen = true }  /* the worker row, read */
  :: atomic { seen ->                                                     /* the task, taken later */
       if
       :: CAN_CLAIM(w) -> do_claim(w); if :: known[w] = known[w] | BIT(gen) :: skip fi; invariants()
       :: else -> skip
       fi;
       seen = false }
  od
#else
end:
  do
  :: atomic { CAN_CLAIM(w) -> do_claim(w); if :: known[w] = known[w] | BIT(gen) :: skip fi; invariants() }
  od
#endif
}

proctype clock() {
end:
  do
  :: atomic { CAN_EXPIRE -> do_expire(); invariants() }
  od
}

/* the claim's routing step and the maintenance sweep */
proctype sweeper() {
end:
  do
  :: atomic { CAN_ROUTE -> do_route(); invariants() }
  od
}

/* An operator, each action at most once. Only worker 0 can be revoked: worker 1
   stays alive, for the liveness of claims. */
proctype operator() {
  mtype outcome;
end:
  do
  :: atomic { !did_cancel && CAN_CANCEL -> did_cancel = true; do_cancel(); invariants() }
  :: atomic { !did_revoke && CAN_REVOKE(0) -> did_revoke = true; do_revoke(0); invariants() }
  :: atomic { !did_approve && CAN_APPROVE -> did_approve = true; do_approve(); invariants() }
  :: atomic { !did_approve && CAN_DENY -> did_approve = true; do_deny(); invariants() }
  :: atomic { !did_reconcile && CAN_RECONCILE -> did_reconcile = true;
       if :: outcome = R_COMPLETED :: outcome = R_REQUEUE :: outcome = R_CANCEL fi;
       do_reconcile(outcome); invariants(); outcome = 0 }
  :: atomic { !did_unblock && CAN_UNBLOCK -> did_unblock = true; do_unblock(); invariants() }
  od
}

init {
  byte i = 0;
  atomic {
    if :: eff = IDEMPOTENT :: eff = SIDE_EFFECT fi;
    if :: status = QUEUED :: status = AWAITING fi;
    if :: online = true :: online = false fi;
    printf("EV enqueued %e %e\n", eff, status);
    do
    :: i < NW -> run worker(i); run claimer(i); i++
    :: else -> break
    od;
    run clock(); run sweeper(); run operator();
    i = 0
  }
}

/* Liveness, under weak fairness (pan -a -f -N <name>). */
ltl expired_routed { [] ((status == RUNNING && !live) -> <> !(status == RUNNING && !live)) }
ltl queued_claimed { [] (status == QUEUED -> <> (status != QUEUED)) }
#endif
