"""Where the toolkit keeps what it may forget: facts keyed by content (a wheel's sha256, a layer's diff id), so an
entry is never stale, only missing. $XLA_IMAGES_CACHE, else $XDG_CACHE_HOME/xla-images (~/.cache/xla-images)."""
from __future__ import annotations

from pathlib import Path

from . import settings

CACHE_ENV = settings.CACHE.env[0]


def cache_dir() -> Path:
    """Read at each call (the setting is declared and read in xla_images/settings.py)."""
    return settings.read_cache_dir()
