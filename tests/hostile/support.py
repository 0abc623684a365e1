"""Hostile values, and a snapshot of every leaseq table to prove a refusal changed nothing."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from snapshots import snapshot  # noqa: F401  (shared with the other folders)

#: Text without NUL or lone surrogates (test_api_fuzz.py checks those are refused).
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=30)
ODD_TEXT = st.sampled_from(["", " ", "\n", "'; DROP TABLE leaseq_tasks; --", "%(task_id)s", ":task_id", "%s",
                            "[red]x[/red]", "\u202e\u2066", "é" * 101, "x" * 256, "x" * 10_001, "-1", "1e309",
                            "NaN", "null", "{}", "default", "running"])
NUMBERS = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([0, -1, 2**31, 2**63, -(2**63) - 1, 1e-300, -0.0]))
JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), TEXT),
                       lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(TEXT, inner, max_size=3)),
                       max_leaves=8)
#: Anything at all that a caller might pass where a value is expected.
ANY = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT, ODD_TEXT, st.binary(max_size=8), JSONISH,
                st.builds(object), st.just({1, 2}), st.just(b"\xff" * 3), st.just("x" * 2_000_000))


def fuzz_settings(examples: int) -> settings:
    """Hypothesis settings for the fuzz tests: a fixed set of examples in CI (so a run cannot turn red by
    luck), or ``$LEASEQ_FUZZ_EXAMPLES`` fresh random ones when exploring."""
    explore = os.environ.get("LEASEQ_FUZZ_EXAMPLES")
    return settings(max_examples=int(explore or examples), derandomize=not explore, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

