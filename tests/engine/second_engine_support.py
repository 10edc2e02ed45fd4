"""The second engine of ci/second-engine.sh (a dockerd over TCP with mutual TLS, named by the docker context
`xla-images-second`), as the engine tests use it: started when absent and stopped again by the fixture in
conftest.py; the docker CLI against it; an image copied onto it from the first engine."""
from __future__ import annotations

import os
import subprocess
import time
from typing import Iterator

import pytest

from registry_process import REPO

SCRIPT = REPO / "ci" / "second-engine.sh"
ENGINE_VARIABLES = ("DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH")
CONTEXT = "xla-images-second"


def script(command: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), command], capture_output=True, text=True, timeout=timeout)


def running_second_engine() -> Iterator[dict[str, float | bool]]:
    """The second engine, running; stopped afterwards when this started it (its build cache emptied first)."""
    if os.geteuid() != 0:
        message = "the second engine (dockerd, /etc/hosts, a bridge) needs root"
        pytest.fail(message) if os.environ.get("CI", "").lower() in ("1", "true", "yes") else pytest.skip(message)
    started_here = script("status", timeout=60).returncode != 0
    began = time.monotonic()
    if started_here:
        result = script("start")
        assert result.returncode == 0, result.stdout + result.stderr
    facts: dict[str, float | bool] = {"start_seconds": time.monotonic() - began, "started_here": started_here}
    print(f"second engine: {'started in %.1f s' % facts['start_seconds'] if started_here else 'already running'}")
    try:
        yield facts
    finally:
        if started_here:  # what the test's builds left in the engine's cache goes too: it is ours
            second_docker("builder", "prune", "--all", "--force", timeout=120)
            stopped = script("stop")
            assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def second_docker(*args: str, stdin=None,  # type: ignore[no-untyped-def]
                  timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The docker CLI against the second engine, by its context."""
    return subprocess.run(["docker", "--context", CONTEXT, *args], capture_output=True, text=True, stdin=stdin,
                          timeout=timeout, env=without_engine_variables())


def without_engine_variables() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key not in ENGINE_VARIABLES}


def copy_image(ref: str) -> None:
    """`docker save` on the first engine into `docker load` on the second: the site's base, there too."""
    with subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE, env=without_engine_variables()) as saver:
        loaded = second_docker("load", stdin=saver.stdout, timeout=180)
        saver.stdout.close()
        assert saver.wait(timeout=60) == 0
    assert loaded.returncode == 0, loaded.stderr
