"""The error registry: every error class once, each with a unique code, an HTTP status and CLI fields.

No database and no server here; tests/service/test_error_round_trip.py sends
every code through a real service to RemoteQueue.
"""

from __future__ import annotations

import inspect

import pytest

import leaseq
import leaseq.auth
import leaseq.client
import leaseq.fencing
import leaseq.service.app  # noqa: F401  (imports every module that defines or maps errors)
from leaseq.cli.session import CliError
from leaseq.core import errors
from leaseq.core.errors import ERRORS, LeaseqError, error_class, registered_class

from error_samples import SAMPLES


def all_subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *all_subclasses(sub)}
    return found


def test_every_error_class_is_defined_once_in_core_errors_and_registered():
    subclasses = all_subclasses(LeaseqError)
    for cls in subclasses:
        assert cls.__module__ == "leaseq.core.errors", f"{cls.__qualname__} is defined in {cls.__module__}"
        if "code" in vars(cls):
            assert error_class(cls.code) is cls, cls
        else:  # a refinement: travels as the registered class it derives from
            assert registered_class(cls) in inspect.getmro(cls)
    assert set(ERRORS) == {LeaseqError} | {c for c in subclasses if "code" in vars(c)}


def test_codes_are_unique_and_each_has_an_http_status_and_cli_exit_code():
    codes = [cls.code for cls in ERRORS]
    assert len(codes) == len(set(codes))
    for cls in ERRORS:
        assert isinstance(cls.http_status, int) and 400 <= cls.http_status <= 599, cls
        assert cls.cli_exit_code in (1, 2), cls
    assert set(SAMPLES) == set(ERRORS)


def test_the_wire_format_keeps_its_codes_and_statuses():
    # The documented table (README, service docstring); tests/service and
    # tests/acceptance check the same codes end to end.
    assert {cls.code: cls.http_status for cls in ERRORS if cls.code in {
        "lease_lost", "stale_token", "invalid_transition", "paused", "unknown_worker", "not_found", "invalid",
        "unauthorized", "forbidden", "rate_limited", "too_large", "unavailable"}} == {
        "lease_lost": 409, "stale_token": 409, "invalid_transition": 409, "paused": 409, "unknown_worker": 409,
        "not_found": 404, "invalid": 422, "unauthorized": 401, "forbidden": 403, "rate_limited": 429,
        "too_large": 413, "unavailable": 503}


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.code)
def test_from_wire_rebuilds_the_same_class_with_the_same_fields(cls):
    exc = SAMPLES[cls]
    body = {"code": exc.code, "message": str(exc), **exc.wire_fields()}
    back = error_class(body["code"]).from_wire(body["message"], body)
    assert type(back) is cls and str(back) == str(exc) and back.wire_fields() == exc.wire_fields()


def test_a_refinement_travels_as_its_registered_parent():
    exc = leaseq.fencing.InvalidActionToken("expired", "token expired 3 s ago")
    assert exc.code == "forbidden" and exc.http_status == 403 and exc.wire_fields() == {"reason": "expired"}
    assert registered_class(exc) is leaseq.auth.AccessDenied


def test_old_import_paths_still_name_the_registered_classes():
    from leaseq.fencing.errors import IdempotencyKeyReused, InvalidActionToken
    from leaseq.service.access import BodyTooLarge

    assert leaseq.auth.AccessDenied is errors.AccessDenied and leaseq.auth.Unauthorized is errors.Unauthorized
    assert leaseq.auth.RateLimited is errors.RateLimited and BodyTooLarge is errors.BodyTooLarge
    assert IdempotencyKeyReused is errors.IdempotencyKeyReused and InvalidActionToken is errors.InvalidActionToken


@pytest.mark.parametrize("exc, line, exit_code", [
    (errors.NotFound("task 9 not found"), "task: task 9 not found", 2),
    (errors.InvalidTransition("task 4 is completed"), "status: task 4 is completed", 2),
    (errors.LeaseLost(4, 2, "lease expired"), "lease: task 4 generation 2: lease expired", 2),
    (errors.UnknownWorker("no such worker"), "worker: no such worker", 2),
    (errors.QueuePaused("queue 'q' is paused"), "queue: queue 'q' is paused", 2),
    (errors.BackendUnavailable("PostgreSQL:\nserver closed"), "database: PostgreSQL: server closed", 1),
    (errors.StaleToken("token 3 < 5"), "fencing_token: token 3 < 5", 2),
    (errors.Unauthorized("token revoked"), "unauthorized: token revoked", 2),
    (errors.InvalidInput("limit", "must be at least 1"), "limit: must be at least 1", 2),
    (errors.ConfigError("dsn: unsupported scheme 'x'"), "dsn: unsupported scheme 'x'", 2),
    (errors.Permanent("bad payload"), "permanent: bad payload", 2),
])
def test_the_cli_names_the_registry_field_and_exit_code(exc, line, exit_code):
    cli = CliError.from_leaseq(exc)
    assert cli.format_message() == line and cli.exit_code == exit_code
