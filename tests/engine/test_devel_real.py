"""Devel images and derived images on the real flavours, as a user builds them (issue #33's "done when").

On a TLS registry with htpasswd auth (registries_support), `build.py push` publishes r2.9.0_3.11_cpu and its devel
image and `build.py resolve` (with and without `--variant devel`) gives their digests. Then, FROM those digests,
through BuildKit (which pulls them from the TLS registry with the user's docker config):

* examples/extension, unchanged, builds in the devel image and its wheel runs in the runtime image (the example's
  own last step runs the op on the XLA device and `xla-images-check`); the same source built in
  r2.6.0_3.11_cpu_devel (pre-C++11) runs in r2.6.0_3.11_cpu; that 2.6 wheel installed into the 2.9 image fails to
  import, and `xla-images-check` there exits 1 naming the extension and a missing symbol;
* `pip install torchvision` (as the image's non-root user: `USER 1000`, docs/running.md) / `torchaudio` keep
  torch 2.9.0 and torch_xla 2.9.0, and one op of each runs on the XLA device (PJRT CPU); `pip install transformers` keeps torch; `xla-images-check` exits 0 in all three;
  `pip install "torch==2.10.0"` fails, and the build's output names torch and its pin.

Derived builds reach the package index only through this host's TLS-intercepting proxy: its CA is a BuildKit
secret mounted for the pip step (as the product's wheels stage gets it), never a layer.

Cost: the images are the ones the end to end (r2.9.0_3.11_cpu) and test_every_release (r2.6.0_3.11_cpu) build; this
module runs before both (file order) and leaves the two runtime images up to date, so they skip their builds. What
it adds: the two devel stages (~50 s each), the push of the 2.9 pair (~2 min, while the 2.6 pair builds), two
extension compiles (~70 s each) and four small derived builds. With XLA_IMAGES_TEST_CLEANUP=1 the devel and derived
images and the build cache go at the end; the runtime images stay for the tests after it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import pytest

import registries_support as support
from reporters import QuietReporter
from xla_images import names, resources
from xla_images.errors import Failure
from xla_images.generate.plan import Plan, load_plan
from xla_images.model import running
from xla_images.model.target import Target
from xla_images.run import engine
from xla_images.run.building import build

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TAG29, TAG26 = "r2.9.0_3.11_cpu", "r2.6.0_3.11_cpu"
REPOSITORY = "xla-devel"
USER, PASSWORD = "devel-bot", "devel-" + os.urandom(12).hex()
CPU = {"PJRT_DEVICE": "CPU"}


# --- fixtures ------------------------------------------------------------------------------------------------

pki = support.pki_fixture("the devel image tests")


@pytest.fixture(scope="module")
def registry(pki: support.Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[support.TlsRegistry]:
    """TLS + htpasswd, its CA in the engine's certs.d; the pushed blobs go with its directory."""
    directory = tmp_path_factory.mktemp("devel-registry")
    htpasswd = support.write_htpasswd(directory / "htpasswd", {USER: PASSWORD})
    try:
        with support.running_registry(pki, directory, auth="htpasswd", htpasswd=htpasswd) as running:
            yield running
    finally:
        shutil.rmtree(directory / "data", ignore_errors=True)


