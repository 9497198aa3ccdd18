"""The in-process scheduler harness for tests (`engine.offline_scheduler`)."""

from engine.offline_scheduler import BLOCK_HASHER, BS, PARTIAL, Driver, final, make_scheduler

__all__ = ["BLOCK_HASHER", "BS", "PARTIAL", "Driver", "final", "make_scheduler"]
