"""One run split across several Docker engines: each engine gets whole release+python groups (order.shard) and
runs `ship` on its share in a child process whose environment names that engine the way docker's own tools
read it (DOCKER_CONTEXT for a context, DOCKER_HOST for a URL), so the engine client, buildx and every
subprocess reach the same engine. All push to the one registry; each child records its pushes in its own
published.json part and writes its own pipeline.json; the parent merges both, so `resolve` finds every image.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ... import diskio, settings, userfiles
from ...errors import ConfigError
from ...model.published import read_published
from ...model.target import Target
from ..shipping import publish
from .ledger import Entry, Phase, Result, Say
from .order import shard
from .ship import REPORT_NAME

ENGINE_ENVIRONMENT = ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")
URL_SCHEMES = ("unix", "tcp", "ssh", "npipe")
CONTEXT_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.+-]{0,127}")
STOP_GRACE_SECONDS = 120
REPORT_LIMIT = 16 * 1024 * 1024


@dataclass(frozen=True)
class EngineSpec:
    """`default` (this environment's engine), a docker context name, or a DOCKER_HOST URL."""

    text: str

    @classmethod
    def parse(cls, text: str) -> EngineSpec:
        scheme, separator, rest = text.partition("://")
        if separator:
            if scheme not in URL_SCHEMES or not rest or any(char.isspace() for char in text):
                raise ConfigError(f"--engine {text!r} is not an engine URL", rule="engine-spec",
                                  hint=f"a DOCKER_HOST URL ({', '.join(s + '://' for s in URL_SCHEMES)}...), a docker "
                                       "context name, or `default`")
        elif not CONTEXT_NAME.fullmatch(text):
            raise ConfigError(f"--engine {text!r} is neither a docker context name nor a URL", rule="engine-spec",
                              hint="`docker context ls` lists the contexts; or give a DOCKER_HOST URL")
        return cls(text)

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """`base` with this engine named in it. A URL keeps the TLS variables the user set for it."""
        if self.text == "default":
            return dict(base)
        if "://" in self.text:
            environment = {key: value for key, value in base.items() if key not in ("DOCKER_HOST", "DOCKER_CONTEXT")}
            environment["DOCKER_HOST"] = self.text
            return environment
        environment = {key: value for key, value in base.items() if key not in ENGINE_ENVIRONMENT}
        environment["DOCKER_CONTEXT"] = self.text
        return environment


@dataclass(frozen=True)
class ChildCommand:
    """How each engine's `ship` is started: the parent's plan options and its pass-through options."""

    plan_args: list[str]
    pass_through: list[str]

    def argv(self, tags: list[str], published: Path, reports: Path) -> list[str]:
        return [sys.executable, "-m", "xla_images", "ship", *self.plan_args, *self.pass_through,
                "--published", str(published), "--reports", str(reports), *tags]


@dataclass
class _Child:
    spec: EngineSpec
    label: str
    share: list[Target]
    reports: Path
    published: Path
    process: subprocess.Popen[str] | None = None
    reader: threading.Thread | None = None
    last_line: str = ""
    seconds: float = 0.0


def run_split(flavours: list[Target], specs: tuple[str, ...], command: ChildCommand, published: Path,
              reports: Path, say: Say, environment: Mapping[str, str] | None = None) -> list[Entry]:
    """Run each engine's share at the same time; merge their records; the entries of every image, in order."""
    parsed = [EngineSpec.parse(text) for text in specs]
    if len({spec.text for spec in parsed}) != len(parsed):
        raise ConfigError("the same --engine is named twice", rule="engine-spec",
                          hint="name each engine once; its share is whole release+python groups")
    children = []
    for index, (spec, share) in enumerate(zip(parsed, shard(flavours, len(parsed))), 1):
        if share:
            where = reports / "engines" / f"{index}"
            children.append(_Child(spec, f"engine {index} ({spec.text})", share, where, where / "published.json"))
    base = dict(settings.child_environment() if environment is None else environment)
    for child in children:
        say(f"ship: {child.label}: {len(child.share)} image(s): {' '.join(f.tag for f in child.share)}")
    _run_children(children, command, base, say)
    entries = [entry for child in children for entry in _child_entries(child)]
    _merge_published(children, published, say)
    _write_report(children, entries, reports / REPORT_NAME)
    order = {flavour.tag: index for index, flavour in enumerate(flavours)}
    return sorted(entries, key=lambda entry: order.get(entry.flavour.tag, 0))


def _run_children(children: list[_Child], command: ChildCommand, base: dict[str, str], say: Say) -> None:
    started = time.monotonic()
    try:
        for child in children:
            diskio.make_directory(child.reports)
            child.process = subprocess.Popen(
                command.argv([flavour.tag for flavour in child.share], child.published, child.reports),
                env=child.spec.environment(base), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
            child.reader = threading.Thread(target=_relay, args=(child, say), daemon=True)
            child.reader.start()
        for child in children:
            _wait(child)
            child.seconds = time.monotonic() - started
    except KeyboardInterrupt:
        say(f"ship: interrupted: stopping {len(children)} engine run(s) (each cleans up like a Ctrl-C)")
        _stop_all(children)
        raise


def _relay(child: _Child, say: Say) -> None:
    assert child.process is not None and child.process.stdout is not None
    for line in child.process.stdout:
        line = line.rstrip("\n")
        child.last_line = line or child.last_line
        say(f"[{child.label}] {line}")


def _wait(child: _Child) -> None:
    assert child.process is not None
    while child.process.poll() is None:
        time.sleep(0.2)
    if child.reader is not None:
        child.reader.join(timeout=10)


def _stop_all(children: list[_Child]) -> None:
    running = [child.process for child in children if child.process and child.process.poll() is None]
    for process in running:
        try:
            os.killpg(process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for process in running:
        while process.poll() is None and time.monotonic() < deadline:
            try:
                process.wait(timeout=0.5)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):
                continue
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


def _child_entries(child: _Child) -> list[Entry]:
    """The child's pipeline.json as entries; an engine that ended without one fails its whole share."""
    by_tag = {flavour.tag: flavour for flavour in child.share}
    report = _read_report(child.reports / REPORT_NAME)
    code = child.process.returncode if child.process else None
    if report is None:
        why = f"{child.label} ended (exit {code}) before writing its report: {child.last_line or 'no output'}"
        return [Entry(flavour, index, Result.FAILED, why) for index, flavour in enumerate(child.share, 1)]
    entries = []
    for index, item in enumerate(report.get("flavours") or [], 1):
        flavour = by_tag.get(str(item.get("tag")))
        if flavour is None:
            continue
        entry = Entry(flavour, index, _result(item.get("result")), str(item.get("reason") or ""),
                      str(item.get("fix") or ""), str(item.get("digest") or ""))
        for name, phase in (item.get("phases") or {}).items():
            entry.phases[str(name)] = Phase(float(phase.get("seconds") or 0), int(phase.get("bytes") or 0),
                                            bool(phase.get("ok")), str(phase.get("message") or ""),
                                            float(phase.get("start") or 0))
        entries.append(entry)
    missing = [flavour for flavour in child.share if flavour.tag not in {e.flavour.tag for e in entries}]
    entries += [Entry(flavour, 0, Result.FAILED, f"{child.label} did not report it") for flavour in missing]
    return entries


def _read_report(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        document = json.loads(userfiles.read_text(path, limit=REPORT_LIMIT))
    except (ValueError, ConfigError):
        return None
    return document if isinstance(document, dict) else None


def _result(text: object) -> Result:
    try:
        return Result(text)
    except ValueError:
        return Result.FAILED


def _merge_published(children: list[_Child], published: Path, say: Say) -> None:
    """Each engine's verified pushes into the one published.json (a part only holds what its engine pushed)."""
    merged = []
    for child in children:
        merged += list(read_published(child.published).values())
    if merged:
        publish.record_published(published, merged)
        say(f"ship: {len(merged)} image(s) from {len(children)} engine(s) recorded in {published}")


def _write_report(children: list[_Child], entries: list[Entry], path: Path) -> None:
    document = {"schema": 1, "seconds": round(max((child.seconds for child in children), default=0.0), 1),
                "engines": [{"engine": child.spec.text, "tags": [flavour.tag for flavour in child.share],
                             "exit_code": child.process.returncode if child.process else None,
                             "seconds": round(child.seconds, 1), "reports": str(child.reports)}
                            for child in children],
                "counts": {result.value: sum(1 for entry in entries if entry.result is result) for result in Result},
                "bytes_built": sum(e.phases["build"].bytes for e in entries if "build" in e.phases),
                "bytes_pushed": sum(e.phases["push"].bytes for e in entries if "push" in e.phases),
                "flavours": [entry.to_json() for entry in entries]}
    diskio.write_text_atomic(path, json.dumps(document, indent=2) + "\n", "the pipeline report")
