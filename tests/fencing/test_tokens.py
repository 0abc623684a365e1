"""Signed action tokens: round trip, tampering, expiry, rotation, scope, configuration."""

from __future__ import annotations

import base64
import dataclasses
import string

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import leaseq
from leaseq.fencing import ActionClaims, ActionSigner, InvalidActionToken

SECRET_A = bytes(range(32))
SECRET_B = bytes(range(100, 132))
NOW = 1_800_000_000.0


def signer(**keys: bytes) -> ActionSigner:
    keys = keys or {"a": SECRET_A}
    return ActionSigner(keys, next(iter(keys)))


def issue(s: ActionSigner | None = None, **over) -> str:
    args = {"task_id": 42, "generation": 3, "action": "email.send", "idempotency_key": "welcome:7",
            "ttl_seconds": 60, "now": NOW}
    args.update(over)
    return (s or signer()).issue(**args)


def refused(reason: str, token, s: ActionSigner | None = None, **verify) -> InvalidActionToken:
    verify.setdefault("now", NOW)
    with pytest.raises(InvalidActionToken) as info:
        (s or signer()).verify(token, **verify)
    assert info.value.reason == reason, str(info.value)
    assert info.value.code == "forbidden" and isinstance(info.value, leaseq.LeaseqError)
    return info.value


def test_round_trip_names_task_generation_action_key_and_times():
    token = issue()
    assert set(token) <= set(string.ascii_letters + string.digits + "-_.") and token.count(".") == 1
    claims = signer().verify(token, action="email.send", idempotency_key="welcome:7", generation=3, now=NOW)
    assert claims == ActionClaims(key_id="a", task_id=42, generation=3, action="email.send",
                                  idempotency_key="welcome:7", issued_at=int(NOW), expires_at=int(NOW) + 60)
    with pytest.raises(dataclasses.FrozenInstanceError):
        claims.generation = 4


def test_expiry():
    token = issue(ttl_seconds=60)
    signer().verify(token, now=NOW + 59.9)
    refused("expired", token, now=NOW + 60)
    signer().verify(token, now=NOW + 65, leeway_seconds=10)      # tolerated clock skew
    fractional = issue(ttl_seconds=0.5, now=NOW + 0.7)            # rounds up, never down
    signer().verify(fractional, now=NOW + 1.19)
    refused("expired", fractional, now=NOW + 2)


def test_scope_is_one_action_one_key_one_attempt():
    token = issue()
    refused("wrong_action", token, action="email.delete")
    refused("wrong_idempotency_key", token, idempotency_key="welcome:8")
    refused("wrong_generation", token, generation=4)


def test_rotation_old_keys_verify_while_listed():
    old_token = issue(signer(a=SECRET_A))
    rotated = ActionSigner({"b": SECRET_B, "a": SECRET_A}, "b")
    assert rotated.verify(old_token, now=NOW).key_id == "a"
    new_token = issue(rotated)
    assert rotated.verify(new_token, now=NOW).key_id == "b"
    refused("unknown_key", new_token, signer(a=SECRET_A))         # not yet known there
    refused("unknown_key", old_token, signer(b=SECRET_B))         # retired
    assert rotated.key_ids == ("b", "a")


def test_same_key_id_with_another_secret_is_a_forgery():
    refused("forged", issue(signer(a=SECRET_B)))


def test_a_payload_rewritten_by_someone_without_the_key_is_forged():
    body, mac = issue().split(".")
    payload = base64.urlsafe_b64decode(body + "==").replace(b'"gen":3', b'"gen":9')
    forged_body = base64.urlsafe_b64encode(payload).rstrip(b"=").decode()
    refused("forged", f"{forged_body}.{mac}")


def test_every_single_character_change_is_refused():
    token = issue()
    alphabet = string.ascii_letters + string.digits + "-_.=+/ "
    for position, original in enumerate(token):
        for replacement in alphabet:
            if replacement != original:
                changed = token[:position] + replacement + token[position + 1:]
                with pytest.raises(InvalidActionToken):
                    signer().verify(changed, now=NOW)


TOKEN = issue()


@settings(max_examples=300, deadline=None)
@given(position=st.integers(0, len(TOKEN) - 1), byte=st.integers(0, 255))
def test_any_single_byte_change_is_refused(position, byte):
    raw = bytearray(TOKEN.encode("ascii"))
    if raw[position] == byte:
        return
    raw[position] = byte
    with pytest.raises(InvalidActionToken):
        signer().verify(raw.decode("latin-1"), now=NOW)


