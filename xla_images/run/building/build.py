"""Build flavour images on the Docker engine: context, base, streaming build, tag, clean up.

How a flavour is built:
  1. skip it when `xla-images:<tag>` already carries the flavour's content-addressed id (unless forced) and, on
     the containerd image store, holds its layers in the site's compression (an image pulled from a gzip
     registry is built again, saying so: the push sends the stored blobs as they are);
  2. check its committed lock is fresh, pick its base image (site base if present or pullable, else the
     bootstrapped `xla-images/base:<python>`), write a context to a temp dir;
  3. build the flavour UNTAGGED through BuildKit (`docker buildx build`; the site's pip settings and CA bundle
     are BuildKit secrets, outside the context, mounted for the pip step only), streaming the output to
     reports/<tag>/build.log and the display. On an engine without buildx the classic builder does it: the
     `base` stage once per python first (so parallel flavours share its layers), then the flavour from a
     Dockerfile whose secret mounts became COPYs into the wheels stage (rm + forcerm: the engine removes step
     containers even on failure). Into dockerd's containerd image store, BuildKit writes every layer compressed
     as the site's `compression` says, so the push later sends the stored blobs as they are;
  4. only then tag it `xla-images:<tag>` and its aliases. A failed or interrupted build tags nothing, so an
     earlier good image keeps its tag.
When all builds have stopped, what they left behind is removed: step containers an abort raced with, the
failed stage's untagged images, and the finished `wheels` stage (it holds a second copy of the venv and the
CA bundle; the image only copies the venv out of it).
"""
from __future__ import annotations

import dataclasses
import enum
import queue
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ... import diskio, settings
from ...errors import Failure
from ...generate.plan import Plan
from ...model.compression import LAYER_MEDIA_TYPES, Compression
from ...model.target import Target
from ...names import BASE_STAGE, DOCKERFILE, FLAVOUR_ID_LABEL, LOCAL_REPOSITORY, REPORTS, SOURCE_DATE_EPOCH, local_ref
from . import base as bases, build_mutex
from .groups import cache_group
from .. import engine
from ..packages import lock as locks
from .context import context_secrets, prepare_classic_context, write_context
from .workers import Workers

BUILD_LOG = "build.log"


def built_image_id(flavour: Target) -> str | None:
    """The id of `xla-images:<tag>` if it was built from exactly this flavour's inputs, else None."""
    attrs = engine.images.image_inspect(local_ref(flavour.tag))
    if attrs is None:
        return None
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    return str(attrs["Id"]) if flavour.id and labels.get(FLAVOUR_ID_LABEL) == flavour.id else None


def require_built(flavour: Target) -> str:
    """`xla-images:<tag>` of a flavour that must be on the engine (what `test` and `bench` run), else a Failure."""
    image = local_ref(flavour.tag)
    if engine.images.image_labels(image) is None:
        raise Failure(f"{image} is not built", rule="image-built", hint=f"build it: `build.py build {flavour.tag}`")
    return image


class Outcome(str, enum.Enum):
    BUILT = "built"
    SKIPPED = "up to date"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    NOT_STARTED = "not started"


@dataclass
class FlavourResult:
    flavour: Target
    outcome: Outcome = Outcome.NOT_STARTED
    seconds: float = 0.0
    image_id: str | None = None
    size_bytes: int = 0
    base_image: str | None = None
    message: str = ""
    log: Path | None = None


@dataclass(frozen=True)
class BuildOptions:
    jobs: int = 1
    keep_going: bool = False
    force: bool = False
    # The CA bundle the wheels stage trusts; None: the site's (site.ca_bundle(): PIP_CERT, SSL_CERT_FILE...).
    ca_bundle: Path | None = None
    # An extra host folder to look for locked wheels in (default: <repo>/wheelhouse).
    wheelhouse: Path | None = None
    reports_dir: Path | None = None
    # Run every step again (BuildKit `--no-cache`): what a reproducibility check rebuilds with.
    no_cache: bool = False
    # Drop the engine's unused build cache once the last image of a cache group (groups.cache_group: a release
    # on one python) was built: BuildKit keeps a real flavour's installed venv (~7.5 GB) beside its image, which a
    # disk-bound runner cannot afford group after group; within a group the next image reuses it.
    prune_cache: bool = False
    # The builder setting (`auto`, `buildkit` or `classic`; xla_images/settings.py): the CLI passes what
    # $XLA_IMAGES_BUILDER says; a caller that gives none gets the same reading.
    builder: str = field(default_factory=settings.read_builder)
    # BuildKit's registry cache repository (engine.buildkit.RegistryCache); None: the site's build_cache.
    build_cache: str | None = None


