"""run.pipeline.engines without engines: what names an engine, the environment each engine's `ship` gets, and
what the parent makes of a child that died before reporting (the real split: tests/engine/test_second_engine.py)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from golden import fixed_flavour_list
from xla_images.errors import ConfigError
from xla_images.run.pipeline import engines
from xla_images.run.pipeline.ledger import Result

BASE = {"PATH": "/usr/bin", "DOCKER_HOST": "unix:///var/run/docker.sock", "DOCKER_TLS_VERIFY": "1",
        "DOCKER_CERT_PATH": "/certs", "DOCKER_CONTEXT": "old"}


@pytest.mark.parametrize("text", ["", "tcp://", "http://host:2375", "-rm", "a b", "ssh://host name", "x" * 200,
                                  "ctx/../x", "ctx;rm"])
def test_what_is_not_an_engine_is_refused_with_the_rule(text: str) -> None:
    with pytest.raises(ConfigError) as refused:
        engines.EngineSpec.parse(text)
    assert refused.value.rule == "engine-spec"


def test_a_context_replaces_every_engine_variable() -> None:
    environment = engines.EngineSpec.parse("builder2").environment(BASE)
    assert environment == {"PATH": "/usr/bin", "DOCKER_CONTEXT": "builder2"}


def test_a_url_keeps_the_tls_variables_the_user_set_for_it() -> None:
    environment = engines.EngineSpec.parse("tcp://builder2.example:2376").environment(BASE)
    assert environment["DOCKER_HOST"] == "tcp://builder2.example:2376"
    assert environment["DOCKER_TLS_VERIFY"] == "1" and environment["DOCKER_CERT_PATH"] == "/certs"
    assert "DOCKER_CONTEXT" not in environment


def test_default_is_this_environment() -> None:
    assert engines.EngineSpec.parse("default").environment(BASE) == BASE


def test_the_same_engine_twice_is_refused(tmp_path: Path) -> None:
    command = engines.ChildCommand([], [])
    with pytest.raises(ConfigError, match="named twice"):
        engines.run_split(list(fixed_flavour_list())[:2], ("default", "default"), command, tmp_path / "p.json",
                          tmp_path, say=lambda line: None)


class _Exits(engines.ChildCommand):
    """A `ship` child that prints a line and exits 3 without a report (an engine that does not answer)."""

    def argv(self, tags: list[str], published: Path, reports: Path) -> list[str]:
        return [sys.executable, "-c", "print('error [engine-reachable]: no Docker engine answers'); raise SystemExit(3)"]


def test_an_engine_that_ends_without_a_report_fails_its_share_and_only_it(tmp_path: Path) -> None:
    flavours = list(fixed_flavour_list())
    lines: list[str] = []
    entries = engines.run_split(flavours, ("default", "other"), _Exits([], []), tmp_path / "published.json",
                                tmp_path, say=lines.append)
    assert sorted(entry.flavour.tag for entry in entries) == sorted(flavour.tag for flavour in flavours)
    assert {entry.result for entry in entries} == {Result.FAILED}
    assert all("exit 3" in entry.reason and "no Docker engine answers" in entry.reason for entry in entries)
    report = json.loads((tmp_path / "pipeline.json").read_text(encoding="utf-8"))
    assert [engine["exit_code"] for engine in report["engines"]] == [3, 3]
    assert any(line.startswith("[engine 1 (default)] error [engine-reachable]") for line in lines)
    assert not (tmp_path / "published.json").exists()
