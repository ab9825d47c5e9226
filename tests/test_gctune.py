"""otelbpf.runtime.gctune: the agent's garbage-collection settings after start-up."""

from __future__ import annotations

import gc

from otelbpf.runtime import gctune


def test_tune_freezes_the_start_up_heap_and_raises_the_thresholds() -> None:
    saved = gc.get_threshold()
    try:
        previous = gctune.tune()
        assert previous == saved
        assert gc.get_threshold() == (gctune.GEN0_THRESHOLD, gctune.OLDER_THRESHOLD, gctune.OLDER_THRESHOLD)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


def test_cycles_are_still_collected_after_tuning() -> None:
    saved = gc.get_threshold()
    try:
        gctune.tune()
        collected = []

        class Node:
            def __del__(self) -> None:
                collected.append(self)

        for _ in range(3 * gctune.GEN0_THRESHOLD // 2):  # cycles only the collector can free
            node = Node()
            node.self = node
        del node
        assert collected, "no cycle was collected after more than GEN0_THRESHOLD allocations"
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
