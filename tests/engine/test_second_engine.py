"""A second engine, reached as a remote build host is: ci/second-engine.sh's dockerd over TCP with mutual TLS,
named by a docker context (DOCKER_CONTEXT) or by DOCKER_HOST / DOCKER_TLS_VERIFY / DOCKER_CERT_PATH, with the
`build.py` CLI run as a child process with that environment (as the pipeline runs one child per engine).

A tiny flavour (make_project's local wheels) is built on each engine independently and the image digests are equal;
then, with the second engine's build cache emptied, it is built there again with the registry cache the first
engine exported (`build_cache`), and BuildKit takes the wheels stage's steps from it (CACHED) with the same
digest, which the second engine then pushes to the shared registry. No secret (the CA bundle's marker, a file
of the secret mounts) is in the exported cache. The second engine is started if it is not running and then
stopped at the end (its build cache emptied first); one someone else started is left running.
"""
from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
import time
from pathlib import Path
from typing import Iterator

import requests

from registry_process import REPO, RegistryProcess, running
from second_engine_support import CONTEXT, copy_image, script, second_docker, \
    without_engine_variables
from xla_images import names
from xla_images.run import engine

SECRET_FILES = ("pip/pip.conf", "pip/ca.crt")  # where the wheels stage mounts its secrets (the Dockerfile)
CACHE_REPOSITORY = "xla-images-test-cache"
_STEP = re.compile(r"^#(?P<n>\d+) \[(?P<step>[^\]]+)\] (?P<what>.*)$")
_CACHED = re.compile(r"^#(?P<n>\d+) CACHED$")


def tls_environment() -> dict[str, str]:
    """`ci/second-engine.sh env`'s DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH."""
    printed = script("env", timeout=30)
    assert printed.returncode == 0, printed.stderr
    lines = dict(line.removeprefix("export ").split("=", 1) for line in printed.stdout.splitlines() if "=" in line)
    assert set(lines) == {"DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"}, printed.stdout
    return lines


