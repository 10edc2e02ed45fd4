"""SBOMs and cosign signatures on the real engine and a registry of our own (ci/registry.sh, ports 5080-5089).

The images are conftest's tiny flavours: the bootstrapped Debian base (a real dpkg status) plus a venv with
locally built torch/torch_xla wheels installed from a hash-pinned lock by the real Dockerfile. Keys are made
by `cosign generate-key-pair`; signing is offline (no transparency log).
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
import requests

from registry_process import REPO, RegistryProcess, running
from reporters import QuietReporter
from xla_images import names
from xla_images.model import lockfile
from xla_images.run.building import build
from xla_images.run import engine
from xla_images.run.checking import sbom
from xla_images.run.building.build import BuildOptions, Outcome

PORTS = range(5080, 5090)  # this suite's share of 127.0.0.1
REPOSITORY = "xla-images-signing"
KEY_PASSWORD = "key-pw-" + os.urandom(8).hex()
SIGNED, UNSIGNED = "8.113.0", "8.114.0"


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> Iterator[RegistryProcess]:
    with running(tmp_path_factory.mktemp("signing-registry"), PORTS) as process:
        yield process


def target(registry: RegistryProcess) -> str:
    return f"{registry.host}/{REPOSITORY}"


def copy_manifest(registry: RegistryProcess, source_tag: str, target_tag: str) -> None:
    """What a forger can do without the key: reuse a valid signature manifest under another digest's tag."""
    kind = "application/vnd.oci.image.manifest.v1+json"
    url = f"{registry.url}/v2/{REPOSITORY}/manifests/"
    body = requests.get(url + source_tag, headers={"Accept": kind}, timeout=10)
    body.raise_for_status()
    requests.put(url + target_tag, data=body.content, headers={"Content-Type": kind}, timeout=10).raise_for_status()


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    """Two cosign key pairs: `ours` signs, `other` is someone else's."""
    made = {}
    for name in ("ours", "other"):
        directory = tmp_path_factory.mktemp(f"keys-{name}")
        subprocess.run(["cosign", "generate-key-pair"], cwd=directory, check=True, capture_output=True,
                       env={**os.environ, "COSIGN_PASSWORD": KEY_PASSWORD}, stdin=subprocess.DEVNULL, timeout=60)
        made[name], made[f"{name}.pub"] = directory / "cosign.key", directory / "cosign.pub"
    return made


@pytest.fixture(scope="module")
def project(make_project, registry: RegistryProcess):
    """Two flavours built from the real Dockerfile and pushed to our registry; the local images go at the end."""
    created = make_project(SIGNED, UNSIGNED)
    plan = created.plan()
    results = build.build_flavours(plan, list(plan.flavours), BuildOptions(jobs=2), QuietReporter())
    assert [result.outcome for result in results] == [Outcome.BUILT] * 2, [result.message for result in results]
    pushed = created.cli("push", "--registry", target(registry))
    assert pushed.returncode == 0, pushed.stderr
    yield created
    for flavour in plan.flavours:
        for tag in flavour.tags:
            engine.images.remove_tag(names.local_ref(tag))
    for entry in json.loads((created.root / "published.json").read_text())["flavours"].values():
        engine.images.remove_image(entry["ref"], force=True)


def published(project) -> dict[str, dict]:
    return json.loads((project.root / "published.json").read_text())["flavours"]


def signing_env() -> dict[str, str]:
    return {**os.environ, "CI": "true", "PYTHONPATH": str(REPO), "COSIGN_PASSWORD": KEY_PASSWORD}


