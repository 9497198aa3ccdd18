"""The in-process scheduler harness for tests (`engine.offline_scheduler`)."""

from engine.offline_scheduler import BS, PARTIAL, Driver, final, make_scheduler

__all__ = ["BS", "PARTIAL", "Driver", "final", "make_scheduler"]