def cli(project, engine_env: dict[str, str],  # type: ignore[no-untyped-def]
        *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """`build.py ARGS` as CI runs it, a child process whose environment names the engine (nothing else differs
    between the engines), and how long it took."""
    env = {**without_engine_variables(), "CI": "true", "PYTHONPATH": str(REPO), **engine_env}
    began = time.monotonic()
    result = subprocess.run(project.cli_command(*args), cwd=project.root, env=env, capture_output=True, text=True,
                            timeout=300)
    seconds = time.monotonic() - began
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, seconds


def cached_steps(log: str) -> list[str]:
    """The BuildKit steps a plain-progress log reports as CACHED, by name (`[wheels 3/8] RUN ...`)."""
    steps: dict[str, str] = {}
    cached: list[str] = []
    for line in log.splitlines():
        if found := _STEP.match(line.strip()):
            steps[found.group("n")] = f"[{found.group('step')}] {found.group('what')}"
        elif (found := _CACHED.match(line.strip())) and found.group("n") in steps:
            cached.append(steps[found.group("n")])
    return cached


def tar_members(data: bytes) -> list[tarfile.TarInfo]:
    """The entries of a layer tar (nothing for the cache's JSON config)."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as archive:
            return archive.getmembers()
    except tarfile.ReadError:
        return []


def second_image_id(ref: str) -> str | None:
    result = second_docker("image", "inspect", "--format", "{{.Id}}", ref, timeout=60)
    return result.stdout.strip() if result.returncode == 0 else None


def cache_blob_texts(registry: RegistryProcess, tag: str) -> Iterator[bytes]:
    """Every blob of the cache manifest (layers decompressed, the cache config as is), read over HTTP."""
    base = f"{registry.url}/v2/{CACHE_REPOSITORY}"
    index = requests.get(f"{base}/manifests/{tag}", timeout=30, headers={
        "Accept": "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json"})
    index.raise_for_status()
    document = index.json()
    descriptors = document.get("manifests") or [*document.get("layers", []), document.get("config", {})]
    assert descriptors, document
    for descriptor in descriptors:
        blob = requests.get(f"{base}/blobs/{descriptor['digest']}", timeout=60)
        blob.raise_for_status()
        kind = descriptor["mediaType"]
        if kind.endswith("zstd"):
            yield subprocess.run(["zstd", "-dc"], input=blob.content, capture_output=True, timeout=60,
                                 check=True).stdout
        elif kind.endswith("gzip"):
            yield subprocess.run(["gzip", "-dc"], input=blob.content, capture_output=True, timeout=60,
                                 check=True).stdout
        else:
            yield blob.content


def test_one_flavour_on_two_engines_same_digest_and_the_second_reuses_the_first_ones_cache(
        second_engine: dict[str, float | bool], make_project, test_base: str, tmp_path: Path) -> None:
    project = make_project("8.75.0")
    tag = project.flavour("8.75.0").tag
    ref = names.local_ref(tag)
    copy_image(test_base)
    figures: dict[str, float | bool | list[str]] = dict(second_engine)
    try:
        with running(tmp_path / "registry") as registry:
            cache = f"--set=build_cache={registry.host}/{CACHE_REPOSITORY}"
            # 1. The second engine by DOCKER_HOST + TLS, no registry cache: an independent build.
            result, figures["second_engine_build_seconds"] = cli(project, tls_environment(), "build", tag,
                                                                 "--set=build_cache=")
            independent = second_image_id(ref)
            # 2. The first engine (no engine variable: the local socket), exporting the registry cache.
            result, figures["first_engine_build_seconds"] = cli(project, {}, "build", tag, cache)
            first = project.image_id("8.75.0")
            assert independent is not None and first is not None
            assert independent == first, "two engines built the same flavour into different images"
            assert registry.digest(CACHE_REPOSITORY, tag) is not None, "no registry cache was exported"
            listed = []
            for text in cache_blob_texts(registry, tag):
                listed += [member.name for member in tar_members(text)]
                assert project.ca_marker.encode() not in text, "the CA bundle (a secret) is in the exported cache"
                for member in tar_members(text):  # the secret mounts' files, by name: at most an empty stub
                    assert not (member.name.endswith(SECRET_FILES) and member.size > 0), member.name
            assert any(name.endswith("install_wheels.py") for name in listed), listed[:50]  # the layers were read
            # 3. The second engine by its context, its own image and build cache gone: layers from the registry.
            assert second_docker("rmi", "--force", ref).returncode == 0
            pruned = second_docker("builder", "prune", "--all", "--force", timeout=120)
            assert pruned.returncode == 0, pruned.stderr
            result, figures["second_engine_cached_build_seconds"] = cli(project, {"DOCKER_CONTEXT": CONTEXT},
                                                                        "build", tag, cache)
            log = (project.root / "reports" / tag / "build.log").read_text(encoding="utf-8")  # buildx's own lines
            reused = cached_steps(log)
            figures["cached_steps"] = sorted(step.split("]")[0] + "]" for step in reused)
            assert "importing cache manifest from " + f"{registry.host}/{CACHE_REPOSITORY}:{tag}" in log
            assert any(step.startswith("[wheels") and "RUN" in step and "install_wheels.py" in step
                       for step in reused), log[-4000:]
            assert second_image_id(ref) == first
            figures["digests_equal"] = True
            # 4. The second engine pushes its image to the shared registry: the digest the first engine built.
            _, figures["second_engine_push_seconds"] = cli(project, {"DOCKER_CONTEXT": CONTEXT}, "push", tag,
                                                           "--registry", f"{registry.host}/xla-images-test")
            assert registry.digest("xla-images-test", tag) == first
    finally:
        for name in (ref, test_base):
            second_docker("rmi", "--force", name, timeout=60)
        print("second engine figures: " + json.dumps(figures, default=str))
