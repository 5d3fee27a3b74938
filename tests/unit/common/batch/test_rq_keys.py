"""rq's key names under ovq's prefix. rq reads its prefix once per process, when first imported: each case runs in
a fresh interpreter."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from common.batch.rq_keys import use_rq_prefix
from common.keys import Keys
from tests.conftest import ROOT

# Every name rq 3.0 builds, from the module or class that builds it (no Redis needed: nothing is sent).
NAMES = """
import redis
from rq import Queue, Worker, command, scheduler, suspension, worker_registration
from rq.executions import Execution, ExecutionRegistry, WORKER_EXECUTIONS_KEY_TEMPLATE
from rq.group import Group
from rq.job import Job
from rq.registry import (CanceledJobRegistry, DeferredJobRegistry, FailedJobRegistry, FinishedJobRegistry,
                         ScheduledJobRegistry, StartedJobRegistry)
from rq.results import Result

connection = redis.Redis()
queue = Queue("dep-batches", connection=connection)
names = [queue.key, queue.intermediate_queue_key, queue.registry_cleaning_key, Queue.redis_queues_keys,
         Job.key_for("j1"), Job.dependents_key_for("j1"), Result.get_key("j1"), ExecutionRegistry("j1", connection).key,
         Execution("e1", "j1", connection).key, WORKER_EXECUTIONS_KEY_TEMPLATE.format("w1"),
         Worker.redis_worker_namespace_prefix + "w1", Worker.redis_workers_keys,
         worker_registration.WORKERS_BY_QUEUE_KEY % queue.name, scheduler.SCHEDULER_KEY_TEMPLATE % queue.name,
         scheduler.SCHEDULER_LOCKING_KEY_TEMPLATE % queue.name, suspension.WORKERS_SUSPENDED,
         command.PUBSUB_CHANNEL_TEMPLATE % "w1", Group.REDIS_GROUP_KEY, Group.REDIS_GROUP_NAME_PREFIX + "g1"]
names += [cls(queue.name, connection=connection).key for cls in (
    StartedJobRegistry, FinishedJobRegistry, FailedJobRegistry, DeferredJobRegistry, ScheduledJobRegistry,
    CanceledJobRegistry)]
"""


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "RQ_KEY_PREFIX"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**environ, "PYTHONPATH": str(ROOT), **env})


def names_under(prefix: str, **env: str) -> list[str]:
    done = run(f"""
        import json
        from common.batch.rq_keys import use_rq_prefix
        from common.keys import Keys
        use_rq_prefix(Keys({prefix!r}))
        {textwrap.indent(NAMES, "        ").strip()}
        print(json.dumps(names))
        """, **env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_rq_prefix_is_the_key_prefix_with_rq() -> None:
    assert Keys("dep").rq_prefix == "dep:rq"
    # ovq's own keys never use the `rq` segment, so rq's cannot meet them.
    keys = Keys("dep")
    assert not any(name.startswith("dep:rq:") for name in (keys.jobs("m", "d"), keys.job("j"), keys.worker("w"),
                                                          keys.batch("b"), keys.files, keys.failed))


def test_every_name_rq_builds_starts_with_the_deployments_prefix() -> None:
    a, b = names_under("dep-a"), names_under("dep-b")
    assert len(a) == len(b) == 25
    assert all(name.startswith("dep-a:rq:") for name in a), a
    assert all(name.startswith("dep-b:rq:") for name in b), b
    assert not set(a) & set(b)


def test_an_rq_key_prefix_in_the_environment_gives_way_to_ovqs() -> None:
    assert all(name.startswith("dep-a:rq:") for name in names_under("dep-a", RQ_KEY_PREFIX="other"))


def test_a_process_whose_rq_was_imported_under_another_prefix_refuses() -> None:
    done = run("""
        import rq
        from common.batch.rq_keys import RQPrefixError, use_rq_prefix
        from common.keys import Keys
        try:
            use_rq_prefix(Keys("dep-a"))
        except RQPrefixError as exc:
            print("refused:", exc)
        """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused: rq was imported with RQ_KEY_PREFIX='rq'"), done.stdout


def test_the_same_prefix_twice_is_fine() -> None:
    done = run("""
        from common.batch.rq_keys import use_rq_prefix
        from common.keys import Keys
        use_rq_prefix(Keys("dep-a"))
        import rq.defaults
        print(use_rq_prefix(Keys("dep-a")), rq.defaults.RQ_KEY_PREFIX)
        """)
    assert done.stdout.split() == ["dep-a:rq", "dep-a:rq"], done.stderr


@pytest.mark.parametrize("prefix", ["two words", "a/b", "é"])
def test_a_prefix_rq_cannot_use_is_refused_by_name(prefix: str) -> None:
    with pytest.raises(ValueError, match="OVQ_KEY_PREFIX"):
        use_rq_prefix(Keys(prefix))