def cli(project, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(project.cli_command(*args), cwd=project.root, env=env or signing_env(),
                          capture_output=True, text=True, timeout=600)


def in_container(image: str, *command: str) -> str:
    run = engine.containers.run_container(image, list(command), role="sbom-test", timeout=120)
    assert run.exit_code == 0, run.output
    return run.output


# --- SBOM ----------------------------------------------------------------------------------------------------

def test_sbom_of_a_real_image_lists_its_dpkg_packages_venv_and_locked_hashes(project, tmp_path: Path,
                                                                            no_leaked_containers) -> None:
    flavour = project.flavour(SIGNED)
    out = tmp_path / "sbom.cdx.json"

    result = cli(project, "sbom", flavour.tag, "-o", str(out))

    assert result.returncode == 0, result.stderr
    text = out.read_text()
    sbom.validate(text)
    document = json.loads(text)
    components = document["components"]
    image = names.local_ref(flavour.tag)
    # Independently of the SBOM's own reading: what dpkg and pip inside the image say.
    debs = set(in_container(image, "dpkg-query", "-W", "-f=${Package}\\n").split())
    dists = {item["name"].lower().replace("_", "-") for item in
             json.loads(in_container(image, "/opt/venv/bin/python", "-m", "pip", "list", "--format", "json"))}
    assert {c["name"] for c in components if c["purl"].startswith("pkg:deb/debian/")} == debs
    assert {"libc6", "python3.11-minimal"} <= debs
    pypi = {c["purl"].split("@")[0].removeprefix("pkg:pypi/"): c for c in components
            if c["purl"].startswith("pkg:pypi/")}
    assert set(pypi) == dists and {"torch", "torch-xla", "pip"} <= dists
    lock = lockfile.read_lock(project.plan().lock_path(flavour)).by_name()
    assert pypi["torch-xla"]["hashes"] == [{"alg": "SHA-256", "content": lock["torch-xla"].sha256}]
    assert pypi["torch"]["version"] == SIGNED and "hashes" not in pypi["pip"]
    root = document["metadata"]["component"]
    assert root["version"] == engine.images.image_inspect(image)["Id"]
    assert "warning" not in result.stderr  # every locked wheel is installed at its locked version


def test_build_test_writes_the_sbom_report(project) -> None:
    flavour = project.flavour(SIGNED)
    report = project.root / "reports" / flavour.tag / sbom.SBOM_NAME
    report.unlink(missing_ok=True)

    result = cli(project, "test", flavour.tag, "--checks-only", "-k", "labels or environment")

    assert result.returncode == 0, result.stdout + result.stderr
    sbom.validate(report.read_text())
    assert len(json.loads(report.read_text())["components"]) > 50  # ~100 Debian packages + the venv


# --- signatures ----------------------------------------------------------------------------------------------

def test_sign_then_resolve_and_pull_verify_and_the_sbom_attestation_verifies(project, keys, registry,
                                                                             tmp_path: Path) -> None:
    flavour = project.flavour(SIGNED)
    entry = published(project)[flavour.tag]

    signed = cli(project, "sign", flavour.tag, "--key", str(keys["ours"]))

    assert signed.returncode == 0, signed.stderr
    assert signed.stdout.strip() == f"{flavour.tag}\t{entry['ref']}\tsigned + sbom attested"
    for text in (signed.stdout, signed.stderr, (project.root / "published.json").read_text()):
        assert KEY_PASSWORD not in text and "PRIVATE KEY" not in text
    resolved = cli(project, "resolve", "--torch-xla", SIGNED, "--verify", "--key", str(keys["ours.pub"]))
    assert resolved.returncode == 0, resolved.stderr
    assert resolved.stdout.strip() == entry["ref"]

    verified = cli(project, "verify", flavour.tag, "--key", str(keys["ours.pub"]), "--sbom-dir", str(tmp_path))
    assert verified.returncode == 0, verified.stderr
    assert "signature ok\tsbom ok (" in verified.stdout
    attested = json.loads((tmp_path / f"{flavour.tag}.cdx.json").read_text())
    sbom.validate(json.dumps(attested))
    assert attested["metadata"]["component"]["version"] == entry["digest"]
    assert attested["metadata"]["component"]["purl"].startswith(f"pkg:oci/{REPOSITORY}@{entry['digest']}")
    assert attested == json.loads((project.root / "reports" / flavour.tag / sbom.SBOM_NAME).read_text())
    # And cosign itself, as a downstream user would run it.
    raw = subprocess.run(["cosign", "verify-attestation", "--key", str(keys["ours.pub"]), "--type", "cyclonedx",
                          "--insecure-ignore-tlog=true", "--allow-http-registry=true", entry["ref"]],
                         capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert raw.returncode == 0, raw.stderr

    engine.images.remove_image(entry["ref"], force=True)  # so the pull has to fetch it
    engine.images.remove_tag(names.local_ref(flavour.tag))
    pulled = cli(project, "pull", "--torch-xla", SIGNED, "--verify", "--key", str(keys["ours.pub"]))
    assert pulled.returncode == 0, pulled.stderr
    assert engine.images.image_inspect(entry["ref"]) is not None


def test_another_key_is_refused(project, keys) -> None:
    ref = published(project)[project.flavour(SIGNED).tag]["ref"]
    _ensure_signed(project, keys)

    result = cli(project, "resolve", "--torch-xla", SIGNED, "--verify", "--key", str(keys["other.pub"]))

    assert result.returncode == 1 and result.stdout == ""
    assert f"refusing {ref}: no signature by this key" in result.stderr and "Traceback" not in result.stderr


def test_unsigned_image_is_refused_and_never_pulled(project, keys) -> None:
    flavour = project.flavour(UNSIGNED)
    ref = published(project)[flavour.tag]["ref"]
    engine.images.remove_image(ref, force=True)
    for tag in flavour.tags:
        engine.images.remove_tag(names.local_ref(tag))
    assert engine.images.image_inspect(ref) is None

    for command in ("resolve", "pull"):
        result = cli(project, command, "--torch-xla", UNSIGNED, "--verify", "--key", str(keys["ours.pub"]))
        assert result.returncode == 1 and result.stdout == "", result.stderr
        assert f"refusing {ref}: it is not signed" in result.stderr
    assert engine.images.image_inspect(ref) is None
    # Without --verify nothing changes for those who do not ask.
    assert cli(project, "resolve", "--torch-xla", UNSIGNED).returncode == 0


def test_a_different_image_behind_the_tag_is_refused(project, keys, registry, tmp_path: Path) -> None:
    flavour = project.flavour(SIGNED)
    signed_ref = published(project)[flavour.tag]["ref"]
    _ensure_signed(project, keys)
    pub = str(keys["ours.pub"])
    # Someone re-pushes another image under the signed flavour's tag.
    (tmp_path / "payload").write_bytes(os.urandom(1024))
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY payload /payload\n")
    image_id = engine.classic.build_directory(tmp_path, f"{target(registry)}:{flavour.tag}")
    try:
        engine.transfer.push_image(target(registry), flavour.tag, None)
    finally:
        engine.images.remove_image(image_id, force=True)
    tampered = registry.digest(REPOSITORY, flavour.tag)
    assert tampered is not None, f"{flavour.tag} is not in the registry"
    assert f"{target(registry)}@{tampered}" != signed_ref

    from_tags = cli(project, "resolve", "--registry", target(registry), "--torch-xla", SIGNED, "--verify",
                    "--key", pub)
    assert from_tags.returncode == 1 and from_tags.stdout == ""
    assert f"refusing {target(registry)}@{tampered}: it is not signed" in from_tags.stderr

    # A forger copies the valid signature to the new digest: the signature names the old digest, refused.
    copy_manifest(registry, f"sha256-{signed_ref.rpartition(':')[2]}.sig",
                  f"sha256-{tampered.removeprefix('sha256:')}.sig")
    copied = cli(project, "pull", "--registry", target(registry), "--torch-xla", SIGNED, "--verify", "--key", pub)
    assert copied.returncode == 1 and "signature was made for another digest" in copied.stderr
    assert engine.images.image_inspect(f"{target(registry)}@{tampered}") is None

    # published.json still names the signed digest, which pulling by digest gets, whatever the tag says...
    recorded = cli(project, "resolve", "--torch-xla", SIGNED, "--verify", "--key", pub)
    assert recorded.returncode == 0 and recorded.stdout.strip() == signed_ref
    # ...and a published.json edited to point at the other digest is refused.
    path = project.root / "published.json"
    original = path.read_text()
    try:
        path.write_text(original.replace(signed_ref.rpartition("@")[2], tampered))
        edited = cli(project, "resolve", "--torch-xla", SIGNED, "--verify", "--key", pub)
        assert edited.returncode == 1 and "refusing" in edited.stderr and edited.stdout == ""
    finally:
        path.write_text(original)


def _ensure_signed(project, keys) -> None:
    """Tests may run alone: sign without the SBOM when the signing test did not run first."""
    flavour = project.flavour(SIGNED)
    result = cli(project, "sign", flavour.tag, "--key", str(keys["ours"]), "--no-sbom")
    assert result.returncode == 0, result.stderr
