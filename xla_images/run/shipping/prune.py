"""Retention: delete old nightly images over the registry API, then collect the garbage of a registry we run.

What may go: the **dated nightly tags** (`nightly_<py>_<accel>[_<abi>]_<YYYYMMDD>[_devel]`), per series (the same tag
without the date). In each series the `--keep N` newest always stay; of the rest, those older than
`--older-than DAYS` (by the date in the tag, against today in UTC) go. Nothing else is ever a candidate:
release tags, moving `nightly_*` tags and aliases stay.

A candidate is deleted as a manifest (`DELETE /v2/<repo>/manifests/<digest>`, which removes every tag naming it),
so a digest is spared when any tag that is not a candidate still names it, when published.json records it (a
push or a promoted copy), or when a `--protect FILE` names it (digests downstream CI resolved).

Then, where the registry is ours (the docker-registry `ci/registry.sh` runs for this port: its config and live
pid file under $XLA_IMAGES_STATE/registry/<port>/), `docker-registry garbage-collect --delete-untagged CONFIG`
runs with the registry stopped (distribution's collector is stop-the-world: an upload during a collection may
lose layers), and the registry is started again whatever happened. A protected manifest no tag names would be
deleted by `--delete-untagged`, so first it gets a tag of its own (`protected-<digest prefix>`). Blobs are
counted on disk before and after, which gives the bytes freed.
"""
from __future__ import annotations

import datetime
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import yaml

from ... import resources, settings, userfiles
from ...errors import ConfigError, Failure, Location
from ...model.flavour import Variant
from ...model.registry import Registry, is_loopback
from ...names import REGISTRY_CONFIG, REGISTRY_PID_FILE, REGISTRY_STATE_DIR, STATE_ENV
from ...model.published import read_published
from ..registry import RegistryClient

# A devel image's dated tag carries the variant after the date (`nightly_3.11_cpu_20261203_devel`): its series is
# the devel one (`nightly_3.11_cpu_devel`), kept and pruned like the runtime's.
DEVEL_SUFFIX = Variant.DEVEL.tag_suffix
DATED_NIGHTLY = re.compile(r"^(?P<series>nightly_.+)_(?P<date>\d{8})(?P<variant>" + re.escape(DEVEL_SUFFIX) + ")?$")
PROTECT_TAG_PREFIX = "protected-"
DIGEST_IN_TEXT = re.compile(r"(?:^|@)(sha256:[0-9a-f]{64})$")
# cosign keeps an image's signature, attestations and attached SBOM under tags named after its digest.
COSIGN_SUFFIXES = (".sig", ".att", ".sbom")
# Bounds of the options: a century of nightlies; beyond it `today - days` leaves the calendar (OverflowError).
MAX_AGE_DAYS = 36_500
MAX_KEEP = 100_000
Progress = Callable[[str], None]


# --- what is protected -----------------------------------------------------------------------------------

def parse_protect(path: Path) -> set[str]:
    """Digests a --protect file names: one `sha256:<hex>` or `HOST/REPO@sha256:<hex>` per line, `#` comments.

    A published.json (from this or another checkout) is accepted too: every digest it records is protected.
    """
    text = userfiles.read_text(path, limit=userfiles.PROTECT_LIMIT,
                               missing_hint="name a file of digests, one per line")
    if text.lstrip().startswith("{"):
        return {digest for entry in read_published(path).values() for digest in entry.digests}
    digests = set()
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = DIGEST_IN_TEXT.search(line)
        if not match or " " in line:
            raise ConfigError(f"not a digest or digest reference: {line!r}", location=Location(str(path), number),
                              rule="protect-format",
                              hint="one sha256:<64 hex> or HOST/REPO@sha256:<64 hex> per line; # starts a comment")
        digests.add(match.group(1))
    return digests


def protected_digests(published_path: Path | None, protect_files: Iterable[Path]) -> dict[str, str]:
    """digest -> why it is protected."""
    why: dict[str, str] = {}
    for path in protect_files:
        for digest in parse_protect(path):
            why.setdefault(digest, f"named in {path}")
    # read_published reads a missing file as none; a fifo, directory or dangling link is an error, never skipped
    # (its digests would lose their protection without a word).
    if published_path is not None:
        for entry in read_published(published_path).values():
            for digest in entry.digests:
                why[digest] = f"recorded in {published_path.name} ({entry.tag})"
    return why


# --- the decision (pure) ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Decision:
    tag: str
    digest: str
    delete: bool
    reason: str


@dataclass
class PrunePlan:
    decisions: list[Decision] = field(default_factory=list)

    @property
    def doomed_digests(self) -> list[str]:
        return sorted({decision.digest for decision in self.decisions if decision.delete})

    @property
    def deleted_tags(self) -> list[str]:
        return sorted(decision.tag for decision in self.decisions if decision.delete)


