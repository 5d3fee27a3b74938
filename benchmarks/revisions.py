"""The trees a before-and-after benchmark runs: this one, and another revision's as a git worktree beside it.

Machines here are noisy, so a speed-up is only worth what one run measuring both sides shows: each benchmark with
`--baseline REV` starts that revision's API and workers from the worktree, setting by setting, right before this
tree's."""
from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def trees(baseline: str | None) -> Iterator[list[tuple[str, Path]]]:
    """[(label, root)]: the baseline's worktree first (when given), then this tree; the worktree goes afterwards."""
    if not baseline:
        yield [("this tree", ROOT)]
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", tmp, baseline], check=True,
                       capture_output=True)
        try:
            yield [(baseline, Path(tmp)), ("this tree", ROOT)]
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", tmp], check=False)
