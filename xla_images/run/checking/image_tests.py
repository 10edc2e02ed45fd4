"""`build.py test`: per flavour, the image checks, the smoke suite and the SBOM, against its built image.

For each flavour, in order: its image must be built (`xla-images:<tag>`); unless only the checks were asked
for, the smoke suite runs in a fresh container (run.checking.smoke_runner, reports/<tag>/smoke.json and smoke.xml) while
the checks' layer scan reads `docker save` beside it; the image checks run (run.checking.checks, reports/<tag>/checks.xml
and checks.json); then its SBOM is written (run.checking.sbom, reports/<tag>/sbom.cdx.json). A failure of one flavour
does not stop the others: the report says which failed and why, and the command line prints it.

Why the smoke suite comes first: the layer scan waits on the disk (`docker save`, about a minute for an 8 GB
image), the smoke suite on the CPU, so the one runs beside the other; the checks then take their scan's result.
Neither result gates the other, so the order changes no verdict.

Then, unless run as on a TPU VM or with --no-restricted, part of the smoke suite (smoke_runner.RESTRICTED_CHECKS)
runs again under the restricted profile (model.running: an arbitrary UID with GID 0, read-only root, tmpfs /tmp,
no capabilities, no-new-privileges, no network), reports/<tag>/smoke-restricted.json and .xml: how clusters and
CI runners run images. The image checks test the same profile on their own (image_checks/test_image.py).

A devel image (`<tag>_devel`) gets the checks and the SBOM, not the smoke suite: its runtime layers are the
runtime image's, smoke-tested there. Its own checks (image_checks/test_image.py) build examples/extension in it
with `pip wheel .` and run that wheel in the runtime image, which must be built too.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...errors import Failure
from ...generate.plan import Plan
from ...model.target import Target
from . import checks, sbom as sboms, smoke_runner
from .. import engine
from ..building.build import require_built

Say = Callable[[str], None]


@dataclass(frozen=True)
class ImageTestOptions:
    tpu: bool = False
    layers: int | None = None  # decoder layers of the smoke suite's compile check; None: the suite's own
    checks_only: bool = False
    keyword: str | None = None  # pytest -k over the image checks
    restricted: bool = True  # also run part of the smoke suite under the restricted profile (not with tpu)


@dataclass(frozen=True)
class FlavourTested:
    flavour: Target
    checked: checks.ChecksResult
    smoked: smoke_runner.SmokeResult | None
    sbom_error: str | None
    restricted: smoke_runner.SmokeResult | None = None

    @property
    def ok(self) -> bool:
        return (self.checked.ok and (self.smoked is None or self.smoked.ok) and self.sbom_error is None
                and (self.restricted is None or self.restricted.ok))

    def failures(self) -> list[str]:
        """One line per failed check or smoke case (the SBOM's failure is said on its own)."""
        restricted = [f"restricted profile: {line}" for line in self.restricted.failures()] if self.restricted else []
        return self.checked.failures() + (self.smoked.failures() if self.smoked else []) + restricted


def run_image_tests(plan: Plan, flavours: list[Target], options: ImageTestOptions, reports_root: Path, *,
                    say: Say, on_smoke_line: Say | None) -> list[FlavourTested]:
    """Check, smoke-test and describe (SBOM) each flavour's built image; progress lines go to `say`."""
    ca_bundle = plan.site.ca_bundle()
    results = []
    for flavour in flavours:
        image = require_built(flavour)
        report_dir = reports_root / flavour.tag
        smoked, scan = None, None
        try:
            # The layer scan waits on `docker save` (the disk): it runs beside the CPU-bound smoke suite, or beside
            # the checks before the one that reads it (a devel image's checks build the example extension first:
            # its scan took 90-123 s on its own in the whole-matrix run). With -k the checks may not scan the
            # layers at all: then they scan on demand, if they do.
            scan = None if options.keyword else checks.BackgroundLayerScan(
                engine.images.save_image_stream(image), ca_bundle)
            # A devel image's python, torch and torch_xla are its runtime image's layers, which the runtime's own
            # `test` runs the smoke suite on; the devel checks build and run the example extension instead.
            if not options.checks_only and not flavour.is_devel:
                say(f"== {flavour.tag}: smoke suite ({'TPU' if options.tpu else 'PJRT CPU'})"
                    + (", the layer scan beside it" if scan else ""))
                smoked = smoke_runner.run(flavour, image, report_dir, tpu=options.tpu,
                                          layers=[options.layers] if options.layers else None,
                                          on_line=on_smoke_line)
            say(f"== {flavour.tag}: image checks on {image}"
                + (", the layer scan beside them" if scan and smoked is None else ""))
            checked = checks.run(checks.CheckTarget(flavour, image, ca_bundle, options.tpu, layer_scan=scan),
                                 report_dir, keyword=options.keyword, quiet=True)
        finally:
            if scan is not None:
                scan.stop()  # already done unless the smoke suite or the checks were cut short
        restricted = None
        if options.restricted and not options.tpu and not options.checks_only and not flavour.is_devel:
            say(f"== {flavour.tag}: smoke suite ({', '.join(smoke_runner.RESTRICTED_CHECKS)}) under the restricted "
                "profile")
            restricted = smoke_runner.run_restricted(flavour, image, report_dir, on_line=on_smoke_line)
        sbom_error = None
        try:
            say(f"== {flavour.tag}: SBOM {sboms.write_report(plan, flavour, image, report_dir, say)}")
        except Failure as error:
            sbom_error = error.message
        results.append(FlavourTested(flavour, checked, smoked, sbom_error, restricted))
    return results
