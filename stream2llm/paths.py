"""Where generated artefacts (converted models, indexes, traces) live.

Everything generated at set-up goes under one cache folder so that nothing large is ever committed.
"""

import os
from pathlib import Path

CACHE_ENV = "STREAM2LLM_CACHE"


def cache_dir() -> Path:
    """The cache folder: $STREAM2LLM_CACHE, else the user's cache dir (~/.cache/stream2llm)."""
    override = os.environ.get(CACHE_ENV)
    if override:
        path = Path(override).expanduser()
    else:
        from platformdirs import user_cache_dir

        path = Path(user_cache_dir("stream2llm"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def cache_path(*parts: str) -> Path:
    """A path inside the cache folder (parents are not created)."""
    return cache_dir().joinpath(*parts)
