"""Discrete-event simulator of one or more engines driven by the real policies and planner."""

from scheduler.simulator.engine import SimEngine, SimEngineConfig
from scheduler.simulator.replay import SimConfig, SimResult, simulate

__all__ = ["SimConfig", "SimEngine", "SimEngineConfig", "SimResult", "simulate"]