class Reporter(Protocol):
    """The display: a live table on a terminal, plain lines in CI. Called from worker threads."""

    def state(self, flavour: Target, text: str) -> None: ...

    def finished(self, result: FlavourResult) -> None: ...

    def notice(self, text: str) -> None: ...


# --- the base image ---------------------------------------------------------------------------------------

class BaseResolver:
    """Which image a python's flavours build FROM; decided once per python per run (thread-safe)."""

    def __init__(self) -> None:
        self._chosen: dict[str, str] = {}
        self._lock = threading.Lock()

    def resolve(self, flavour: Target) -> str:
        with self._lock:
            if flavour.python not in self._chosen:
                self._chosen[flavour.python] = choose_base(flavour.python, flavour.base_image)
            return self._chosen[flavour.python]


def choose_base(python: str, site_base: str) -> str:
    """The site's base if it is here or can be pulled, else the bootstrapped one, else a Failure saying how."""
    if engine.images.image_inspect(site_base) is not None:
        return site_base
    try:
        engine.transfer.pull_image(site_base, None)
        return site_base
    except Failure as error:
        pull_error = error.message
    bootstrapped = bases.find_base(python)
    if bootstrapped is not None:
        return bootstrapped.ref
    reason = bases.unbuildable_reason(python)
    hint = (f"run `./build.py base --python {python}` to bootstrap one from Debian packages, or set site.yaml "
            f"`bases` to an image you can pull" if reason is None else reason)
    raise Failure(f"no base image for python {python}: {site_base} is not here and cannot be pulled "
                  f"({pull_error}), and there is no bootstrapped {bases.base_ref(python)}", rule="base-image",
                  hint=hint)


# --- one run of `build` -------------------------------------------------------------------------------------

def build_flavours(plan: Plan, flavours: list[Target], options: BuildOptions,
                   reporter: Reporter) -> list[FlavourResult]:
    """Build `flavours` (`options.jobs` at a time); return a result per flavour, in order.

    A KeyboardInterrupt (Ctrl-C, or SIGTERM turned into one by the CLI) aborts the builds in flight, waits
    for them to stop, cleans up, and propagates.
    """
    if options.ca_bundle is not None:
        plan = with_ca_bundle(plan, options.ca_bundle)
    # One run per flavour at a time: a second waits, then finds the first's image up to date (run/building/build_mutex.py).
    with build_mutex.exclusive([flavour.tag for flavour in flavours], waiting=reporter.notice):
        return _Run(plan, options, reporter).execute(flavours)


def with_ca_bundle(plan: Plan, ca_bundle: Path) -> Plan:
    """The plan with `--ca-bundle FILE` in place of the site's setting (it is not part of any flavour id)."""
    return dataclasses.replace(plan, site=dataclasses.replace(plan.site, ca_bundle_setting=str(ca_bundle.resolve())))


