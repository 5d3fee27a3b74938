"""Whose a stored object is, and who may see it: the one rule every store applies (docs/explanation/security.md).

Every object the API stores for a client (a stored response and its input items, a background response and its
events, a resumable stream's journal, a file, a batch and its output files) records its owner in the same write
that creates it: the tenant of the API key that made it (the key file's `tenant`, else the key's name, else a
digest of the key: `KeyAttributes.who`). A caller sees an object when it owns it, or when it is an operator
(`admin`): the admin key, or anyone while no API key is configured (then the whole server is one tenant, and the
request's `user` field is the client's word, never an access boundary).

An object stored before owners were recorded has none (`None`): only an operator sees it. An object made while
keys were off is owned by `ONE_TENANT`, which no key's tenant is: once keys are on, only an operator sees it too.

An object a caller may not see is, to that caller, an object that does not exist: the store answers exactly as for
a missing id (same status, same body, after the same reads), so a 404 says nothing about another tenant's ids.
"""
from __future__ import annotations

from dataclasses import dataclass

OWNER_FIELD = "owner"  # the field (hash field, or JSON member) an object's owner is recorded in
ONE_TENANT = ""  # the owner recorded while no API key is configured


@dataclass(frozen=True)
class Caller:
    """Who is asking: `tenant` is recorded as the owner of what it creates; `admin` sees every object."""

    tenant: str = ONE_TENANT
    admin: bool = False

    def sees(self, owner: str | bytes | None) -> bool:
        """The rule: an operator sees everything; a tenant only what it owns (never an object without an owner)."""
        if self.admin:
            return True
        if owner is None:
            return False
        return (owner.decode() if isinstance(owner, bytes) else owner) == self.tenant


# Keys off: the one tenant, which is its own operator (the ops page is open then too).
OPERATOR = Caller(ONE_TENANT, admin=True)
# What a request that reached a store without a caller is: nobody (it sees nothing it did not make as nobody).
NOBODY = Caller("\x00nobody", admin=False)


def shown(owner: str | bytes | None) -> str:
    """An owner as the ops page and `ovq` show it."""
    if owner is None:
        return "(before owners)"
    text = owner.decode() if isinstance(owner, bytes) else owner
    return text if text != ONE_TENANT else "(keys off)"
