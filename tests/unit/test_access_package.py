"""Access control is one package (:mod:`leaseq.access`): each rule of it written once.

The old modules (``leaseq.auth``, ``leaseq.authz``) hand out the package's own objects, and
the link between a worker and the token that registered it is read by one operation
(:func:`leaseq.engine.common.worker_token`), whatever asks: the service's checks (cached,
inside a request's transaction, blocking or awaited), the operator's revocation, an
approval's requester check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import leaseq.access
from leaseq import auth, authz

SRC = Path(__file__).resolve().parents[2] / "src" / "leaseq"


@pytest.mark.parametrize("module", [auth, authz])
def test_the_old_import_paths_hand_out_the_access_packages_own_objects(module: object) -> None:
    public = [name for name in vars(module) if not name.startswith("_") and name != "annotations"]
    assert public
    for name in public:
        assert getattr(module, name) is getattr(leaseq.access, name), name


def test_the_token_that_registered_a_worker_is_read_in_one_place() -> None:
    reads = re.compile(r"""\b(?:one|row|rows)\(\s*["']worker_token["']""")
    found = sorted(str(path.relative_to(SRC)) for path in SRC.rglob("*.py") if reads.search(path.read_text()))
    assert found == ["engine/common.py"]


def test_access_is_decided_by_the_package_not_by_hand_in_the_pages() -> None:
    """The dashboard's and the API's pages ask :func:`leaseq.access.authorize` (or ``can``) what a
    principal may read: none compares a task's queue with the token's queues itself."""
    by_hand = re.compile(r"may_use_queue\(\s*task\.queue|\.queues is None else")
    found = sorted(str(path.relative_to(SRC)) for path in (SRC / "service").rglob("*.py")
                   if by_hand.search(path.read_text()))
    assert found == []
