"""Input rules, retry backoff and error fingerprints (pure functions, no database)."""

from __future__ import annotations

import random
import sys
from typing import Any

import pytest

from leaseq.core import policy
from leaseq.core.errors import InvalidInput


class FixedRandom(random.Random):
    """A random source that always returns ``value``."""

    def __init__(self, value: float):
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


LOW, HIGH = FixedRandom(0.0), FixedRandom(0.999999)


# -- backoff -------------------------------------------------------------------


@pytest.mark.parametrize("attempt", [1, 2, 3, 5, 10, 12])
def test_backoff_lies_between_half_and_all_of_the_ceiling(attempt: int) -> None:
    ceiling = min(policy.BACKOFF_CAP_SECONDS, policy.BACKOFF_BASE_SECONDS * 2 ** (attempt - 1))
    rng = random.Random(attempt)
    for _ in range(50):
        assert ceiling / 2 <= policy.backoff_seconds(attempt, rng=rng) <= ceiling
    assert policy.backoff_seconds(attempt, rng=LOW) == ceiling / 2
    assert policy.backoff_seconds(attempt, rng=HIGH) == pytest.approx(ceiling, rel=1e-5)


def test_backoff_doubles_until_the_cap() -> None:
    lows = [policy.backoff_seconds(n, rng=LOW) for n in range(1, 8)]
    assert lows == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
    assert policy.backoff_seconds(40, rng=HIGH) <= policy.BACKOFF_CAP_SECONDS
    assert policy.backoff_seconds(40, rng=LOW) == policy.BACKOFF_CAP_SECONDS / 2


@pytest.mark.parametrize("attempt", [0, -3, 10**6])
def test_backoff_survives_odd_attempt_numbers(attempt: int) -> None:
    delay = policy.backoff_seconds(attempt, rng=LOW)
    assert 0 < delay <= policy.BACKOFF_CAP_SECONDS


def test_backoff_takes_base_and_cap() -> None:
    assert policy.backoff_seconds(3, base=0.1, cap=0.3, rng=LOW) == pytest.approx(0.15)
    assert policy.backoff_seconds(1, base=0.1, rng=LOW) == pytest.approx(0.05)


# -- error fingerprints ---------------------------------------------------------


@pytest.mark.parametrize("a, b", [
    ("timeout after 31s on task 17", "timeout after 45s on task 99"),
    ("object at 0x7f3a2b1c", "object at 0x55d0e1ff"),
    ("request 3f2b8c1e-1a2b-4c3d-9e8f-0123456789ab failed", "request 00000000-0000-4000-8000-000000000000 failed"),
    ("boom\nTraceback line A", "boom\nTraceback line B"),
    ("  padded  \n", "padded"),
])
def test_the_same_error_with_different_details_has_one_fingerprint(a: str, b: str) -> None:
    assert policy.error_fingerprint(a) == policy.error_fingerprint(b)


@pytest.mark.parametrize("a, b", [
    ("connection refused", "permission denied"),
    ("timeout calling billing", "timeout calling email"),
])
def test_different_errors_have_different_fingerprints(a: str, b: str) -> None:
    assert policy.error_fingerprint(a) != policy.error_fingerprint(b)


@pytest.mark.parametrize("error", ["", "   ", "\n\n", "x"])
def test_fingerprint_is_a_short_hex_string(error: str) -> None:
    fp = policy.error_fingerprint(error)
    assert len(fp) == 16 and int(fp, 16) >= 0


# -- validators -------------------------------------------------------------------


@pytest.mark.parametrize("value", ["default", "a", "mail.outbound", "tenant-7:high_prio", "q" * 100])
def test_good_names(value: str) -> None:
    assert policy.check_name("queue", value) == value


