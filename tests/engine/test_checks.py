"""Image checks and the smoke runner on the real engine, with small images made for the purpose.

The images start from the bootstrapped `xla-images/base:3.11` (python, no compiler) and carry a stand-in
torch/torch_xla: python packages with the flavour's versions and ABI flag but no shared libraries. That is
enough to show each check passing where it should and failing where something was planted. The real
flavour image is checked end to end in test_e2e_real_flavour.py.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

from publish_support import make_project
from xla_images import names
from xla_images.model import lockfile, running
from xla_images.model.flavour import Flavour
from xla_images.run.checking import checks, smoke_runner
from xla_images.run import engine
from xla_images.run.building.check_tool import check_tool_bytes

REPO = Path(__file__).resolve().parents[2]
SITE_PACKAGES = "/opt/venv/lib/python3.11/site-packages"
FAKE_CA = b"-----BEGIN CERTIFICATE-----\nMIIBxla-images-test-proxy-ca\n-----END CERTIFICATE-----\n"
# conftest.py labels every image derived from test_base, and so every container of one, with this.
SESSION_LABEL = "io.xla-images.test-session"


@pytest.fixture(scope="module")
def flavour(tmp_path_factory: pytest.TempPathFactory) -> Flavour:
    return make_project(tmp_path_factory.mktemp("project")).flavour


def stand_in_packages(context: Path, flavour: Flavour) -> None:
    """torch and torch_xla as python-only packages reporting the flavour's versions and ABI."""
    packages = context / "site"
    for name, version, body in (
        ("torch", flavour.torch, f"__version__ = {flavour.torch!r}\nfrom . import _C\n"),
        ("torch_xla", flavour.torch_xla, f"__version__ = {flavour.torch_xla!r}\n"),
    ):
        (packages / name).mkdir(parents=True)
        (packages / name / "__init__.py").write_text(body)
        info = packages / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (packages / "torch" / "_C.py").write_text(
        f"_GLIBCXX_USE_CXX11_ABI = {bool(flavour.abi.glibcxx_use_cxx11_abi)}\n")


def derived_layer(context: Path, flavour: Flavour) -> dict[str, str]:
    """The image's constraints file and `xla-images-check` in the context, as a build writes them; the labels
    that name the file."""
    constraints = lockfile.format_constraints(flavour, "")
    (context / names.CONSTRAINTS_NAME).write_text(constraints)
    (context / names.CHECK_TOOL).write_bytes(check_tool_bytes())
    return {names.CONSTRAINTS_LABEL: names.IMAGE_CONSTRAINTS,
            names.CONSTRAINTS_SHA256_LABEL: lockfile.constraints_digest(constraints)}


# What the template gives every image (docs/running.md): the user xla (1000:0) and its group-0 writable home,
# no setuid/setgid bit, HOME and the caches under that home.
# The user database comes as a file (users/etc/...), as the template's does: a RUN that names it would put a word
# the metadata check rightly flags into the history.
IMAGE_USER_LINES = [
    "COPY users/ /",
    f'RUN mkdir -p {running.HOME_ENV["HOME"]} && chown 0:{running.IMAGE_GID} '
    f'{running.HOME_ENV["HOME"]} && chmod 0775 {running.HOME_ENV["HOME"]} && '
    "find / -xdev -type f -perm /6000 -exec chmod ug-s {} +",
    "ENV " + " ".join(f"{key}={value}" for key, value in running.HOME_ENV.items()),
]


def users_file(test_base: str, scratch: Path) -> bytes:
    """The base's user database with the image's user added."""
    copy = engine.containers.extract_from_image(test_base, "/etc/passwd", scratch)
    line = f"{running.IMAGE_USER}:x:{running.IMAGE_UID}:{running.IMAGE_GID}::{running.HOME_ENV['HOME']}:/bin/sh\n"
    return copy.read_bytes() + line.encode()
# The image checks that run torch_xla on the XLA device as each user: the stand-in torch computes nothing.
RUNS_AS = {"test_runs_as[uid-gid0]", "test_runs_as[uid-own-group]", "test_runs_as[image-user]",
           "test_runs_as[restricted]"}


def dockerfile(flavour: Flavour, test_base: str, extra: list[str], derived_labels: dict[str, str]) -> str:
    env = " ".join(f"{key}={json.dumps(value)}" for key, value in flavour.env.items())
    labels = {**flavour.labels, **derived_labels, names.FLAVOUR_ID_LABEL: flavour.id}
    label_text = " ".join(f"{json.dumps(key)}={json.dumps(value)}" for key, value in labels.items())
    return "\n".join([
        f"FROM {test_base}",
        # pip, as the wheels stage bootstraps it: `xla-images-check` runs `pip check`.
        "RUN python3.11 -m venv --without-pip /opt/venv && /opt/venv/bin/python -m ensurepip --default-pip",
        "ENV PATH=/opt/venv/bin:$PATH",
        f"COPY site/ {SITE_PACKAGES}/",
        f"COPY {names.CONSTRAINTS_NAME} {names.IMAGE_CONSTRAINTS}",
        f"COPY {names.CHECK_TOOL} {names.IMAGE_CHECK_TOOL}",
        f"RUN chmod 0755 {names.IMAGE_CHECK_TOOL}",
        *IMAGE_USER_LINES,
        *extra,
        f"ENV {env}",
        f"LABEL {label_text}",
    ]) + "\n"


