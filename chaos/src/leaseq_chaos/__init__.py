"""Proof under faults: ``leaseq chaos``, in the spirit of Jepsen's checkers.

Real worker processes run a mixed workload against a real database while a
fault injector kills, freezes, disconnects and restarts things on seeded
schedules; every process records what it tried and what came of it; a
checker then judges the whole history and the final state against the
promises leaseq makes (no task lost, no stale completion, no side effect
applied twice, no stale downstream write). See docs/reliability.md.

Modules: :mod:`.config` (the knobs), :mod:`.runner` (one run),
:mod:`.workload` (task mix and handlers), :mod:`.worker_process` (a worker's
entry point), :mod:`.fleet` (the processes), :mod:`.faults` (the injector),
:mod:`.proxy` (loopback TCP proxy), :mod:`.pgserver` (a throwaway
PostgreSQL), :mod:`.probe` (the stale-writer probe), :mod:`.history` (the
recorder) and :mod:`.checker` (the invariants).
"""
