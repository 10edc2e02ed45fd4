"""A throw-away project (one cpu flavour of an unreal release) and tiny images for the publishing tests:
shared by test_publish_registry.py, test_faults_registry.py and test_registries_tls.py."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from registry_process import REPO
from xla_images import names
from xla_images.generate.plan import load_plan
from xla_images.model.compression import parse_compression
from xla_images.model.flavour import Flavour
from xla_images.run import engine
from xla_images.run import registry as registries

PASSWORD = "pw-" + os.urandom(12).hex()


@dataclass
class Project:
    """A throw-away matrix (one cpu flavour of an unreal release) with site settings."""

    root: Path
    flavour: Flavour

    def cli(self, *args: str, password: str | None = PASSWORD,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "CI": "true"}
        if password:
            env.update({registries.USER_ENV: "ci-bot", registries.PASSWORD_ENV: password})
        return subprocess.run([sys.executable, str(REPO / "build.py"), *args, "--matrix",
                               str(self.root / "matrix.yaml"), "--site", str(self.root / "site.yaml")],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)

    @property
    def published(self) -> Path:
        return self.root / "published.json"


def make_project(root: Path) -> Project:
    root.mkdir(parents=True, exist_ok=True)
    # A release number of our own per run: its local tags cannot collide with real flavours or other runs.
    version = f"9.{os.getpid() % 1000}.{int(time.time()) % 1000}"
    (root / "matrix.yaml").write_text(
        "schema: 1\n"
        "defaults:\n  pythons: [\"3.11\"]\n  accelerators: [cpu]\n  latest_python: \"3.11\"\n"
        f"releases:\n  \"{version}\":\n    torch: \"{version}\"\n    pytorch_git_rev: v{version}\n"
        f"    xla_git_rev: v{version}\n    python_support: \">=3.10\"\n", encoding="utf-8")
    (root / "site.yaml").write_text(
        "registry: 127.0.0.1:1/unused\nca_bundle: none\n"
        "wheel_sources:\n  - name: test\n    match: {torch_xla: \">=0\"}\n", encoding="utf-8")
    plan = load_plan(root / "matrix.yaml", root / "site.yaml")
    (flavour,) = plan.flavours
    return Project(root, flavour)


def build_image(context: Path, flavour: Flavour, megabytes: tuple[int, ...], compression: str = "zstd") -> str:
    """FROM scratch, one layer of random bytes per entry, labelled as built for `flavour`.

    On the containerd image store the layers are stored as `build` stores them there, in the compression the push
    will send (`compression`, the site's); the classic store keeps them uncompressed whatever the setting."""
    context.mkdir(parents=True, exist_ok=True)
    lines = ["FROM scratch"]
    for index, size in enumerate(megabytes):
        (context / f"blob{index}").write_bytes(os.urandom(size << 20))
        lines.append(f"COPY blob{index} /blob{index}")
    lines.append(f"LABEL {names.FLAVOUR_ID_LABEL}={flavour.id} io.xla-images.tag={flavour.tag}")
    (context / "Dockerfile").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if engine.connection.image_store() == "containerd":
        export = parse_compression({"format": compression}, "build_image")  # the site's default level
        image_id = engine.buildkit.BuildKitBuild(context, {}, export=export).run(lambda line: None)
        engine.images.tag_image(image_id, names.LOCAL_REPOSITORY, flavour.tag)
        return image_id
    return engine.classic.build_directory(context, names.local_ref(flavour.tag))


def forget_image(flavour: Flavour) -> None:
    """Remove the flavour's local image so that its next pull is cold. On the containerd store BuildKit's cache
    still holds the layer blobs its build exported, and a pull would find them there: the cache goes first, then
    the image (in this order the faults and mirror tests' pulls fetched every layer again)."""
    engine.builds.prune_build_cache()
    engine.images.remove_image(names.local_ref(flavour.tag), force=True)


def registry_named_images(host: str) -> list[str]:
    return [tag for image in engine.connection.api().images() for tag in image.get("RepoTags") or []
            if tag.startswith(host)]
