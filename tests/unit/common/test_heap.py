"""The cycle collector's settings for a long-running process."""
from __future__ import annotations

import gc

from common import heap


def test_settle_freezes_what_startup_built_and_collects_the_young_less_often() -> None:
    threshold = gc.get_threshold()
    try:
        heap.settle()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, *threshold[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
