"""Where the toolkit keeps what it may forget: facts keyed by content (a wheel's sha256, a layer's diff id), so an
entry is never stale, only missing. $XLA_IMAGES_CACHE, else $XDG_CACHE_HOME/xla-images (~/.cache/xla-images)."""
from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "XLA_IMAGES_CACHE"


def cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV)
    if configured:
        return Path(configured)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "xla-images"
