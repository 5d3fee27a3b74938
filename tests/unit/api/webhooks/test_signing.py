"""Standard Webhooks' signature, checked against the reference library's own signing and verifying."""
from __future__ import annotations

import datetime

import pytest
from standardwebhooks.webhooks import Webhook

from api.http.auth import KeyFileError, read_keys
from api.webhooks.signing import headers, signature
from common.webhooks.endpoints import WebhookEndpoint, new_secret, secret_key


def test_the_signature_is_the_reference_library_s() -> None:
    secret, body = new_secret(), b'{"id":"evt_1","type":"batch.completed"}'
    when = datetime.datetime.fromtimestamp(1_700_000_000, tz=datetime.timezone.utc)
    assert signature(secret_key(secret), "evt_1", 1_700_000_000, body) == Webhook(secret).sign("evt_1", when,
                                                                                               body.decode())


def test_the_reference_verifier_takes_the_headers_and_refuses_another_secret() -> None:
    import time

    secret, body = new_secret(), b'{"id":"evt_2"}'
    sent = headers(secret_key(secret), "evt_2", int(time.time()), body)
    assert Webhook(secret).verify(body, sent) == {"id": "evt_2"}
    with pytest.raises(Exception, match="No matching signature"):
        Webhook(new_secret()).verify(body, sent)


@pytest.mark.parametrize("secret", ["MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_not base64!", "whsec_c2hvcnQ="])
def test_a_secret_that_is_not_standard_is_refused(secret: str) -> None:
    with pytest.raises(ValueError):
        WebhookEndpoint(url="https://example.com/hook", secret=secret)


def test_the_key_file_takes_webhooks_and_refuses_a_bad_one_without_echoing_it(tmp_path) -> None:  # noqa: ANN001
    good = tmp_path / "keys.yaml"
    good.write_text(f"keys:\n  - key: sk-a\n    tenant: a\n    webhooks:\n      - url: https://example.com/h\n"
                    f"        secret: {new_secret()}\n        events: [batch.completed]\n")
    (key,) = read_keys(good)
    assert key.webhooks[0].wants("batch.completed") and not key.webhooks[0].wants("batch.failed")
    bad = tmp_path / "bad.yaml"
    bad.write_text("keys:\n  - key: sk-a\n    webhooks: [{url: 'ftp://x', secret: whsec_leak}]\n")
    with pytest.raises(KeyFileError) as error:
        read_keys(bad)
    assert "leak" not in str(error.value)
