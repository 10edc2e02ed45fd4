"""Startup hook shipped in every image: a home and caches that work under any UID.

Copied into the image's site-packages as `xla_images_home.py` with a one-line `.pth` file that imports it, so it
runs at the start of every python process of the venv (python, pip, `xla-images-check`, a Kubernetes `command:`
that skips any entrypoint). It imports only the standard library and never raises: a startup hook that fails would
break every python in the image.

Two things go wrong for a UID the image does not know (`docker run --user 12345`, OpenShift, a pod's runAsUser):
- `getpass.getuser()` raises KeyError (no passwd entry, no USER in the environment); torch calls it on import to
  name its inductor cache directory. The hook sets USER to the UID's digits when no name can be found.
- The image's HOME and caches (under IMAGE_HOME, group-0 writable) are not writable by a UID outside group 0, nor
  by anyone on a read-only root filesystem. The hook moves each such variable still under IMAGE_HOME to the same
  path under FALLBACK_ROOT/xla-home-<uid> (made 0700), when that is writable. Values a user set elsewhere are
  never touched; XLA_IMAGES_HOME_FALLBACK=0 turns the move off.

The image's defaults (docs/running.md): HOME=/home/xla, XDG_CACHE_HOME=$HOME/.cache (pip's cache follows it),
TORCHINDUCTOR_CACHE_DIR=$XDG_CACHE_HOME/torchinductor; XLA's persistent compile cache is off unless a user turns
it on (torch_xla.runtime.initialize_cache or XLA_PERSISTENT_CACHE_PATH), and a path under HOME is moved too.
"""
from __future__ import annotations

import os

IMAGE_HOME = "/home/xla"
FALLBACK_ROOT = "/tmp"
# What the hook may move, HOME first: the caches' defaults live under it.
VARIABLES = ("HOME", "XDG_CACHE_HOME", "TORCHINDUCTOR_CACHE_DIR", "PIP_CACHE_DIR", "TRITON_CACHE_DIR",
             "XLA_PERSISTENT_CACHE_PATH")
# The names getpass.getuser() reads, in its order, before it asks the passwd database.
USER_VARIABLES = ("LOGNAME", "USER", "LNAME", "USERNAME")
SWITCH = "XLA_IMAGES_HOME_FALLBACK"


def writable(path: str) -> bool:
    """Whether this process can create `path` or write in it: its nearest existing ancestor decides."""
    while path and not os.path.exists(path):
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def fallback_home(uid: int, root: str = FALLBACK_ROOT) -> str | None:
    """FALLBACK_ROOT/xla-home-<uid>, made private to this UID; None when it cannot be made or someone else owns it."""
    home = os.path.join(root, f"xla-home-{uid}")
    try:
        os.makedirs(home, mode=0o700, exist_ok=True)
        owner = os.stat(home).st_uid
    except OSError:
        return None
    return home if owner == uid and writable(home) else None


def settle(environ: dict[str, str] | os._Environ, uid: int, *, image_home: str = IMAGE_HOME,
           root: str = FALLBACK_ROOT) -> dict[str, str]:
    """Fix `environ` in place for this UID; returns what changed (name -> new value)."""
    changed: dict[str, str] = {}
    if not any(environ.get(name) for name in USER_VARIABLES):
        try:
            import pwd  # POSIX only, and only needed here
            pwd.getpwuid(uid)
        except KeyError:
            changed["USER"] = str(uid)
        except ImportError:
            pass
    if environ.get(SWITCH, "1") != "0":
        fallback = None
        for name in VARIABLES:
            value = environ.get(name, "")
            if not (value == image_home or value.startswith(image_home + "/")) or writable(value):
                continue
            fallback = fallback or fallback_home(uid, root)
            if fallback is None:
                break
            changed[name] = fallback + value[len(image_home):]
    environ.update(changed)
    return changed


def _startup() -> None:
    try:
        settle(os.environ, os.getuid())
    except Exception:  # noqa: BLE001 - a startup hook must never stop python from starting
        pass


if __name__ == "xla_images_home":  # imported by the image's .pth file, not when the toolkit imports it
    _startup()