@pytest.mark.parametrize("value", ["", "two words", "x'; DROP TABLE t; --", "a/b", "q" * 101, None, 5, "é"])
def test_bad_names(value: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        policy.check_name("queue", value)
    assert info.value.field == "queue" and "queue" in str(info.value)


@pytest.mark.parametrize("value", ["", "  ", None, 3, "k" * 201])
def test_bad_kinds(value: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        policy.check_kind(value)
    assert info.value.field == "kind"


def test_effects_and_statuses() -> None:
    for effect in ("read_only", "idempotent", "side_effect"):
        assert policy.check_effect(effect) == effect
    for status in ("queued", "running", "completed", "cancelled", "dead", "needs_reconciliation", "blocked"):
        assert policy.check_status(status) == status
    with pytest.raises(InvalidInput, match="read_only") as info:
        policy.check_effect("write")
    assert info.value.field == "effect"
    with pytest.raises(InvalidInput, match="queued") as info:
        policy.check_status("finished")
    assert info.value.field == "status"


def test_json_values() -> None:
    assert policy.check_json("payload", {"a": [1, 2.5, None, True, "x"]}) == {"a": [1, 2.5, None, True, "x"]}
    assert policy.check_json("payload", "x" * (policy.MAX_PAYLOAD_BYTES - 2))
    for bad in ({"x": object()}, {1, 2}, float("nan"), float("inf"), "x" * (policy.MAX_PAYLOAD_BYTES - 1)):
        with pytest.raises(InvalidInput) as info:
            policy.check_json("payload", bad)
        assert info.value.field == "payload"
    # the limit counts encoded bytes, not characters
    with pytest.raises(InvalidInput):
        policy.check_json("payload", "é" * (policy.MAX_PAYLOAD_BYTES // 2))


def _nested(depth: int) -> list[Any]:
    outer: list[Any] = []
    inner = outer
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


@pytest.mark.parametrize("recursion_limit", [None, 20_000])
def test_json_nesting_has_a_limit_of_its_own(recursion_limit: int | None) -> None:
    # An application may have raised the recursion limit (documentation and type-checking
    # tools do): a deep document would then be stored, and fail every default reader.
    old = sys.getrecursionlimit()
    try:
        if recursion_limit is not None:
            sys.setrecursionlimit(recursion_limit)
        assert policy.check_json("payload", _nested(policy.MAX_JSON_DEPTH)) is not None
        for depth in (policy.MAX_JSON_DEPTH + 1, 3000):
            with pytest.raises(InvalidInput, match="nested too deeply") as info:
                policy.check_json("result", [{"a": _nested(depth - 2)}])
            assert info.value.field == "result"
    finally:
        sys.setrecursionlimit(old)
    # many containers side by side are no depth
    assert policy.check_json("payload", [{"a": [i]} for i in range(5000)])


def test_integers() -> None:
    assert policy.check_int("limit", 3, minimum=1, maximum=5) == 3
    for bad in (0, 6, True, 2.0, "3", None):
        with pytest.raises(InvalidInput) as info:
            policy.check_int("limit", bad, minimum=1, maximum=5)
        assert info.value.field == "limit"


def test_seconds() -> None:
    assert policy.check_seconds("delay", 0, allow_zero=True) == 0.0
    assert policy.check_seconds("lease_seconds", 0.25, allow_zero=False) == 0.25
    assert isinstance(policy.check_seconds("lease_seconds", 3, allow_zero=False), float)
    bad_cases = [(0, False), (-0.1, True), (float("nan"), True), (float("inf"), True),
                 (policy.MAX_LEASE_SECONDS + 1, False), (True, True), ("1", True), (None, True)]
    for bad, allow_zero in bad_cases:
        with pytest.raises(InvalidInput) as info:
            policy.check_seconds("lease_seconds", bad, allow_zero=allow_zero)
        assert info.value.field == "lease_seconds"


def test_keys_and_text() -> None:
    assert policy.check_key("idempotency_key", "k" * 255)
    for bad in ("", None, 7, "k" * 256):
        with pytest.raises(InvalidInput):
            policy.check_key("idempotency_key", bad)
    assert policy.check_text("note", None) is None
    assert policy.check_text("note", "ok", required=True) == "ok"
    for bad, required in (("", True), ("   ", True), (None, True), (5, False), ("x" * 10_001, False)):
        with pytest.raises(InvalidInput) as info:
            policy.check_text("note", bad, required=required)
        assert info.value.field == "note"


@pytest.mark.parametrize("value, expected", [(1, 1), ("42", 42), (" 7 ", 7), (2**63 - 1, 2**63 - 1)])
def test_good_task_ids(value: Any, expected: int) -> None:
    assert policy.check_task_id(value) == expected


@pytest.mark.parametrize("value", [0, -1, "-1", "abc", "", None, 1.0, True, 2**63])
def test_bad_task_ids(value: Any) -> None:
    with pytest.raises(InvalidInput) as info:
        policy.check_task_id(value)
    assert info.value.field == "task_id"