@dataclass
class _Run:
    plan: Plan
    options: BuildOptions
    reporter: Reporter
    results: dict[str, FlavourResult] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    interrupted: threading.Event = field(default_factory=threading.Event)
    bases: BaseResolver = field(default_factory=BaseResolver)
    active: dict[str, engine.classic.StreamingBuild | engine.buildkit.BuildKitBuild] = field(default_factory=dict)
    traces: list[engine.builds.BuildTrace] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    base_stage_locks: dict[tuple[str, str], threading.Lock] = field(default_factory=dict)
    base_stages_built: set[tuple[str, str]] = field(default_factory=set)
    # Images still to build per cache group: the build cache is pruned when a group's count reaches 0.
    group_left: dict[tuple[str, str], int] = field(default_factory=dict)
    buildkit: bool = True
    export: Compression | None = None

    def execute(self, flavours: list[Target]) -> list[FlavourResult]:
        engine.connection.client()  # fail early, with the hint, when no engine answers
        self.buildkit = engine.buildkit.use_buildkit(self.options.builder)
        if engine.connection.image_store() == "containerd":
            # Layers stored as they will be pushed: the push sends these blobs, nothing is compressed again.
            self.export = self.plan.site.compression
        todo: queue.Queue[Target] = queue.Queue()
        for flavour in flavours:
            self.results[flavour.tag] = FlavourResult(flavour, log=self._log_path(flavour))
            if self._up_to_date(flavour):
                continue
            todo.put(flavour)
            self._expect(flavour)
        workers = Workers(lambda: self._work(todo), max(1, min(self.options.jobs, todo.qsize())), name="build")
        try:
            workers.start()
            workers.wait()
        except KeyboardInterrupt:
            self._abort(workers)
            raise
        finally:
            self._clean_up()
        return [self.results[flavour.tag] for flavour in flavours]

    def _up_to_date(self, flavour: Target) -> bool:
        if self.options.force:
            return False
        image_id = built_image_id(flavour)
        if image_id is None:
            return False
        if not self._stored_as_exported(flavour, image_id):
            return False
        _tag_aliases(flavour, image_id)
        result = self.results[flavour.tag]
        result.outcome, result.image_id = Outcome.SKIPPED, image_id
        result.size_bytes = _image_size(image_id)
        result.message = f"{local_ref(flavour.tag)} already has flavour id {flavour.id[7:19]} (--force rebuilds)"
        self.reporter.finished(result)
        return True

    def _stored_as_exported(self, flavour: Target, image_id: str) -> bool:
        """False, saying so, when the containerd store holds the image's layers in another compression than the
        site's (pulled from a gzip registry, or built with another setting): the push would send them as they
        are and fail `push-compression`, so the flavour is built again, its layers exported as the site says."""
        if self.export is None:  # the classic store keeps layers uncompressed: the push compresses them
            return True
        stored = engine.stored.layer_media_types(image_id)
        wanted = LAYER_MEDIA_TYPES[self.export.format]
        other = sorted({media_type for media_type in stored or () if media_type not in wanted})
        if not other:
            return True
        self.reporter.notice(f"{local_ref(flavour.tag)} has flavour id {flavour.id[7:19]} but its layers are "
                             f"stored as {', '.join(other)}, not the site's {self.export.describe()}: building "
                             f"it again, its layers exported as {self.export.format}")
        return False

    def _work(self, todo: queue.Queue[Target]) -> None:
        while not self.stop.is_set():
            try:
                flavour = todo.get_nowait()
            except queue.Empty:
                return
            try:
                result = self._build_one(flavour)
            except Failure as error:  # build.log could not be written (a full disk): a failed flavour
                result = self.results[flavour.tag]
                result.outcome, result.message = Outcome.FAILED, error.message
            except Exception as error:  # a bug, not a build failure: record it, keep the run consistent
                result = self.results[flavour.tag]
                result.outcome, result.message = Outcome.FAILED, f"internal error: {type(error).__name__}: {error}"
                self.stop.set()
                raise
            finally:
                self.reporter.finished(self.results[flavour.tag])
            if result.outcome is Outcome.FAILED and not self.options.keep_going:
                self.stop.set()  # let builds in flight finish; start no new one

    def _build_one(self, flavour: Target) -> FlavourResult:
        result = self.results[flavour.tag]
        started = time.monotonic()
        log_path = self._log_path(flavour)
        with diskio.LogFile(log_path, "the build log") as log:  # a full disk: a Failure naming the log
            def say(text: str) -> None:
                log.write(text + "\n")  # the whole output goes to the log; the reporter shows the steps

            try:
                result.image_id = self._build_and_tag(flavour, result, say)
                result.outcome = Outcome.BUILT
                result.size_bytes = _image_size(result.image_id)
            except engine.builds.BuildAborted:
                result.outcome, result.message = Outcome.INTERRUPTED, "interrupted; nothing was tagged"
            except Failure as error:
                result.outcome, result.message = Outcome.FAILED, error.message
                say(f"FAILED: {error.render()}")
            result.seconds = time.monotonic() - started
            say(f"{result.outcome.value} in {result.seconds:.1f} s")
            group_done = self._last_of_group(flavour)
            if group_done and self.options.prune_cache and result.outcome is not Outcome.INTERRUPTED:
                say(f"build cache pruned: {engine.builds.prune_build_cache() / 1e9:.2f} GB reclaimed")
        return result

    def _expect(self, flavour: Target) -> None:
        """Count one more image of its cache group to build in this run."""
        self.group_left[cache_group(flavour)] = self.group_left.get(cache_group(flavour), 0) + 1

    def _last_of_group(self, flavour: Target) -> bool:
        """Count this image done; True when no image of its cache group is left to build in this run."""
        with self.lock:
            group = cache_group(flavour)
            self.group_left[group] = self.group_left.get(group, 1) - 1
            return self.group_left[group] <= 0

    def _build_and_tag(self, flavour: Target, result: FlavourResult, say) -> str:
        self.reporter.state(flavour, "preparing")
        locks.require_fresh(self.plan, flavour)
        base = self.bases.resolve(flavour)
        result.base_image = base
        say(f"flavour {flavour.tag} id {flavour.id}")
        say(f"base image: {base}")
        with tempfile.TemporaryDirectory(prefix=f"xla-images-context-{flavour.tag}-") as scratch:
            context = Path(scratch) / "context"
            try:
                context.mkdir()
                notes = write_context(self.plan, flavour, context, self.options.wheelhouse)
            except OSError as error:  # a full TMPDIR: the partial context goes with the temp dir
                raise diskio.failure(error, scratch, "the build context") from None
            for note in notes:
                say(note)
            args = {"BASE_IMAGE": base, "FLAVOUR_ID": flavour.id,
                    "SOURCE_DATE_EPOCH": str(SOURCE_DATE_EPOCH)}
            if self.buildkit:
                say(f"builder: BuildKit (docker buildx {engine.buildkit.buildx_info().version})"
                    + (f", {self.export.describe()} layers into the containerd image store" if self.export else ""))
                build = engine.buildkit.BuildKitBuild(context, args, target=flavour.variant.stage,
                                                      secrets=context_secrets(context),
                                                      no_cache=self.options.no_cache, export=self.export,
                                                      cache=self._registry_cache(flavour))
            elif flavour.is_devel:
                raise Failure(f"{flavour.tag} needs BuildKit: its devel stage mounts the pip settings as a secret, "
                              "which the classic builder would copy into a layer", rule="devel-buildkit",
                              hint="install docker buildx (the docker-buildx plugin) on this host")
            else:
                say("builder: classic (no docker buildx here); secrets are copied into the wheels stage only")
                prepare_classic_context(context)
                self._build_base_stage(flavour, base, context / DOCKERFILE, say)
                build = engine.classic.StreamingBuild(context, args, target=flavour.variant.stage,
                                                      no_cache=self.options.no_cache)
            self.reporter.state(flavour, "building")
            image_id = self._run(flavour, build, say)
        if self.buildkit and self.export is not None:  # what the skip check asks of this image next time
            layers = len(engine.images.image_layers(image_id))
            engine.stored.remember(image_id, [engine.buildkit.exported_layer_media_type(self.export)] * layers)
        with self.lock:
            if self.interrupted.is_set():
                raise engine.builds.BuildAborted()  # finished as the interrupt came: clean-up removes it untagged
            _tag(flavour, image_id)
        say(f"image {image_id}")
        say(f"tagged {', '.join(local_ref(name) for name in flavour.tags)} -> {image_id[7:19]}")
        return image_id

    def _registry_cache(self, flavour: Target) -> engine.buildkit.RegistryCache | None:
        repository = self.options.build_cache or self.plan.site.build_cache
        return None if not repository else engine.buildkit.registry_cache(repository, flavour.tag, [
            other.tag for other in self.plan.every_image
            if (other.torch_xla, other.python) == (flavour.torch_xla, flavour.python)])

    def _build_base_stage(self, flavour: Target, base: str, dockerfile: Path, say) -> None:
        """Build the `base` stage once per python and base before any flavour of it goes on.

        Its layers are then in the cache for every flavour of that python, so they all share them. Without
        this, flavours of one python built at the same time (--jobs) would each make their own venv layer.
        """
        key = (flavour.python, base)
        with self.lock:
            stage_lock = self.base_stage_locks.setdefault(key, threading.Lock())
        with stage_lock:
            if key in self.base_stages_built:
                return
            say(f"base stage for python {flavour.python} (shared by its flavours):")
            with tempfile.TemporaryDirectory(prefix="xla-images-base-stage-") as scratch:
                # The base stage copies nothing from the context: the Dockerfile alone is enough.
                shutil.copyfile(dockerfile, Path(scratch) / DOCKERFILE)
                stage = engine.classic.StreamingBuild(Path(scratch), {"BASE_IMAGE": base, "SOURCE_DATE_EPOCH": str(
                    SOURCE_DATE_EPOCH)}, target=BASE_STAGE, no_cache=self.options.no_cache)
                self._run(flavour, stage, say)
            self.base_stages_built.add(key)

    def _run(self, flavour: Target, build: engine.classic.StreamingBuild | engine.buildkit.BuildKitBuild, say) -> str:
        with self.lock:
            if self.interrupted.is_set():
                raise engine.builds.BuildAborted()
            self.active[flavour.tag] = build
            self.traces.append(build.trace)
        try:
            return build.run(lambda line: self._on_build_line(flavour, line, say))
        finally:
            with self.lock:
                self.active.pop(flavour.tag, None)

    def _on_build_line(self, flavour: Target, line: str, say) -> None:
        say(line)
        step = engine.buildkit.buildkit_step(line)
        if step is not None or line.startswith("Step "):
            self.reporter.state(flavour, step or line)

    def _abort(self, workers: Workers) -> None:
        with self.lock:
            self.interrupted.set()
            self.stop.set()
            builds = list(self.active.values())
        self.reporter.notice(f"interrupted: stopping {len(builds)} build(s), tagging nothing, cleaning up")
        for build in builds:
            build.abort()
        workers.wait_through_interrupts()  # a second Ctrl-C still waits: each build removes its own context

    def _clean_up(self) -> None:
        keep = {result.image_id for result in self.results.values()
                if result.outcome in (Outcome.BUILT, Outcome.SKIPPED) and result.image_id}
        try:
            engine.builds.remove_build_leftovers(self.traces, keep)
        except KeyboardInterrupt:
            engine.builds.remove_build_leftovers(self.traces, keep)  # impatient twice: finish anyway

    def _log_path(self, flavour: Target) -> Path:
        reports = self.options.reports_dir or self.plan.root / REPORTS
        return reports / flavour.tag / BUILD_LOG


def _tag(flavour: Target, image_id: str) -> None:
    """Point the flavour's names at the new image; an image they leave with no name at all is removed
    (a rebuild must not pile up 8 GB orphans). One still used by a container stays."""
    replaced = set()
    for name in flavour.tags:
        attrs = engine.images.image_inspect(local_ref(name))
        if attrs is not None and attrs["Id"] != image_id:
            replaced.add(str(attrs["Id"]))
        engine.images.tag_image(image_id, LOCAL_REPOSITORY, name)
    for old in replaced:
        engine.images.remove_if_unnamed(old)


def _tag_aliases(flavour: Target, image_id: str) -> None:
    """An up-to-date image still gets aliases that moved to it (e.g. `latest` after a new release)."""
    for name in flavour.aliases:
        attrs = engine.images.image_inspect(local_ref(name))
        if attrs is None or attrs["Id"] != image_id:
            engine.images.tag_image(image_id, LOCAL_REPOSITORY, name)


def _image_size(image_id: str) -> int:
    attrs = engine.images.image_inspect(image_id) or {}
    return int(attrs.get("Size") or 0)