def build_checked_image(tmp_path: Path, name: str, flavour: Flavour, test_base: str, extra: list[str],
          files: dict[str, bytes] | None = None) -> Iterator[str]:
    context = tmp_path / name
    context.mkdir()
    stand_in_packages(context, flavour)
    files = {**(files or {}), "users/etc/passwd": users_file(test_base, tmp_path / f"{name}-base")}
    for relative, data in files.items():
        (context / relative).parent.mkdir(parents=True, exist_ok=True)
        (context / relative).write_bytes(data)
    (context / "Dockerfile").write_text(dockerfile(flavour, test_base, extra, derived_layer(context, flavour)))
    ref = f"xla-images-test/checks-{name}:{os.getpid()}"
    engine.classic.build_directory(context, ref)
    try:
        yield ref
    finally:
        engine.images.remove_image(ref, force=True)


@pytest.fixture(scope="module")
def clean_image(tmp_path_factory: pytest.TempPathFactory, flavour: Flavour, test_base: str) -> Iterator[str]:
    yield from build_checked_image(tmp_path_factory.mktemp("clean"), "clean", flavour, test_base,
                     ["COPY xla_smoke/ " + SITE_PACKAGES + "/xla_smoke/"],
                     {f"xla_smoke/{p.relative_to(REPO / 'smoke' / 'xla_smoke')}": p.read_bytes()
                      for p in (REPO / "smoke" / "xla_smoke").rglob("*.py")})


@pytest.fixture(scope="module")
def planted_image(tmp_path_factory: pytest.TempPathFactory, flavour: Flavour, test_base: str) -> Iterator[str]:
    extra = [
        "COPY renamed.pem /usr/share/misc/renamed.pem",
        "COPY pip.conf /etc/pip.conf",
        "COPY config.json /root/.docker/config.json",
        "COPY gcc /usr/local/bin/gcc",
        "RUN chmod +x /usr/local/bin/gcc && chmod u+s /usr/local/bin/gcc && mkdir -m 0777 /opt/open && "
        "touch /tmp/left-behind",
        'LABEL ci.token="abc"',
    ]
    files = {"renamed.pem": FAKE_CA, "pip.conf": b"[global]\nindex-url = https://bob:hunter2@index.example/simple\n",
             "config.json": b'{"auths": {}}', "gcc": b"#!/bin/sh\necho gcc\n"}
    yield from build_checked_image(tmp_path_factory.mktemp("planted"), "planted", flavour, test_base, extra, files)


def running_here(session_id: str) -> list[str]:
    ours = {"label": f"{SESSION_LABEL}={session_id}"}
    return [item["Id"] for item in engine.connection.api().containers(all=True, filters=ours)]


def statuses(result: checks.ChecksResult) -> dict[str, str]:
    return {outcome.name: outcome.status for outcome in result.outcomes}


def test_clean_image_passes_all_but_the_abi_check(tmp_path: Path, flavour: Flavour, clean_image: str,
        no_leaked_containers: Callable[[], None]) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(FAKE_CA)

    result = checks.run(checks.CheckTarget(flavour, clean_image, ca), tmp_path / "reports")

    found = statuses(result)
    failed = {name for name, status in found.items() if status not in ("passed", "skipped")}
    # The stand-in torch has no shared libraries, which the ABI check (rightly) cannot accept, and computes nothing.
    assert failed == {"test_abi_compatible", *RUNS_AS}, result.failures()
    # ... each a python that ran as its user and failed on the stand-in (not a container that could not start).
    assert all("(exit 1)" in outcome.message for outcome in result.outcomes if outcome.name in RUNS_AS), [
        outcome.message for outcome in result.outcomes if outcome.name in RUNS_AS]
    # A release flavour has no night to compare; a runtime image has no devel toolchain to check.
    assert {name for name, status in found.items() if status == "skipped"} == {
        "test_nightly_is_the_claimed_night", "test_devel_toolchain", "test_devel_keeps_runtime_layers",
        "test_devel_extension_runs_in_runtime"}
    assert "no torch found" in dict((o.name, o.message) for o in result.outcomes)["test_abi_compatible"] or \
        "could not run" in dict((o.name, o.message) for o in result.outcomes)["test_abi_compatible"]
    # The derived-image checks pass: the constraints match their label, `xla-images-check` (text, --json) exits 0.
    assert found["test_constraints_are_the_rendered_ones"] == "passed"
    assert found["test_xla_images_check_passes[text]"] == found["test_xla_images_check_passes[json]"] == "passed"
    # The image as users run it: its user, no setuid file, nothing world-writable, nothing left in /tmp or HOME.
    assert {found[name] for name in ("test_image_user", "test_no_setuid_or_setgid_files",
                                     "test_nothing_world_writable", "test_no_stray_files_in_tmp_or_home")} == {"passed"}
    assert len(found) == 32
    written = json.loads((tmp_path / "reports" / "checks.json").read_text())
    assert written["summary"]["passed"] == 23 and written["summary"]["failed"] == 5
    assert written["summary"]["skipped"] == 4
    assert "<testsuite" in (tmp_path / "reports" / "checks.xml").read_text()
    no_leaked_containers()


