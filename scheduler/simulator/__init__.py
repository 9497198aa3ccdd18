"""Discrete-event simulator of one or more engines driven by the real policies and planner."""

from scheduler.simulator.engine import EngineConfig, SimEngine
from scheduler.simulator.replay import SimConfig, SimResult, simulate

__all__ = ["EngineConfig", "SimConfig", "SimEngine", "SimResult", "simulate"]
