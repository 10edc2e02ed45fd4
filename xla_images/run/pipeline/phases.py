"""The pipeline's phases on a real engine and registry: build (run.building), test (run.checking), push
(run.shipping), and what frees an image or the build cache. Also what a run asks before it starts: which images
this machine cannot build at all (no base, no wheels), and whether the registry already holds an image."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

from ...errors import Failure, XlaImagesError
from ...generate.plan import Plan
from ...model import lockfile
from ...model.compression import Compression
from ...model.published import Published, read_published
from ...model.registry import Registry
from ...model.target import Target
from ...names import FLAVOUR_ID_LABEL, local_ref
from .. import engine
from ..building import base as bases, build as building
from ..checking import image_tests, nightly_check
from ..registry import RegistryClient, answers
from ..shipping import publish
from .ledger import Phase, Say
from .order import Blocked



@dataclass
class EnginePhases:
    """Build, test and push one image at a time per phase, on the engine DOCKER_HOST/DOCKER_CONTEXT names."""

    plan: Plan
    build_options: building.BuildOptions
    test_options: image_tests.ImageTestOptions
    registry: Registry
    client: RegistryClient
    published_path: Path
    reports_root: Path
    compression: Compression
    detail: Say  # the lines each phase says (its own logs hold the rest)
    _published_lock: threading.Lock = field(default_factory=threading.Lock)

    def held(self, flavour: Target) -> str | None:
        """The registry's digest when its tag (and every alias) is an image of exactly this flavour id; the entry
        goes into published.json if it is not there (a run that stopped between push and record)."""
        digest = self.client.manifest_digest(flavour.tag)
        if digest is None:
            return None
        labels = self._labels(digest)
        if labels.get(FLAVOUR_ID_LABEL) != flavour.id:
            return None
        if any(self.client.manifest_digest(alias) != digest for alias in flavour.aliases):
            return None
        with self._published_lock:
            recorded = read_published(self.published_path).get(flavour.tag)
            if recorded is None or recorded.digest != digest or recorded.registry != self.registry.name:
                publish.record_published(self.published_path, [Published(
                    flavour.tag, flavour.tags, self.registry.name, digest, labels, flavour.to_json(),
                    publish.now())])
        return digest

    def _labels(self, digest: str) -> dict[str, str]:
        manifest = self.client.manifest(digest)
        config = manifest.get("config")
        if not isinstance(config, dict):
            return {}  # an index, not an image this toolkit pushed
        labels = (self.client.blob_json(str(config.get("digest"))).get("config") or {}).get("Labels") or {}
        if not isinstance(labels, dict) or not all(isinstance(value, str) for value in labels.values()):
            raise answers.refuse(self.registry.host, "the image config", "`Labels` that are not strings")
        return dict(labels)

    def build(self, flavour: Target) -> Phase:
        results = building.build_flavours(self.plan, [flavour], self.build_options, _Quiet(self.detail))
        result = results[0]
        ok = result.outcome in (building.Outcome.BUILT, building.Outcome.SKIPPED)
        message = result.message if not ok else result.outcome.value
        return Phase(ok=ok, bytes=result.size_bytes, message=message)

    def test(self, flavour: Target) -> Phase:
        tested = image_tests.run_image_tests(self.plan, [flavour], self.test_options, self.reports_root,
                                             say=self.detail, on_smoke_line=None)[0]
        if tested.ok:
            return Phase(ok=True, message=f"reports in {self.reports_root / flavour.tag}")
        failures = tested.failures() + ([f"sbom: {tested.sbom_error}"] if tested.sbom_error else [])
        return Phase(ok=False, message="; ".join(failures[:3]) + (f" (+{len(failures) - 3})" if len(failures) > 3
                                                                  else ""))

    def push(self, flavour: Target) -> tuple[Phase, str]:
        nightly_check.verify_image(flavour, local_ref(flavour.tag))  # a stale nightly is refused before any push
        transfers: dict[str, publish.Transfer] = {}
        entry = publish.push_flavour(flavour, self.registry, self.client, self.client.credentials, self.detail,
                                     transfers, self.compression)
        with self._published_lock:
            publish.record_published(self.published_path, [entry])
        transfer = transfers.get(flavour.tag)
        uploaded = transfer.uploaded_bytes if transfer else 0
        return Phase(ok=True, bytes=uploaded, message=transfer.describe() if transfer else ""), entry.digest

    def free_image(self, flavour: Target) -> int:
        """Drop every local name of the image; it goes once unnamed (a container using it keeps it)."""
        attrs = engine.images.image_inspect(local_ref(flavour.tag))
        if attrs is None:
            return 0
        for name in flavour.tags:
            named = engine.images.image_inspect(local_ref(name))
            if named is not None and named["Id"] == attrs["Id"]:
                engine.images.remove_tag(local_ref(name))
        removed = engine.images.image_inspect(str(attrs["Id"])) is None or engine.images.remove_if_unnamed(
            str(attrs["Id"]))
        return int(attrs.get("Size") or 0) if removed else 0

    def free_cache(self) -> int:
        return engine.builds.prune_build_cache()


class _Quiet:
    """build_flavours' reporter inside the pipeline: the step and result lines go to the pipeline log (the
    ledger says each phase's result in one line; every build line is in reports/<tag>/build.log)."""

    def __init__(self, detail: Say) -> None:
        self.detail = detail

    def state(self, flavour: Target, text: str) -> None:
        self.detail(f"{flavour.tag}: {text}")

    def finished(self, result: building.FlavourResult) -> None:
        self.detail(f"{result.flavour.tag}: build {result.outcome.value} {result.message}".rstrip())

    def notice(self, text: str) -> None:
        self.detail(text)


# --- before the run: what this machine cannot build -------------------------------------------------------------

def blocked_by_wheels(plan: Plan, flavour: Target) -> Blocked | None:
    """No lock because no wheel source here has the flavour's wheels (2.6's C++11 ones, for example)."""
    status = lockfile.lock_status(plan, flavour)
    if status.state is not lockfile.LockState.UNAVAILABLE:
        return None
    return Blocked(flavour, status.detail,
                   "add a wheel source that has them to site.yaml `wheel_sources`, then `build.py lock "
                   f"{flavour.runtime_tag}`; or drop the flavour from matrix.yaml")


class BaseCheck:
    """Whether each python has a base to build FROM, bootstrapping the ones this machine can have (once each)."""

    def __init__(self, say: Say, bootstrap: bool = True) -> None:
        self.say, self.bootstrap = say, bootstrap
        self._answers: dict[str, tuple[str, str] | None] = {}

    def blocked(self, flavour: Target) -> Blocked | None:
        if flavour.python not in self._answers:
            self._answers[flavour.python] = self._check(flavour)
        answer = self._answers[flavour.python]
        return None if answer is None else Blocked(flavour, *answer)

    def _check(self, flavour: Target) -> tuple[str, str] | None:
        python = flavour.python
        if bases.find_base(python) is not None or engine.images.image_inspect(flavour.base_image) is not None:
            return None
        if bases.unbuildable_reason(python) is None and self.bootstrap:
            self.say(f"ship: bootstrapping the base for python {python} ({bases.base_ref(python)})")
            try:
                bases.ensure_base(python, say=self.say)
                return None
            except XlaImagesError as error:
                return f"the base for python {python} could not be bootstrapped: {error.message}", \
                    error.hint or f"`build.py base --python {python}`"
        try:
            building.choose_base(python, flavour.base_image)
            return None
        except Failure as error:
            return f"no base image for python {python}", error.hint or error.message