def dated_nightly(tag: str) -> tuple[str, datetime.date] | None:
    """`nightly_3.11_cpu_20261203` -> (`nightly_3.11_cpu`, 2026-12-03), `nightly_3.11_cpu_20261203_devel` ->
    (`nightly_3.11_cpu_devel`, 2026-12-03); None for any other tag."""
    match = DATED_NIGHTLY.match(tag)
    if not match:
        return None
    try:
        series = match.group("series") + (match.group("variant") or "")
        return series, datetime.datetime.strptime(match.group("date"), "%Y%m%d").date()
    except ValueError:
        return None  # `nightly_x_20261399` is not a date: not ours to judge


def plan_prune(tags: dict[str, str], keep: int, older_than_days: int, protected: dict[str, str],
               today: datetime.date) -> PrunePlan:
    """Decide, for every dated nightly tag in `tags` (tag -> digest), whether its manifest goes."""
    if not 0 <= keep <= MAX_KEEP or not 0 <= older_than_days <= MAX_AGE_DAYS:
        raise ConfigError(f"--keep must lie in 0..{MAX_KEEP} and --older-than in 0..{MAX_AGE_DAYS} days",
                          location="--older-than", rule="prune-options")
    cutoff = today - datetime.timedelta(days=older_than_days)
    series: dict[str, list[tuple[datetime.date, str]]] = {}
    for tag in tags:
        parsed = dated_nightly(tag)
        if parsed is not None:
            series.setdefault(parsed[0], []).append((parsed[1], tag))
    candidates: dict[str, str] = {}
    plan = PrunePlan()
    for name in sorted(series):
        for index, (date, tag) in enumerate(sorted(series[name], reverse=True)):
            if index < keep:
                plan.decisions.append(Decision(tag, tags[tag], False, f"one of the {keep} newest of {name}"))
            elif date >= cutoff:
                plan.decisions.append(Decision(tag, tags[tag], False, f"not older than {older_than_days} days"))
            else:
                candidates[tag] = tags[tag]
    still_named = {digest: tag for tag, digest in tags.items() if tag not in candidates}
    for tag, digest in sorted(candidates.items()):
        if digest in protected:
            plan.decisions.append(Decision(tag, digest, False, f"protected: {protected[digest]}"))
        elif digest in still_named:
            plan.decisions.append(Decision(tag, digest, False, f"the same image is also tagged {still_named[digest]}"))
        else:
            plan.decisions.append(Decision(tag, digest, True, f"beyond the {keep} newest and older than "
                                                              f"{older_than_days} days"))
    return plan


def cosign_companions(digest: str, tags: dict[str, str]) -> dict[str, str]:
    """The tags cosign derives from `digest` (`sha256-<hex>.sig`, …) that exist in `tags`: they describe that
    image alone, so they go with it; they are never candidates or keepers on their own."""
    stem = digest.replace(":", "-", 1)
    return {stem + suffix: tags[stem + suffix] for suffix in COSIGN_SUFFIXES if stem + suffix in tags}


# --- the registry ----------------------------------------------------------------------------------------

def pin_untagged(client: RegistryClient, digests: Iterable[str], tagged: set[str], dry_run: bool,
                 progress: Progress) -> list[str]:
    """Give each protected manifest no tag names a `protected-<hex>` tag, so `--delete-untagged` keeps it."""
    pinned = []
    for digest in sorted(set(digests) - tagged):
        fetched = client.manifest_bytes(digest)
        if fetched is None:
            continue  # not in this repository
        tag = PROTECT_TAG_PREFIX + digest.removeprefix("sha256:")[:16]
        progress(f"{'would tag' if dry_run else 'tagging'} untagged protected {digest} as {tag}")
        if not dry_run:
            raw, media_type, _ = fetched
            response = client.request("PUT", f"/v2/{client.registry.repository}/manifests/{tag}", data=raw,
                                      headers={"Content-Type": media_type})
            client.raise_for(response, f"PUT manifest {tag}")
        pinned.append(tag)
    return pinned


@dataclass(frozen=True)
class LocalRegistry:
    """A docker-registry this machine runs through ci/registry.sh."""

    port: int
    state: Path
    config: Path
    data: Path

    @property
    def blobs(self) -> Path:
        return self.data / "docker" / "registry" / "v2" / "blobs"


def local_registry(registry: Registry, state: Path | None = None) -> LocalRegistry | None:
    """Ours when it is on loopback and ci/registry.sh started it: its config and a live pid file exist."""
    host, _, port = registry.host.rpartition(":")
    if not is_loopback(registry.host) or not port.isdigit():
        return None
    state = state or settings.read_state_dir()
    directory = state / REGISTRY_STATE_DIR / port
    config, pid_file = directory / REGISTRY_CONFIG, directory / REGISTRY_PID_FILE
    if not config.is_file() or not pid_file.is_file() or not _alive(pid_file):
        return None
    try:
        root = yaml.safe_load(config.read_text(encoding="utf-8"))["storage"]["filesystem"]["rootdirectory"]
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None
    return LocalRegistry(int(port), state, config, Path(root))


