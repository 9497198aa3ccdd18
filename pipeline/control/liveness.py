"""Whether a named Serve actor (an ingress replica) still exists: a dead replica's name is released.

One GCS lookup, off the event loop. Asked on rare paths only: a session whose driving ingress may
be gone (`pipeline.replica.session_owners`), a change claim held by an ingress that may have died
between its claim and its commit (`pipeline.sessions.store`).
"""

from __future__ import annotations

import asyncio


async def serve_actor_alive(name: str) -> bool:
    """Whether the named actor in Serve's namespace exists (a dead replica's name is released)."""
    import ray
    from ray.serve._private.constants import SERVE_NAMESPACE

    def lookup() -> bool:
        try:
            ray.get_actor(name, namespace=SERVE_NAMESPACE)
        except ValueError:  # no such actor: it died (or never was)
            return False
        except Exception:  # noqa: BLE001 - the GCS unreachable for a moment: not a verdict of death
            return True
        return True

    return await asyncio.to_thread(lookup)