def test_planted_problems_are_each_caught(tmp_path: Path, flavour: Flavour, planted_image: str,
        no_leaked_containers: Callable[[], None]) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(FAKE_CA)

    result = checks.run(checks.CheckTarget(flavour, planted_image, ca), tmp_path / "reports",
                        keyword="not test_abi_compatible and not test_runs_as")

    found = statuses(result)
    assert {name for name, status in found.items() if status == "failed"} == {
        "test_no_site_ca_bundle_in_layers", "test_no_build_pip_config", "test_no_credentials_in_layers",
        "test_no_credentials_in_metadata", "test_no_compiler", "test_no_setuid_or_setgid_files",
        "test_nothing_world_writable", "test_no_stray_files_in_tmp_or_home"}
    messages = {outcome.name: outcome.message for outcome in result.outcomes}
    assert "/usr/local/bin/gcc" in messages["test_no_setuid_or_setgid_files"]
    assert "/opt/open" in messages["test_nothing_world_writable"]
    assert "left-behind" in messages["test_no_stray_files_in_tmp_or_home"]
    assert "usr/share/misc/renamed.pem" in messages["test_no_site_ca_bundle_in_layers"]
    assert "etc/pip.conf" in messages["test_no_build_pip_config"]
    assert "root/.docker/config.json" in messages["test_no_credentials_in_layers"]
    assert "/usr/local/bin/gcc" in messages["test_no_compiler"]
    assert "hunter2" not in json.dumps(written := json.loads((tmp_path / "reports" / "checks.json").read_text()))
    assert written["exit_code"] == 1
    no_leaked_containers()


def test_checks_of_another_flavour_fail_on_identity(tmp_path: Path, flavour: Flavour, clean_image: str,
        no_leaked_containers: Callable[[], None]) -> None:
    import dataclasses

    other = dataclasses.replace(flavour, torch="9.9.99", id="sha256:" + "0" * 64)

    result = checks.run(checks.CheckTarget(other, clean_image, None), tmp_path / "reports",
                        keyword="built or labels or package_version or ca_bundle")

    found = statuses(result)
    assert found["test_built_for_this_flavour"] == "failed"
    assert found["test_labels"] == "failed"
    assert found["test_package_version[torch]"] == "failed"
    assert found["test_package_version[torch_xla]"] == "passed"
    assert found["test_no_site_ca_bundle_in_layers"] == "skipped"


def test_smoke_runner_collects_reports_and_removes_the_container(tmp_path: Path, flavour: Flavour,
                                                                 clean_image: str,
        no_leaked_containers: Callable[[], None]) -> None:
    stale = tmp_path / "smoke.json"
    stale.write_text('{"stale": true}')

    result = smoke_runner.run(flavour, clean_image, tmp_path, only=["environment"])

    # The stand-in torch_xla cannot run the suite's environment probe: a failed run, with its reports.
    assert result.report is not None and result.report["suite"] == "xla_smoke"
    assert json.loads((tmp_path / "smoke.json").read_text()) == result.report
    assert (tmp_path / "smoke.xml").read_text().startswith("<?xml")
    assert not result.ok and result.exit_code == 1
    assert result.failures()
    no_leaked_containers()


def test_smoke_runner_without_the_suite_reports_no_report(tmp_path: Path, flavour: Flavour,
                                                          planted_image: str,
        no_leaked_containers: Callable[[], None]) -> None:
    result = smoke_runner.run(flavour, planted_image, tmp_path)  # python, but no xla_smoke in it
    assert result.report is None and not result.ok
    assert "exit code" in result.failures()[0]
    assert not (tmp_path / "smoke.json").exists()
    no_leaked_containers()


def test_ctrl_c_during_the_smoke_suite_removes_the_container(tmp_path: Path, flavour: Flavour,
                                                             clean_image: str, session_id: str,
        no_leaked_containers: Callable[[], None]) -> None:
    def interrupt(line: str) -> None:
        assert running_here(session_id), "the container should exist while it prints"
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        smoke_runner.run(flavour, clean_image, tmp_path, only=["environment"], on_line=interrupt)
    no_leaked_containers()