@pytest.mark.parametrize("token", ["", "abc", "a.b.c", TOKEN + ".", TOKEN[:-1], TOKEN + "A", "." + TOKEN,
                                   TOKEN.split(".")[0], "x" * 5000, None, 12, b"bytes"])
def test_malformed_and_truncated_tokens_are_refused(token):
    with pytest.raises(InvalidActionToken) as info:
        signer().verify(token, now=NOW)
    assert info.value.reason in ("malformed", "forged")


def test_a_signed_payload_of_the_wrong_shape_is_malformed():
    # A key shared with another issuer that signs a different shape.
    s = signer()
    body = base64.urlsafe_b64encode(b'{"kid":"a","v":1,"task":"42"}').rstrip(b"=").decode()
    mac = base64.urlsafe_b64encode(s._mac(SECRET_A, body)).rstrip(b"=").decode()
    refused("malformed", f"{body}.{mac}", s)


@pytest.mark.parametrize("over, field", [
    ({"task_id": -1}, "task_id"), ({"task_id": "42"}, "task_id"), ({"generation": True}, "generation"),
    ({"action": ""}, "action"), ({"idempotency_key": None}, "idempotency_key"),
    ({"ttl_seconds": 0}, "ttl_seconds"), ({"ttl_seconds": float("inf")}, "ttl_seconds"),
    ({"action": "x" * 4000}, "action"),
])
def test_issue_refuses_bad_arguments_naming_the_field(over, field):
    with pytest.raises(leaseq.InvalidInput) as info:
        issue(**over)
    assert info.value.field == field


def test_from_env_reads_key_ids_and_secrets_first_is_current():
    a = base64.b64encode(SECRET_A).decode()
    b = base64.urlsafe_b64encode(SECRET_B).decode().rstrip("=")
    s = ActionSigner.from_env(environ={"LEASEQ_ACTION_KEYS": f" k2:{b} , k1:{a}"})
    assert s.current_key_id == "k2" and s.key_ids == ("k2", "k1")
    token = ActionSigner({"k1": SECRET_A}, "k1").issue(1, 1, "x", "y", 60)
    assert s.verify(token).key_id == "k1"
    assert SECRET_A.hex() not in repr(s) and a not in repr(s)


@pytest.mark.parametrize("value, needle", [
    ("", "not set"), ("k1", "entry 1"), ("k1:", "entry 1"), (":abc", "entry 1"),
    ("k1:%%%%", "not valid base64"), ("k1:c2hvcnQ=", "at least 16"),
    ("bad id:" + base64.b64encode(SECRET_A).decode(), "key id"),
    (f"k1:{base64.b64encode(SECRET_A).decode()},k1:{base64.b64encode(SECRET_B).decode()}", "twice"),
    (f"k1:{base64.b64encode(SECRET_A).decode()},k2", "entry 2"),
])
def test_from_env_reports_malformed_values_without_the_secret(value, needle):
    with pytest.raises(leaseq.ConfigError) as info:
        ActionSigner.from_env(environ={"LEASEQ_ACTION_KEYS": value})
    message = str(info.value)
    assert "LEASEQ_ACTION_KEYS" in message and needle in message
    assert base64.b64encode(SECRET_B).decode() not in message


def test_from_env_uses_the_process_environment(monkeypatch):
    monkeypatch.setenv("LEASEQ_ACTION_KEYS", f"live:{ActionSigner.generate_secret()}")
    assert ActionSigner.from_env().current_key_id == "live"
    monkeypatch.delenv("LEASEQ_ACTION_KEYS")
    with pytest.raises(leaseq.ConfigError, match="not set"):
        ActionSigner.from_env()


@pytest.mark.parametrize("keys, current, needle", [
    ({}, "a", "at least one"), ({"a": b"short"}, "a", "at least 16"), ({"a:b": SECRET_A}, "a:b", "key id"),
    ({"a": SECRET_A}, "b", "current_key_id"), ({"a": "text" * 8}, "a", "at least 16"),
])
def test_constructor_refuses_bad_keys(keys, current, needle):
    with pytest.raises(leaseq.ConfigError, match=needle):
        ActionSigner(keys, current)
