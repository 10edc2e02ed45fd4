#!/usr/bin/env python3
"""A derived image's `pip install torchvision`, with the image's constraints and without (issue 33).

Runs pip inside a throwaway container of the image (as a `RUN pip install torchvision` in a Dockerfile FROM it
would), once as the image is (PIP_CONSTRAINT names /opt/xla-images/constraints.txt) and once opted out
(`PIP_CONSTRAINT=`, as docs/derived.md documents), side by side, each `--rounds` times:

* `--dry-run --report`: what pip would install (name, version) and how long resolving takes;
* the bytes it would download: the sum of each file's size as the index answers a HEAD for it (from this host,
  through the same CA);
* with `--install`: the real install in the container (timed; the container is removed afterwards).

The container reaches the index through this host's TLS-intercepting proxy: the host's CA bundle is mounted
read-only and named by PIP_CERT, nothing else of the host's pip configuration goes in.

Without an engine, `--python PATH` runs the same dry runs with a venv on this host that has the flavour's torch
and torch_xla (e.g. the project's .venv: torch 2.9.0 + torch_xla 2.9.0), under the committed
Dockerfiles/<--tag>/constraints.txt, with no pip config file (this host's own global constraint stays out).

Usage: benchmarks/bench_derived_pip.py [--image xla-images:r2.9.0_3.11_cpu | --python .venv/bin/python]
                                       [--tag r2.9.0_3.11_cpu] [--package torchvision] [--rounds 2] [--install]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parents[1]

CA = os.environ.get("SSL_CERT_FILE") or os.environ.get("PIP_CERT") or "/etc/ssl/certs/ca-certificates.crt"
FLAVOUR_PACKAGES = ("torch", "torch-xla", "torchvision", "torchaudio")


def pip_command(where: dict, package: str, constrained: bool, *pip_args: str) -> tuple[list[str], dict]:
    """The pip command and environment: in a fresh container of the image, or with a host venv's python."""
    if where.get("python"):
        environment = {key: value for key, value in os.environ.items() if not key.startswith(("PIP_", "UV_"))}
        environment.update(PIP_CONFIG_FILE=os.devnull, PIP_CERT=CA, PIP_DISABLE_PIP_VERSION_CHECK="1",
                           PIP_CONSTRAINT=str(where["constraints"]) if constrained else "")
        return [where["python"], "-m", "pip", "install", *pip_args, package], environment
    image = where["image"]
    command = ["docker", "run", "--rm", "-v", f"{CA}:/tmp/host-ca.crt:ro", "-e", "PIP_CERT=/tmp/host-ca.crt",
               "-e", "PIP_DISABLE_PIP_VERSION_CHECK=1", "-e", "PIP_ROOT_USER_ACTION=ignore"]
    if not constrained:
        command += ["-e", "PIP_CONSTRAINT=", "-e", "UV_CONSTRAINT="]
    return [*command, image, "python", "-m", "pip", "install", *pip_args, package], dict(os.environ)


def pip_in_image(where: dict, package: str, constrained: bool, *pip_args: str) -> tuple[float, str]:
    """(seconds, stdout) of `pip install ... package` where the derived image's pip would run."""
    command, environment = pip_command(where, package, constrained, *pip_args)
    started = time.monotonic()
    result = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=False, env=environment)
    seconds = time.monotonic() - started
    if result.returncode != 0:
        how = "constrained" if constrained else "opted out"
        sys.exit(f"pip in {where.get('python') or where['image']} failed ({how}):\n"
                 + "\n".join(result.stderr.strip().splitlines()[-8:]))
    return seconds, result.stdout


def download_bytes(items: list[dict]) -> int:
    """Sum of the sizes of the files pip would download, as the index answers a HEAD for each."""
    total = 0
    with requests.Session() as session:
        for item in items:
            url = item["download_info"]["url"]
            answer = session.head(url, allow_redirects=True, timeout=60, verify=CA)
            answer.raise_for_status()
            total += int(answer.headers.get("Content-Length", "0"))
    return total


def measure(where: dict, package: str, constrained: bool, rounds: int, install: bool) -> dict:
    seconds, report = [], None
    for _ in range(rounds):
        took, stdout = pip_in_image(where, package, constrained, "--dry-run", "--quiet", "--report", "-")
        seconds.append(took)
        report = json.loads(stdout)
    items = report["install"] if report else []
    chosen = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"] for item in items}
    figures = {"resolve_s": statistics.median(seconds), "resolve_all_s": seconds, "wheels": len(items),
               "bytes": download_bytes(items),
               "flavour_packages": {name: chosen[name] for name in FLAVOUR_PACKAGES if name in chosen}}
    if install and not where.get("python"):  # never installs into a host venv
        figures["install_s"], _ = pip_in_image(where, package, constrained, "--quiet", "--no-cache-dir")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="xla-images:r2.9.0_3.11_cpu")
    parser.add_argument("--python", help="a host venv's python instead of the image (dry runs only)")
    parser.add_argument("--tag", default="r2.9.0_3.11_cpu", help="with --python: whose constraints file")
    parser.add_argument("--package", default="torchvision")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--install", action="store_true", help="also install for real in a throwaway container")
    arguments = parser.parse_args()
    if arguments.rounds < 1:
        sys.exit("--rounds must be at least 1")
    where = {"image": arguments.image}
    if arguments.python:
        constraints = ROOT / "Dockerfiles" / arguments.tag / "constraints.txt"
        if not constraints.is_file():
            sys.exit(f"no constraints file {constraints}: is {arguments.tag} a flavour of matrix.yaml?")
        where = {"python": arguments.python, "constraints": constraints}
    shown = f"{arguments.python} with {arguments.tag}'s constraints" if arguments.python else arguments.image
    print(f"{shown}: `pip install {arguments.package}`, load average {os.getloadavg()[0]:.1f}")
    for constrained in (True, False):
        figures = measure(where, arguments.package, constrained, arguments.rounds, arguments.install)
        label = "with the image's constraints" if constrained else "opted out (PIP_CONSTRAINT=)"
        installs = ", ".join(f"{name} {version}" for name, version in figures["flavour_packages"].items())
        line = (f"{label:32} resolve {figures['resolve_s']:6.1f} s (median of {arguments.rounds}), "
                f"{figures['wheels']:3d} wheel(s), {figures['bytes'] / 1e6:9.1f} MB to download; installs {installs}")
        if "install_s" in figures:
            line += f"; install {figures['install_s']:.1f} s"
        print(line)


if __name__ == "__main__":
    main()
