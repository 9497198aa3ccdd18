"""Clean-up calls that a client disconnect cannot cancel (aborts, releases after a cut request)."""

from __future__ import annotations

import asyncio
import contextvars

_CLEANUPS: set[asyncio.Task] = set()  # clean-up tasks in flight (strong references)


def cleanup(coro):
    """Run a clean-up call so that a client disconnect cannot cancel it.

    `asyncio.shield` is not enough: Serve cancels every handle call made under a cancelled
    request's context, clean-up calls included. A task started in a fresh context is not the
    request's child; awaiting it shielded keeps the order (clean up, then finish) on normal exits.
    """
    task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
    # The loop holds tasks weakly: once the cancelled caller stops awaiting, nothing else may.
    _CLEANUPS.add(task)
    task.add_done_callback(_CLEANUPS.discard)
    return asyncio.shield(task)
