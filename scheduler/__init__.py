"""Streaming-aware scheduling: policies, the two-phase planner, cost models, a simulator.

Pure: no vLLM and no Ray imports here, so the same policy objects run inside the engine's
scheduler (`engine/`), in unit tests and in the discrete-event simulator.
"""
