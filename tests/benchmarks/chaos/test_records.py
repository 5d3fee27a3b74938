"""benchmarks/chaos/records.py: a run saved and loaded again is the same run (`chaos.py --check` re-checks one)."""
from __future__ import annotations

from pathlib import Path

from benchmarks.chaos.records import load, save
from tests.benchmarks.chaos.test_checker import _by_key, _clean_run


def test_a_saved_run_loads_as_it_was(tmp_path: Path) -> None:
    run = _clean_run()
    _by_key(run, "s1").journal = [(1, True), (2, False)]
    save(run, tmp_path / "records.json")
    assert load(tmp_path / "records.json") == run
