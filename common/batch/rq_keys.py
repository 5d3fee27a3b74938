"""rq's Redis keys under ovq's key prefix: `{OVQ_KEY_PREFIX}:rq:*` (`Keys.rq_prefix`), so deployments sharing a
Redis never share rq's queues, jobs, workers, registries or locks.

rq ≥ 3 names every key and channel it uses from one prefix, `RQ_KEY_PREFIX`, read from the environment once, when
rq is first imported (its class attributes and module constants are built from it then). Subclassing Queue, Job
and Worker would not reach the rest (results, executions, worker registrations, registries' cleaning locks, the
scheduler's locks, the suspension flag, the command channel), so ovq sets the variable before rq is imported and
refuses to go on in a process whose rq was imported under another prefix: that process would read and write
another deployment's rq keys. One process serves one prefix.
"""
from __future__ import annotations

import logging
import os
import re
import sys

from common.keys import Keys

log = logging.getLogger("ovq.batch")

ENV = "RQ_KEY_PREFIX"
# rq splices the prefix into %-templates, str.format() templates and Lua source, and allows these characters only.
ALLOWED = re.compile(r"[A-Za-z0-9_.:{}-]+")


class RQPrefixError(RuntimeError):
    """This process's rq names its keys under another prefix than ovq's."""


def imported_prefix() -> str | None:
    """The prefix this process's rq uses, or None while rq is not imported yet."""
    defaults = sys.modules.get("rq.defaults")
    return None if defaults is None else str(defaults.RQ_KEY_PREFIX)


def use_rq_prefix(keys: Keys) -> str:
    """Make this process's rq name its keys under `keys.rq_prefix`; call it before rq is first imported.

    Raises ValueError for a prefix rq cannot use, RQPrefixError where rq is already imported with another one."""
    wanted = keys.rq_prefix
    if not ALLOWED.fullmatch(wanted):
        raise ValueError(f"OVQ_KEY_PREFIX {keys.prefix!r} cannot name rq's keys: the Batch API needs a prefix of "
                         "letters, digits and _ . : - only")
    loaded = imported_prefix()
    if loaded is not None:
        if loaded != wanted:
            raise RQPrefixError(f"rq was imported with {ENV}={loaded!r} before ovq set it to {wanted!r} "
                                f"(OVQ_KEY_PREFIX={keys.prefix!r}): start the process with {ENV}={wanted}")
        return wanted
    if os.environ.get(ENV, wanted) != wanted:
        log.warning("%s=%s ignored: ovq's rq keys are %s:* (OVQ_KEY_PREFIX=%s)", ENV, os.environ[ENV], wanted,
                    keys.prefix)
    os.environ[ENV] = wanted
    return wanted
