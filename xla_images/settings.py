"""Every setting of the toolkit, declared once: its name, type, default, rule, environment variable, `--set` key
and doc line (as cibuildwheel's options table).

Two kinds. A *site* setting lives in site.yaml (over xla_images/site_defaults.yaml, under `--set KEY=VALUE`):
model.site takes its keys, which `--set` values are text rather than YAML, and the order its validators run in
from SITE_SETTINGS; generate.schemas its descriptions; docs/site.md its list (rendered by `render`, drift-checked
by `render --check`). An *environment* setting is a variable only, read by its `read_*` function here and
nowhere else: the builder and the cosign key's password at the CLI's edge, handed to build, doctor and sign code
as arguments; the others (pull stall, cache, lock dir, state, CI) by the module that needs them, through their
`read_*`, when it needs them (so a test's monkeypatched variable is what is read). The environment a child process
inherits is copied in one place too (`child_environment`).

What only the docker/TLS world defines (DOCKER_HOST, DOCKER_CONFIG, SSL_CERT_FILE for the registry client,
credential helpers) stays with the code that follows those conventions (run.engine.connection, run.registry.tls
and credentials); abi/, imagecheck/ and layers.py run inside images without this package and read their own.
tests/unit/test_architecture.py lists every product module that reads the environment (ENVIRONMENT_READERS).

Adding a setting: docs/architecture.md, "A setting".
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from .errors import Failure
from .names import DEFAULT_STATE, STATE_ENV


@dataclass(frozen=True)
class Setting:
    name: str  # the site.yaml key (site settings) or the setting's name in the docs (environment settings)
    type: str  # what a value is, as the docs say it
    default: str  # the default, as the docs show it (a site setting's value is site_defaults.yaml's)
    doc: str  # one doc line (markdown), rendered into docs/site.md and the JSON Schema's description
    rules: tuple[str, ...] = ()  # the rule ids its validation raises (xla_images/rules.py)
    env: tuple[str, ...] = ()  # the environment variables it reads, in order
    set_key: str | None = None  # the `--set` form (site settings only)
    set_text: bool = False  # `--set` takes the value as text, not YAML (`3.11` or `none` stay strings)
    site: bool = True  # a site.yaml key; False: an environment variable only


# The order is the validators' (model.site reports every bad setting in this order) and the docs'.
SITE_SETTINGS: tuple[Setting, ...] = (
    Setting("registry", "`HOST[:PORT]/REPO`", "`127.0.0.1:5000/xla-images`",
            "where `push` sends images and `resolve`/`pull`/`prune` look by default.",
            rules=("site-registry",), set_key="registry", set_text=True),
    Setting("ca_bundle", "a path, `auto` or `none`", "`auto`",
            "a PEM file the build's pip trusts (the wheels stage only, never the image); `auto` takes "
            "`$PIP_CERT`, `$SSL_CERT_FILE` or `$REQUESTS_CA_BUNDLE`; `none` injects no bundle.",
            rules=("site-ca-bundle", "ca-bundle-exists"), env=("PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE"),
            set_key="ca_bundle", set_text=True),
    Setting("bases", "python → image", "`{}` (every python: `python:X.Y-slim-bookworm`)",
            "the base image per python; `--set bases.3.11=IMAGE` sets one.",
            rules=("site-bases",), set_key="bases.X.Y"),
    Setting("wheel_sources", "a list of sources", "the default index (pre-C++11 below 2.7, C++11 from 2.7) and "
            "a wheelhouse for C++11 2.6",
            "where each flavour's wheels come from, first match wins; `match` on a `torch_xla` specifier, an "
            "`abi` and a `channel`; then one of `index_url`, `find_links` or `wheelhouse`, and optional local "
            "version labels `torch_local` / `torch_xla_local` (`+cxx11`). An `index_url` may carry credentials "
            "(`https://user:secret@host/simple/`): pip and `update` send them to that index, and every line or "
            "error printed shows `https://***@host/...`; `update` writes the index into the committed "
            "`matrix.wheels.json` without them.",
            rules=("site-wheel-sources",), set_key="wheel_sources"),
    Setting("cosign_public_key", "a path or a cosign key URI", "none",
            "the key `resolve --verify` and `verify` use by default (see "
            "[publishing.md](publishing.md#sbom-signing-and-verification)).",
            rules=("site-cosign-public-key",), set_key="cosign_public_key", set_text=True),
    Setting("compression", "`format`, `level`", "`zstd`, level 3",
            "how pushed layers are compressed; `zstd` (the default; level 1–19, default 3; pulling needs Docker "
            "23+ or containerd 1.5+) or `gzip` (every engine pulls it). On an engine with the containerd image "
            "store (what `ci/engine.sh` starts), `build` stores the layers compressed so and the engine pushes "
            "them as they are; on a classic-store engine, the toolkit compresses zstd layers on all cores at "
            "push time and the engine compresses gzip ones (see [pulls.md](pulls.md)). Numbers are written in "
            "decimal: YAML 1.1's `0x3`, `0b11` or `3:00` are refused (`site-number`), in site.yaml and in `--set`.",
            rules=("site-compression",), set_key="compression"),
    Setting("pull_mirror", "`HOST[:PORT][/PREFIX]`", "none",
            "a zone's pull-through cache that every `pull` and `resolve` of the site goes through; `--mirror` "
            "overrides it, `--set pull_mirror=` turns it off (see [mirror.md](mirror.md)).",
            rules=("site-pull-mirror",), set_key="pull_mirror", set_text=True),
    Setting("build_cache", "`HOST[:PORT]/REPO`", "none",
            "a registry repository for BuildKit's build cache (`--cache-to type=registry,mode=max` and "
            "`--cache-from`, one tag per flavour): each engine that builds a flavour imports what any engine "
            "exported for it and for its release's other flavours of the same python, instead of building those "
            "layers again (see [engines.md](engines.md)). Secrets (pip settings, the CA bundle) are mounts, never "
            "in it. BuildKit builds only; `--set build_cache=` turns it off.",
            rules=("site-build-cache",), set_key="build_cache", set_text=True),
)

BUILDER = Setting("builder", "`buildkit`, `classic` or `auto`", "`auto`",
                  "which builder `build` uses: `auto` takes BuildKit (`docker buildx`) when it works, else the "
                  "classic builder; `buildkit` demands BuildKit (an error when it cannot be used); `classic` "
                  "forces the classic builder. `doctor` reports the choice.",
                  rules=("buildkit",), env=("XLA_IMAGES_BUILDER",), site=False)
BUILDER_CHOICES = ("auto", "buildkit", "classic")
PULL_STALL = Setting("pull_stall", "seconds, 1–3600", "`120`",
                     "how long a pull may make no progress before it is cancelled and retried.",
                     rules=("pull-stall",), env=("XLA_IMAGES_PULL_STALL_SECONDS",), site=False)
PULL_STALL_SECONDS = 120.0
CACHE = Setting("cache", "a folder", "`$XDG_CACHE_HOME/xla-images` (`~/.cache/xla-images`)",
                "where the toolkit keeps what it may forget, keyed by content (wheel facts, layer layouts, stored "
                "layers): an entry is never stale, only missing.", env=("XLA_IMAGES_CACHE", "XDG_CACHE_HOME"),
                site=False)
LOCK_DIR = Setting("lock_dir", "a folder", "`/tmp/xla-images-locks`",
                   "where `build` keeps its one-build-per-flavour locks (shared by every checkout on the engine).",
                   env=("XLA_IMAGES_LOCK_DIR",), site=False)
STATE = Setting("state", "a folder", f"`{DEFAULT_STATE}`",
                "the engine's and local registries' data (`ci/engine.sh`, `ci/registry.sh`); `prune` finds the "
                "registry it collects garbage in there.", env=(STATE_ENV,), site=False)
CI = Setting("ci", "`1`, `true` or `yes`", "unset",
             "set by CI services: plain progress lines instead of live tables.", env=("CI",), site=False)

COSIGN_PASSWORD = Setting("cosign_password", "a secret", "unset",
                          "the password of the key `sign` signs with (empty for a key made without one); read "
                          "at the CLI's edge, handed to cosign in its environment, never printed or written.",
                          rules=("sign-password",), env=("COSIGN_PASSWORD",), site=False)

ENV_SETTINGS: tuple[Setting, ...] = (BUILDER, PULL_STALL, CACHE, LOCK_DIR, STATE, CI, COSIGN_PASSWORD)

SETTINGS: tuple[Setting, ...] = SITE_SETTINGS + ENV_SETTINGS
SITE_KEYS = frozenset(setting.name for setting in SITE_SETTINGS)
SET_TEXT_KEYS = frozenset(setting.name for setting in SITE_SETTINGS if setting.set_text)


def site_setting(name: str) -> Setting:
    return next(setting for setting in SITE_SETTINGS if setting.name == name)


# --- the environment: read here (or at the CLI's edge), handed on as arguments ------------------------------

def read_builder(environ: Mapping[str, str] | None = None) -> str:
    """$XLA_IMAGES_BUILDER, lower-cased, else `auto`. Any other word means `auto`, as it always has (only the
    two words that force a builder are acted on)."""
    environ = os.environ if environ is None else environ
    return environ.get(BUILDER.env[0], BUILDER.default.strip("`")).strip().lower()


def read_pull_stall(environ: Mapping[str, str] | None = None) -> float:
    """$XLA_IMAGES_PULL_STALL_SECONDS, else PULL_STALL_SECONDS; a bad value is a Failure (rule pull-stall)."""
    environ = os.environ if environ is None else environ
    name = PULL_STALL.env[0]
    text = environ.get(name, "").strip()
    if not text:
        return PULL_STALL_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 1 <= seconds <= 3600:  # NaN fails too
        raise Failure(f"{name}={text!r} is not a number of seconds between 1 and 3600", rule="pull-stall",
                      hint=f"unset it for the default ({PULL_STALL_SECONDS:.0f} s)")
    return seconds


def read_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$XLA_IMAGES_CACHE, else $XDG_CACHE_HOME/xla-images, else ~/.cache/xla-images."""
    environ = os.environ if environ is None else environ
    configured = environ.get(CACHE.env[0])
    if configured:
        return Path(configured)
    return Path(environ.get(CACHE.env[1]) or Path.home() / ".cache") / "xla-images"