def _alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text().strip()), 0)
        return True
    except (ValueError, OSError):
        return False


@dataclass(frozen=True)
class BlobCount:
    blobs: int
    bytes: int


def count_blobs(local: LocalRegistry) -> BlobCount:
    count = size = 0
    if local.blobs.is_dir():
        for data in local.blobs.glob("sha256/*/*/data"):
            count += 1
            size += data.stat().st_size
    return BlobCount(count, size)


@dataclass(frozen=True)
class Collected:
    before: BlobCount
    after: BlobCount

    @property
    def freed(self) -> int:
        return self.before.bytes - self.after.bytes

    def to_json(self) -> dict[str, int]:
        return {"blobs_before": self.before.blobs, "blobs_after": self.after.blobs,
                "bytes_before": self.before.bytes, "bytes_after": self.after.bytes, "bytes_freed": self.freed}


def garbage_collect(local: LocalRegistry, progress: Progress, runner: Callable[..., subprocess.CompletedProcess]
                    = subprocess.run) -> Collected:
    """Stop the registry, `garbage-collect --delete-untagged`, start it again (also when collection fails)."""
    before = count_blobs(local)
    env = settings.child_environment({"PORT": str(local.port), STATE_ENV: str(local.state)})
    _script(runner, "stop", env)
    try:
        progress(f"docker-registry garbage-collect --delete-untagged {local.config}")
        result = runner(["docker-registry", "garbage-collect", "--delete-untagged", str(local.config)],
                        capture_output=True, text=True, check=False)
        if result.returncode != 0:
            tail = "\n  ".join((result.stderr or result.stdout).strip().splitlines()[-10:])
            raise Failure(f"garbage-collect failed (exit {result.returncode}):\n  {tail}", rule="prune-gc",
                          hint="the manifests were deleted; run the collection again once the cause is fixed")
    finally:
        _script(runner, "start", env)
    return Collected(before, count_blobs(local))


def _script(runner: Callable[..., subprocess.CompletedProcess], command: str, env: dict[str, str]) -> None:
    result = runner(["bash", str(resources.registry_script()), command], capture_output=True, text=True, check=False, env=env)
    if result.returncode != 0:
        raise Failure(f"ci/registry.sh {command} failed: {(result.stderr or result.stdout).strip()[-500:]}",
                      rule="prune-gc")


# --- the command -----------------------------------------------------------------------------------------

@dataclass
class PruneReport:
    plan: PrunePlan
    deleted: list[str] = field(default_factory=list)  # digests
    deleted_companions: list[str] = field(default_factory=list)  # cosign tags of deleted digests
    pinned: list[str] = field(default_factory=list)  # protect tags added
    collected: Collected | None = None
    gc_skipped: str = ""

    def to_json(self) -> dict[str, object]:
        return {"decisions": [vars(d) for d in self.plan.decisions], "deleted_digests": self.deleted,
                "deleted_tags": self.plan.deleted_tags,
                "deleted_cosign_tags": self.deleted_companions, "pinned": self.pinned,
                "gc": self.collected.to_json() if self.collected else None, "gc_skipped": self.gc_skipped}


def prune(client: RegistryClient, *, keep: int, older_than_days: int, protected: dict[str, str],
          dry_run: bool = False, collect: bool = True, state: Path | None = None,
          today: datetime.date | None = None, progress: Progress = lambda line: None) -> PruneReport:
    client.check_reachable()
    tags = client.tag_digests()
    today = today or datetime.datetime.now(datetime.timezone.utc).date()
    report = PruneReport(plan_prune(tags, keep, older_than_days, protected, today))
    for digest in report.plan.doomed_digests:
        names = [d.tag for d in report.plan.decisions if d.digest == digest]
        progress(f"{'would delete' if dry_run else 'deleting'} {digest} ({', '.join(names)})")
        if not dry_run:
            client.delete_manifest(digest)
            report.deleted.append(digest)
        for tag, companion in cosign_companions(digest, tags).items():
            progress(f"{'would delete' if dry_run else 'deleting'} {companion} ({tag}, cosign's for {digest})")
            if not dry_run:
                client.delete_manifest(companion)
                report.deleted_companions.append(tag)
    local = local_registry(client.registry, state) if collect else None
    if not collect:
        report.gc_skipped = "--no-gc"
    elif local is None:
        report.gc_skipped = (f"{client.registry.host} is not a registry this machine runs with ci/registry.sh; "
                             "run its garbage collection where it runs")
    elif dry_run:
        report.gc_skipped = "--dry-run"
    gone = set(report.plan.deleted_tags) | set(report.deleted_companions)
    remaining = {tag: digest for tag, digest in tags.items() if tag not in gone}
    if local is not None:
        report.pinned = pin_untagged(client, protected, set(remaining.values()), dry_run, progress)
    if local is not None and not dry_run and collect:
        report.collected = garbage_collect(local, progress)
        client.check_reachable()
    return report

