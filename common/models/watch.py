"""Following the models file (or an OVMS config.json) while running: what changed since the last read.

Polled, not watched with inotify: a Kubernetes ConfigMap is updated by swapping a symlink, NFS and other shared
mounts send no events, and a stat per second per process costs nothing. The stat (mtime, size, inode) says when
to read again; a forced read (`POST /v1/config/reload`, the fleet's reload generation) reads regardless, which also
catches an OVMS graph.pbtxt edited without its config.json. A file that does not parse changes nothing (as OVMS:
the last good configuration stays) and says why once."""
from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from common.models.sources import Catalog, configured_catalog
from common.settings import Settings

log = logging.getLogger("ovq.config")

Stamp = tuple[int, int, int] | None


@dataclass
class Change:
    """A new catalog against the last one: models added, removed, and changed (any option), by name; aliases."""

    catalog: Catalog
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    aliases: bool = False

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed or self.aliases)

    def describe(self) -> str:
        parts = [f"{what} {', '.join(names)}" for what, names in
                 (("added", self.added), ("removed", self.removed), ("changed", self.changed)) if names]
        return "; ".join(parts + (["aliases changed"] if self.aliases else [])) or "no change"


def diff(old: Catalog, new: Catalog) -> Change:
    before = {m.name: m for m in old.models}
    after = {m.name: m for m in new.models}
    return Change(new, added=[n for n in after if n not in before], removed=[n for n in before if n not in after],
                  changed=[n for n in after if n in before and after[n] != before[n]],
                  aliases=old.aliases != new.aliases)


class ConfigWatch:
    """The catalog this process serves now, and `poll()` for what changed in the file since."""

    def __init__(self, settings: Settings, catalog: Catalog | None = None,
                 read: Callable[[Settings], Catalog] = configured_catalog) -> None:
        self.settings, self._read = settings, read
        self.path = settings.config or settings.ovms_config
        self._stamp = self._stat()
        self.catalog = catalog if catalog is not None else read(settings)
        self.error: str | None = None  # why the file's current content is not served (None: it is)
        self._generation: int | None = None

    def heard(self, generation: int | None) -> bool:
        """Whether the fleet's reload generation (`Keys.config_generation`; 0 while nobody reloaded) moved since
        the last value heard: then the file is read regardless of its stat (`poll(force=True)`). The first value
        only sets the mark; None (Redis out of reach) changes nothing."""
        if generation is None:
            return False
        moved = self._generation is not None and generation != self._generation
        self._generation = generation
        return moved

    def _stat(self) -> Stamp:
        if self.path is None:
            return None
        target = self.path / "config.json" if self.path.is_dir() else self.path
        try:
            found = os.stat(target)  # follows symlinks: a ConfigMap's `..data` swap changes the inode
        except OSError:
            return None
        return found.st_mtime_ns, found.st_size, found.st_ino

    def poll(self, force: bool = False) -> Change:
        """Read the file again when its stat changed (or `force`); what changed, falsy when nothing did. A file
        that does not read or validate keeps the last catalog and sets `error`."""
        if self.path is None:
            return Change(self.catalog)
        stamp = self._stat()
        if stamp == self._stamp and not force:
            return Change(self.catalog)
        self._stamp = stamp
        try:
            catalog = self._read(self.settings)
        except Exception as exc:  # yaml, JSON, pydantic, a missing file: one line, the old catalog stays
            error = f"{self.path}: {exc}".replace("\n", " ")
            if error != self.error:
                log.error("configuration not reloaded, the last good one stays: %s", error)
            self.error = error
            return Change(self.catalog)
        self.error = None
        change = diff(self.catalog, catalog)
        self.catalog = catalog
        if change:
            log.warning("configuration reloaded from %s: %s", self.path, change.describe())
        return change