@pytest.fixture(scope="module")
def user_env(registry: support.TlsRegistry, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A user's docker config (credentials in `auths`) for build.py and for buildx, which pulls FROM images with
    it. Set in this process's environment too: BuildKitBuild runs `docker buildx` with it."""
    config = support.docker_config(tmp_path_factory.mktemp("docker-config"), "auths", registry.host, USER, PASSWORD)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_CONFIG", str(config))
        yield {**os.environ, "CI": "true", "PYTHONPATH": str(REPO), "DOCKER_CONFIG": str(config)}


@pytest.fixture(scope="module")
def images(registry: support.TlsRegistry, user_env: dict[str, str],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The two runtime images and their devel images, built (or up to date), the 2.9 pair pushed as a user pushes
    it while the 2.6 pair builds (a push reads the image store, not the build cache): the push's published.json.
    The devel ones go at the end."""
    plan = load_plan(REPO / "matrix.yaml")
    pair29, pair26 = plan.select((TAG29, TAG29 + "_devel")), plan.select((TAG26, TAG26 + "_devel"))
    record = tmp_path_factory.mktemp("published") / "published.json"
    # Runtime then devel, no cache pruned between: the devel stage reuses the runtime stage's cache. Pruned once a
    # pair is built (nothing after needs it; no build runs then): held while the push copies the 2.9 pair into the
    # registry, the 2.9 cache took the disk to 47 GB above idle, 5 GB from full on a 100 GB runner.
    build_all(plan, pair29)
    engine.builds.prune_build_cache()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="devel-push") as pool:
        pushing = pool.submit(cli, user_env, "push", TAG29, TAG29 + "_devel",
                              "--registry", f"{registry.host}/{REPOSITORY}", "--published", str(record))
        build_all(plan, pair26)
        pushing.result()
    # Freed now, the disk holds the four images, the registry's copy of the 2.9 pair and the derived builds.
    engine.builds.prune_build_cache()
    chosen = [*pair29, *pair26]
    yield record
    if os.environ.get("XLA_IMAGES_TEST_CLEANUP") == "1":
        for flavour in chosen:
            if flavour.is_devel:
                for name in flavour.tags:
                    engine.images.remove_tag(names.local_ref(name))
        engine.builds.prune_build_cache()


def build_all(plan: Plan, chosen: list[Target]) -> None:
    results = build.build_flavours(plan, chosen, build.BuildOptions(), QuietReporter())
    failed = [f"{result.flavour.tag}: {result.message}" for result in results
              if result.outcome not in (build.Outcome.BUILT, build.Outcome.SKIPPED)]
    assert not failed, failed


@pytest.fixture(scope="module")
def published(images: Path, registry: support.TlsRegistry, user_env: dict[str, str]) -> dict[str, str]:
    """{"runtime": digest ref, "devel": digest ref} of r2.9.0_3.11_cpu, pushed and resolved as a user does."""
    entries = json.loads(images.read_text())["flavours"]
    assert set(entries) == {TAG29, TAG29 + "_devel"}
    assert entries[TAG29 + "_devel"]["flavour"]["variant"] == "devel"
    filters = ("--abi", "cxx11", "--python", "3.11", "--torch-xla", "2.9", "--accelerator", "cpu",
               "--published", str(images))
    refs = {"runtime": cli(user_env, "resolve", *filters).stdout.strip(),
            "devel": cli(user_env, "resolve", *filters, "--variant", "devel").stdout.strip()}
    assert refs["runtime"] == f"{registry.host}/{REPOSITORY}@{entries[TAG29]['digest']}"
    assert refs["devel"] == f"{registry.host}/{REPOSITORY}@{entries[TAG29 + '_devel']['digest']}"
    return refs


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([sys.executable, str(REPO / "build.py"), *args], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=1800)
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert PASSWORD not in result.stdout + result.stderr
    return result


# --- building FROM the images --------------------------------------------------------------------------------

def buildkit(context: Path, args: dict[str, str], *, target: str | None = None) -> tuple[str | None, str]:
    """(image id or None when the build failed, the build's whole output). The proxy's CA is the secret
    `ca.crt`, as the product's own builds get it; it is mounted for pip only."""
    lines: list[str] = []
    secrets = {"ca.crt": ca_bundle()}
    started = time.monotonic()
    try:
        # Into the containerd store as `build` does (an untagged `--load` there leaves no image to run).
        export = load_plan(REPO / "matrix.yaml").site.compression \
            if engine.connection.image_store() == "containerd" else None
        image = engine.buildkit.BuildKitBuild(context, args, target=target, secrets=secrets,
                                              export=export).run(lines.append)
    except Failure as error:
        lines.append(error.message)
        image = None
    print(f"[devel] build of {context.name} ({target or 'last stage'}): {time.monotonic() - started:.0f} s",
          file=sys.stderr)
    return image, "\n".join(lines)


def ca_bundle() -> Path:
    site = load_plan(REPO / "matrix.yaml").site.ca_bundle()
    assert site is not None, "derived builds reach the index through this host's proxy: name its CA (PIP_CERT)"
    return Path(site)


def run(image: str, program: str, *, command: list[str] | None = None) -> engine.containers.ContainerRun:
    return engine.containers.run_container(image, command or ["python", "-c", program], role="devel-test",
                                           options=engine.containers.RunOptions(environment=CPU), timeout=900)


def derived_context(tmp_path: Path, install: str, user: int | None = None) -> Path:
    """A user's Dockerfile: FROM the image, one `pip install`, nothing else of ours (the CA mount is the proxy's);
    with `user`, `USER <user>` first, and the CA readable by it (docs/running.md)."""
    context = tmp_path / re.sub(r"\W+", "-", install).strip("-")
    context.mkdir()
    switch, owner = (f"USER {user}\n", f",uid={user}") if user is not None else ("", "")
    (context / "Dockerfile").write_text(
        f"ARG BASE\nFROM ${{BASE}}\n{switch}"
        f"RUN --mount=type=secret,id=ca.crt,target=/tmp/proxy-ca.crt{owner} PIP_CERT=/tmp/proxy-ca.crt "
        f"pip install --no-cache-dir {install}\n")
    return context


def extension_context(tmp_path: Path, name: str) -> Path:
    """examples/extension with a Dockerfile that stops after the install (the check is run apart, to read it)."""
    context = tmp_path / name
    shutil.copytree(resources.extension_example_dir(), context, ignore=shutil.ignore_patterns("__pycache__"))
    example = (context / "Dockerfile").read_text()
    (context / "Dockerfile").write_text(example.split("\n# The op runs on the XLA device")[0] + "\n")
    return context


def installed_versions(image: str) -> dict[str, str]:
    ran = run(image, "import importlib.metadata as m, json; "
                     "print(json.dumps({n: m.version(n) for n in ('torch', 'torch_xla')}))")
    assert ran.exit_code == 0, ran.output[-2000:]
    return json.loads(ran.output.strip().splitlines()[-1])


def check_tool(image: str) -> tuple[int, dict]:
    ran = run(image, "", command=[names.CHECK_TOOL, "--json"])
    return ran.exit_code, json.loads(ran.output[ran.output.index("{"):])


# --- the tests -----------------------------------------------------------------------------------------------

def test_the_extension_builds_in_each_abis_devel_image_and_fits_only_its_own_runtime(
        published: dict[str, str], tmp_path: Path) -> None:
    made: list[str] = []
    try:
        # The example as a user has it, FROM the resolved digests: its last step runs the op and the check.
        example = tmp_path / "example"
        shutil.copytree(resources.extension_example_dir(), example, ignore=shutil.ignore_patterns("__pycache__"))
        image, output = buildkit(example, {"DEVEL": published["devel"], "RUNTIME": published["runtime"]})
        assert image is not None, output[-4000:]
        made.append(image)
        assert "xla_ext: ok" in output and "mul_add: [1.0, 3.0, 5.0, 7.0]" in output, output[-3000:]

        # pre-C++11: the same source in the 2.6 devel image, run in the 2.6 runtime image.
        pair26 = {"DEVEL": names.local_ref(TAG26 + "_devel"), "RUNTIME": names.local_ref(TAG26)}
        image26, output = buildkit(extension_context(tmp_path, "ext26"), pair26)
        assert image26 is not None, output[-4000:]
        made.append(image26)
        ran = run(image26, "", command=["python", "-m", "xla_ext.check"])
        assert ran.exit_code == 0 and "torch 2.6.0" in ran.output and "xla_ext: ok" in ran.output, ran.output[-2000:]
        assert check_tool(image26)[0] == 0

        # The 2.6 wheel in the 2.9 image: it does not import, and the check says which extension and symbol.
        crossed, output = buildkit(extension_context(tmp_path, "ext26-in-29"),
                                   {"DEVEL": pair26["DEVEL"], "RUNTIME": published["runtime"]})
        assert crossed is not None, output[-4000:]
        made.append(crossed)
        imported = run(crossed, "import xla_ext")
        assert imported.exit_code != 0 and "undefined symbol" in imported.output, imported.output[-2000:]
        code, report = check_tool(crossed)
        assert code == 1, report
        problems = " ".join(problem["message"] for problem in report["problems"])
        assert "xla_ext" in problems and re.search(r"_Z\w+", problems), problems
    finally:
        for image in made:
            engine.images.remove_image(image, force=True)


COMPANION_OPS = {
    "torchvision": ("import torchvision, torch\n"
                    "boxes = torch.tensor([[0., 0., 2., 2.], [1., 1., 3., 3.]])\n"
                    "on_xla = torchvision.ops.box_iou(boxes.to(device), boxes.to(device)).cpu()\n"
                    "assert torch.allclose(on_xla, torchvision.ops.box_iou(boxes, boxes)), on_xla\n"
                    "print('torchvision', torchvision.__version__, 'box_iou on', device, on_xla.tolist())\n"),
    "torchaudio": ("import torchaudio, torch\n"
                   "wave = torch.linspace(-1.0, 1.0, 16)\n"
                   "on_xla = torchaudio.functional.mu_law_encoding(wave.to(device), 256).cpu()\n"
                   "assert torch.equal(on_xla, torchaudio.functional.mu_law_encoding(wave, 256)), on_xla\n"
                   "print('torchaudio', torchaudio.__version__, 'mu_law_encoding on', device, on_xla.tolist())\n"),
}


# torchvision is installed by the image's non-root user (`USER 1000`): the venv's directories are group-0 writable,
# so pip works as that user and the constraints hold for it; everything after runs as 1000 too.
COMPANION_USERS = {"torchvision": running.IMAGE_UID}


@pytest.mark.parametrize("companion", sorted(COMPANION_OPS))
def test_an_unpinned_companion_keeps_the_flavour_and_runs_on_the_xla_device(
        companion: str, published: dict[str, str], tmp_path: Path) -> None:
    user = COMPANION_USERS.get(companion)
    image, output = buildkit(derived_context(tmp_path, companion, user), {"BASE": published["runtime"]})
    assert image is not None, output[-4000:]
    try:
        if user is not None:
            owner = run(image, f"import os, {companion}; print(os.getuid(), os.stat({companion}.__file__).st_uid)")
            assert owner.output.split()[-2:] == [str(user)] * 2, owner.output[-2000:]
        assert installed_versions(image) == {"torch": "2.9.0", "torch_xla": "2.9.0"}
        ran = run(image, "import torch_xla\ndevice = torch_xla.device()\n" + COMPANION_OPS[companion])
        assert ran.exit_code == 0, ran.output[-3000:]
        code, report = check_tool(image)
        assert code == 0, report["problems"]
    finally:
        engine.images.remove_image(image, force=True)


def test_transformers_keeps_torch_and_the_check_passes(published: dict[str, str], tmp_path: Path) -> None:
    image, output = buildkit(derived_context(tmp_path, "transformers"), {"BASE": published["runtime"]})
    assert image is not None, output[-4000:]
    try:
        assert installed_versions(image) == {"torch": "2.9.0", "torch_xla": "2.9.0"}
        code, report = check_tool(image)
        assert code == 0, report["problems"]
    finally:
        engine.images.remove_image(image, force=True)


def test_another_torch_fails_the_build_naming_torch_and_its_pin(published: dict[str, str], tmp_path: Path) -> None:
    image, output = buildkit(derived_context(tmp_path, '"torch==2.10.0"'), {"BASE": published["runtime"]})
    if image is not None:
        engine.images.remove_image(image, force=True)
    assert image is None, "pip replaced the image's torch"
    assert "torch==2.10.0" in output and "torch==2.9.0" in output, output[-3000:]
