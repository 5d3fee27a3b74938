"""Following the models file: a changed stat reads it again and says what changed; a file that does not parse
keeps the last good catalog; the fleet's reload generation forces a read."""
from __future__ import annotations

import os
from pathlib import Path

from common.models.watch import ConfigWatch
from common.settings import Settings

FILE = "models:\n  a: {path: /a}\n  b: {path: /b, max_num_seqs: 4}\n"


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    stat = path.stat()  # a new mtime even within the filesystem's clock tick
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def test_an_unchanged_file_is_not_read_again(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    _write(path, FILE)
    reads = []
    watch = ConfigWatch(Settings(config=path))
    watch._read = lambda settings: reads.append(1) or ConfigWatch(settings).catalog  # type: ignore[method-assign]
    assert not watch.poll()
    assert reads == []


def test_added_removed_and_changed_models_are_told_apart(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    _write(path, FILE)
    watch = ConfigWatch(Settings(config=path))
    _write(path, "models:\n  b: {path: /b, max_num_seqs: 8}\n  c: {path: /c}\naliases:\n  chat: {b: 1, c: 1}\n")
    change = watch.poll()
    assert (change.added, change.removed, change.changed, change.aliases) == (["c"], ["a"], ["b"], True)
    assert watch.catalog.names == ["b", "c"] and watch.catalog.model("b").max_num_seqs == 8
    assert not watch.poll()


def test_a_broken_file_keeps_the_last_good_catalog(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    _write(path, FILE)
    watch = ConfigWatch(Settings(config=path))
    _write(path, "models:\n  a: {path: /a, no_such_option: 1}\n")
    assert not watch.poll()
    assert watch.catalog.names == ["a", "b"] and "no_such_option" in (watch.error or "")
    _write(path, "models:\n  a: {path: /a}\n")
    assert watch.poll().removed == ["b"] and watch.error is None


def test_the_reload_generation_forces_a_read(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    _write(path, FILE)
    watch = ConfigWatch(Settings(config=path))
    assert not watch.heard(0)  # the first value heard is the mark (0: nobody reloaded yet)
    assert not watch.heard(0)
    assert watch.heard(1)
    assert not watch.heard(None)  # Redis out of reach: no news
    assert not watch.heard(1)
    stat = path.stat()
    path.write_text(FILE.replace("max_num_seqs: 4", "max_num_seqs: 5"))  # the same size
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # and the same mtime: the stat cannot tell
    assert not watch.poll()
    assert watch.poll(force=True).changed == ["b"]
