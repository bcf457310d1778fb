"""Standard Webhooks signatures: the spec's own vector, and every malformed header one refusal."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapters.webhook.signing import (
    SignatureRefused,
    check_headers,
    secret_key,
    sign,
    signed_headers,
    verify,
)

# The reference library's known answer (standard-webhooks, libraries/python, test_sign_function)
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = b'{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

KEY = secret_key(SPEC_SECRET)
NOW = SPEC_TIMESTAMP + 30


def _check(headers: dict[str, str], body: bytes = SPEC_BODY, now: int = NOW) -> None:
    msg_id, sent, signatures = check_headers(headers, now_s=now, tolerance_s=300)
    verify((KEY,), msg_id, sent, signatures, body)


def _code(headers: dict[str, str], body: bytes = SPEC_BODY, now: int = NOW) -> str:
    with pytest.raises(SignatureRefused) as refused:
        _check(headers, body, now)
    return refused.value.code


def test_the_spec_vector_signs_to_the_reference_signature() -> None:
    assert sign(KEY, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY) == SPEC_SIGNATURE
    _check(signed_headers(KEY, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY))


def test_a_rotation_list_passes_on_any_matching_v1_entry() -> None:
    headers = signed_headers(KEY, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY)
    headers["webhook-signature"] = " ".join(
        [
            "v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc=",
            "v1a,hnO3f9T8Ytu9HwrXslvumlUpqtNVqkhqw/enGzPCXe5BdqzCInXqYXFymVJaA7AZ",
            "v1",
            "v1,%%%not-base64",
            SPEC_SIGNATURE,
        ]
    )
    _check(headers)
    old = secret_key("whsec_" + base64.b64encode(bytes(range(100, 132))).decode())
    msg_id, sent, signatures = check_headers(headers, now_s=NOW, tolerance_s=300)
    verify((old, KEY), msg_id, sent, signatures, SPEC_BODY)  # either key of a rotation


@pytest.mark.parametrize("missing", ["webhook-id", "webhook-timestamp", "webhook-signature"])
def test_a_missing_header_is_unsigned(missing: str) -> None:
    headers = signed_headers(KEY, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY)
    del headers[missing]
    assert _code(headers) == "unsigned"


def test_a_changed_body_id_or_timestamp_or_another_key_does_not_verify() -> None:
    headers = signed_headers(KEY, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY)
    assert _code(headers, body=SPEC_BODY + b" ") == "bad_signature"
    assert _code({**headers, "webhook-id": "msg_other"}) == "bad_signature"
    assert _code({**headers, "webhook-timestamp": str(SPEC_TIMESTAMP + 1)}) == "bad_signature"
    other = secret_key("whsec_" + base64.b64encode(bytes(range(50, 74))).decode())
    assert _code(signed_headers(other, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY)) == "bad_signature"
    assert _code({**headers, "webhook-signature": SPEC_SIGNATURE.replace("v1,", "v2,")}) == (
        "bad_signature"
    )


def test_a_timestamp_outside_the_tolerance_either_way_is_stale() -> None:
    headers = signed_headers(KEY, SPEC_ID, SPEC_TIMESTAMP, SPEC_BODY)
    _check(headers, now=SPEC_TIMESTAMP + 300)
    _check(headers, now=SPEC_TIMESTAMP - 300)
    assert _code(headers, now=SPEC_TIMESTAMP + 301) == "stale_timestamp"
    assert _code(headers, now=SPEC_TIMESTAMP - 301) == "stale_timestamp"
    for bad in ("1614265330.0", "-1", "1e9", "nan", " 1614265330", "9" * 13):
        assert _code({**headers, "webhook-timestamp": bad}) == "stale_timestamp", bad


def test_an_id_with_a_dot_or_a_space_is_refused() -> None:
    for bad in ("msg.1", "msg 1", "x" * 201, "msg\n1"):
        headers = signed_headers(KEY, bad, SPEC_TIMESTAMP, SPEC_BODY)
        assert _code(headers) == "invalid_webhook_id", bad


@given(
    msg_id=st.text(max_size=40),
    timestamp=st.text(max_size=20),
    signature=st.text(max_size=200),
    body=st.binary(max_size=64),
)
def test_any_header_text_is_a_refusal_and_nothing_else(
    msg_id: str, timestamp: str, signature: str, body: bytes
) -> None:
    headers = {"webhook-id": msg_id, "webhook-timestamp": timestamp, "webhook-signature": signature}
    with pytest.raises(SignatureRefused):
        _check(headers, body)


@pytest.mark.parametrize(
    ("secret", "words"),
    [
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "starts with whsec_"),
        ("whsec_not base64!", "not base64"),
        ("whsec_" + base64.b64encode(b"s" * 23).decode(), "23 bytes"),
        ("whsec_" + base64.b64encode(b"s" * 65).decode(), "65 bytes"),
        ("whsec_" + base64.b64encode(bytes(32)).decode(), "not random"),  # was accepted
    ],
)
def test_a_secret_that_is_not_a_whsec_key_of_24_to_64_bytes_is_refused(
    secret: str, words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        secret_key(secret)


def test_a_secret_pasted_with_its_line_break_is_read() -> None:
    """Read from a file with its newline, it was refused as "not base64", unexplained."""
    key = bytes(range(32))
    secret = "whsec_" + base64.b64encode(key).decode()
    assert secret_key(f"{secret}\n") == secret_key(f"  {secret}") == key
