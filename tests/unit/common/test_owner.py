"""The one ownership rule: a tenant sees what it owns, an operator everything, nobody an object without an owner."""
from __future__ import annotations

from common.owner import NOBODY, ONE_TENANT, OPERATOR, Caller, shown


def test_a_tenant_sees_only_its_own() -> None:
    alpha = Caller("alpha")
    assert alpha.sees("alpha") and alpha.sees(b"alpha")
    assert not alpha.sees("beta") and not alpha.sees("alph") and not alpha.sees("alpha ")
    assert not alpha.sees(ONE_TENANT)  # made while keys were off
    assert not alpha.sees(None)  # stored before owners were recorded


def test_an_operator_sees_everything_and_nobody_nothing() -> None:
    admin = Caller("key-1234", admin=True)
    for owner in ("alpha", b"beta", ONE_TENANT, None):
        assert admin.sees(owner) and OPERATOR.sees(owner)
        assert not NOBODY.sees(owner)


def test_how_owners_are_shown() -> None:
    assert (shown("alpha"), shown(b"beta"), shown(ONE_TENANT), shown(None)) == \
        ("alpha", "beta", "(keys off)", "(before owners)")