def read_lock_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get(LOCK_DIR.env[0]) or LOCK_DIR.default.strip("`"))


def read_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    return Path(environ.get(STATE.env[0], STATE.default.strip("`")))


def read_ci(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return environ.get(CI.env[0], "").lower() in ("1", "true", "yes")


def read_cosign_password(environ: Mapping[str, str] | None = None) -> str | None:
    """The signing key's password, None when the variable is unset (an empty one is a key without a password)."""
    environ = os.environ if environ is None else environ
    return environ.get(COSIGN_PASSWORD.env[0])


def child_environment(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment a child process (buildx, pip, cosign, ci/registry.sh) starts with: ours, which it reads by
    its own conventions, with `extra` on top. Not a setting: the one place the toolkit copies its environment."""
    return {**os.environ, **(extra or {})}


def read_ca_bundle(environ: Mapping[str, str] | None = None) -> Path | None:
    """`ca_bundle: auto`: the first of ca_bundle's variables that names an existing file, else None."""
    environ = os.environ if environ is None else environ
    for name in site_setting("ca_bundle").env:
        value = environ.get(name)
        if value and Path(value).is_file():
            return Path(value)
    return None


# --- docs/site.md's list, rendered ---------------------------------------------------------------------------

DOC_BEGIN = "<!-- settings: generated by `build.py render` from xla_images/settings.py; edit it there -->"
DOC_END = "<!-- end of settings -->"


def doc_lines() -> list[str]:
    """The generated settings list of docs/site.md: each site setting, then the environment settings."""
    lines = [DOC_BEGIN, ""]
    for setting in SITE_SETTINGS:
        lines.append(f"- `{setting.name}` ({setting.type}; default {setting.default}; "
                     f"`--set {setting.set_key}=…`): {setting.doc}")
    lines += ["", "Settings read from the environment only:", ""]
    for setting in ENV_SETTINGS:
        lines.append(f"- `{setting.env[0]}` ({setting.type}; default {setting.default}): {setting.doc}")
    return lines + ["", DOC_END]

