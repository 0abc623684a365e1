"""Properties of RetryPolicy's backoff, for any valid policy and attempt number:
the delay stays within its bounds, the un-jittered ceiling grows with the
attempt until it meets the cap and never passes it, and the jitter spreads
the delay over exactly the fraction it names."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import leaseq
from leaseq.core import checks
from leaseq.core.retry import MAX_RETRY_SECONDS

seconds = st.floats(min_value=1e-3, max_value=MAX_RETRY_SECONDS, allow_nan=False, allow_infinity=False)
fractions = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
attempts = st.integers(min_value=-5, max_value=10**6)


@st.composite
def policies(draw: st.DrawFn) -> leaseq.RetryPolicy:
    base, cap = sorted((draw(seconds), draw(seconds)))
    return leaseq.RetryPolicy(base=base, cap=cap, jitter=draw(fractions))


@settings(max_examples=300, deadline=None)
@given(policies(), attempts, st.randoms(use_true_random=False))
def test_the_delay_lies_within_its_bounds(policy: leaseq.RetryPolicy, attempt: int, rng: random.Random) -> None:
    ceiling = policy.ceiling(attempt)
    delay = policy.delay(attempt, rng)
    assert 0 <= ceiling * (1 - policy.jitter) * (1 - 1e-12) <= delay <= ceiling <= policy.cap


@settings(max_examples=300, deadline=None)
@given(policies(), attempts, st.integers(min_value=1, max_value=2000))
def test_the_ceiling_grows_monotonically_to_the_cap_and_stays_there(policy: leaseq.RetryPolicy, attempt: int,
                                                                    later: int) -> None:
    low, high = policy.ceiling(attempt), policy.ceiling(attempt + later)
    assert policy.base <= low <= high <= policy.cap
    if high < policy.cap:  # below the cap it doubles exactly
        assert high == pytest.approx(policy.base * 2.0 ** (max(1, attempt + later) - 1), rel=1e-12)
    assert policy.ceiling(10**9) == policy.cap


@settings(max_examples=100, deadline=None)
@given(policies(), st.integers(min_value=1, max_value=64))
def test_jitter_spreads_over_its_fraction_of_the_ceiling(policy: leaseq.RetryPolicy, attempt: int) -> None:
    ceiling = policy.ceiling(attempt)
    assume(ceiling > 0)

    class Fixed(random.Random):
        def __init__(self, value: float):
            super().__init__()
            self.value = value

        def random(self) -> float:
            return self.value

    top, bottom = policy.delay(attempt, Fixed(0.0)), policy.delay(attempt, Fixed(1.0 - 2**-53))
    assert top == ceiling  # no jitter drawn: the ceiling itself
    # the whole fraction (within a rounding error of the ceiling)
    assert bottom == pytest.approx(ceiling * (1 - policy.jitter), rel=1e-9, abs=ceiling * 1e-12)
    spread = [policy.delay(attempt, random.Random(seed)) for seed in range(50)]
    assert all(ceiling * (1 - policy.jitter) * (1 - 1e-12) <= d <= ceiling for d in spread)
    if policy.jitter == 0:
        assert set(spread) == {ceiling}


@given(st.integers(min_value=1, max_value=40), st.randoms(use_true_random=False))
def test_the_default_policy_keeps_the_queues_long_standing_backoff(attempt: int, rng: random.Random) -> None:
    """No policy declared: the same [d/2, d] range as the queue's own 1 s - 1 h backoff."""
    policy = leaseq.RetryPolicy()
    d = min(checks.BACKOFF_CAP_SECONDS, checks.BACKOFF_BASE_SECONDS * 2 ** (attempt - 1))
    assert policy.ceiling(attempt) == d
    assert d / 2 <= policy.delay(attempt, rng) <= d
    assert d / 2 <= checks.backoff_seconds(attempt, rng=rng) <= d


@given(st.one_of(st.floats(max_value=0.0), st.just(float("nan")), st.just(float("inf")), st.text(), st.booleans()))
def test_a_bad_base_is_refused_naming_it(base) -> None:
    with pytest.raises(leaseq.InvalidInput) as info:
        leaseq.RetryPolicy(base=base)
    assert info.value.field == "base"


@given(fractions.map(lambda f: -f - 1e-9) | st.floats(min_value=1.0 + 1e-9, max_value=1e9))
def test_a_jitter_outside_zero_to_one_is_refused(jitter: float) -> None:
    with pytest.raises(leaseq.InvalidInput) as info:
        leaseq.RetryPolicy(jitter=jitter)
    assert info.value.field == "jitter"


def test_cap_below_base_and_bad_exception_lists_are_refused() -> None:
    for options, field in [({"base": 10, "cap": 5}, "cap"), ({"retry_on": ("ValueError",)}, "retry_on[0]"),
                           ({"give_up_on": "ValueError"}, "give_up_on"), ({"retry_on": (int,)}, "retry_on[0]")]:
        with pytest.raises(leaseq.InvalidInput) as info:
            leaseq.RetryPolicy(**options)
        assert info.value.field == field


def test_give_up_on_wins_over_retry_on() -> None:
    policy = leaseq.RetryPolicy(retry_on=(OSError,), give_up_on=(PermissionError,))
    assert policy.retries(TimeoutError()) and not policy.retries(PermissionError()) and not policy.retries(KeyError())
    assert leaseq.RetryPolicy(retry_on=ValueError).retry_on == (ValueError,)
    assert leaseq.RetryPolicy().retries(KeyError())  # no lists: every failure is retried
