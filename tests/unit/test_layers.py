"""How installed wheels are grouped into layers (xla_images/layers.py), and the classic builder's Dockerfile."""
from __future__ import annotations

import os
from pathlib import Path

from xla_images import layers
from xla_images.run.building import context


def dist(name: str, requires: list[str], tag: str) -> layers.Dist:
    return layers.Dist(name, "1.0", tuple(requires), layers.is_pure_tags([tag]), ())


def dists() -> dict[str, layers.Dist]:
    specific, pure = "cp311-cp311-manylinux_2_28_x86_64", "py3-none-manylinux_2_17_x86_64"
    items = [
        dist("torch", ["nvidia-cublas-cu12; platform_system == 'Linux'", "sympy>=1", "triton",
                           "numpy; extra == 'numpy'", "dask; python_version < '3.0'",
                           "setuptools; python_version >= '3.8'"], specific),
        dist("setuptools", ["wheel-helper"], "py3-none-any"),
        dist("wheel-helper", [], "py3-none-any"),
        dist("nvidia-cublas-cu12", [], pure),
        dist("sympy", ["mpmath"], "py3-none-any"),
        dist("mpmath", [], "py3-none-any"),
        dist("triton", [], specific),
        dist("torch-xla", ["torch", "numpy", "absl-py"], specific),
        dist("numpy", [], specific),
        dist("absl-py", [], "py3-none-any"),
        dist("libtpu", ["numpy"], specific),
        dist("stray", [], "py3-none-any"),
    ]
    return {item.name: item for item in items}


def test_groups_follow_closures_and_wheel_tags() -> None:
    everything = dists()
    groups = layers.assign_groups(["torch", "torch-xla", "libtpu"], everything, set(everything))
    assert groups == {
        "venv-bootstrap": [],
        "torch-any": ["mpmath", "nvidia-cublas-cu12", "sympy"],  # python-independent part of torch's closure
        # setuptools is pure but only some pythons' torch wants it (a python_version marker): not shared, and
        # neither is what only it pulls in
        "torch": ["setuptools", "torch", "triton", "wheel-helper"],
        # numpy is not torch's (only under an extra torch does not ask for); absl-py and the stray unreached wheel
        "torch_xla": ["absl-py", "numpy", "stray", "torch-xla"],
        "libtpu": ["libtpu"],  # numpy, its dependency, is already placed: libtpu's layer holds libtpu alone
    }


def test_a_pure_wheel_other_roots_need_unconditionally_stays_shared() -> None:
    """setuptools wanted by torch only on some pythons, but by sympy on all: it is in every python's closure."""
    everything = dists()
    everything["sympy"] = dist("sympy", ["mpmath", "setuptools"], "py3-none-any")
    groups = layers.assign_groups(["torch", "torch-xla"], everything, set(everything) - {"libtpu"})
    assert groups["torch-any"] == ["mpmath", "nvidia-cublas-cu12", "setuptools", "sympy", "wheel-helper"]
    assert groups["torch"] == ["torch", "triton"]


def test_cpu_and_tpu_get_the_same_groups_but_libtpus() -> None:
    everything = dists()
    cpu_installed = {name: item for name, item in everything.items() if name != "libtpu"}
    cpu = layers.assign_groups(["torch", "torch-xla"], cpu_installed, set(cpu_installed))
    tpu = layers.assign_groups(["torch", "torch-xla", "libtpu"], everything, set(everything))
    assert {name: members for name, members in tpu.items() if name != "libtpu"} == cpu
    assert layers.layer_names(2) == ["venv-bootstrap", "torch-any", "torch", "torch_xla"]
    assert layers.layer_names(3) == ["venv-bootstrap", "torch-any", "torch", "torch_xla", "libtpu"]


def test_classic_dockerfile_turns_secret_mounts_into_copies_in_the_same_stage() -> None:
    text = (
        "FROM base AS wheels\n"
        "RUN --mount=type=secret,id=pip.conf,target=/tmp/pip/pip.conf \\\n"
        "    --mount=type=secret,id=ca.crt,target=/tmp/pip/ca.crt \\\n"
        "    pip install -r x \\\n"
        "    && true\n"
        "FROM base AS runtime\n"
    )
    assert context.classic_dockerfile(text) == (
        "FROM base AS wheels\n"
        "COPY xla-secrets/pip.conf /tmp/pip/pip.conf\n"
        "COPY xla-secrets/ca.crt /tmp/pip/ca.crt\n"
        "RUN pip install -r x \\\n"
        "    && true\n"
        "FROM base AS runtime\n"
    )


def test_rendered_dockerfiles_have_no_secret_mount_the_classic_rewrite_misses() -> None:
    for dockerfile in Path(__file__).resolve().parents[2].glob("Dockerfiles/*/Dockerfile"):
        classic = context.classic_dockerfile(dockerfile.read_text())
        assert "--mount" not in classic, dockerfile
        assert classic.count("COPY xla-secrets/") == 2, dockerfile


def test_files_of_a_moved_wheel_that_name_the_python_go_to_the_python_specific_layer() -> None:
    """RECORD lists `x.cpython-311.pyc`: like the .pyc files themselves it differs per python, so it leaves the
    shared layer (moved under PURE_DIR all the same, where pip and importlib.metadata look for it)."""
    site = Path("/opt/venv/lib/python3.11/site-packages")
    any_dir = Path(layers.PURE_DIR)
    cases = {
        site / "networkx/__init__.py": ("torch-any", any_dir / "networkx/__init__.py"),
        site / "networkx/__pycache__/__init__.cpython-311.pyc":
            ("torch", any_dir / "networkx/__pycache__/__init__.cpython-311.pyc"),
        site / "networkx-3.6.1.dist-info/RECORD": ("torch", any_dir / "networkx-3.6.1.dist-info/RECORD"),
        site / "networkx-3.6.1.dist-info/METADATA": ("torch-any", any_dir / "networkx-3.6.1.dist-info/METADATA"),
        site / "networkx/RECORD": ("torch-any", any_dir / "networkx/RECORD"),  # a data file of that name
        Path("/opt/venv/bin/isympy"): ("torch", Path("/opt/venv/bin/isympy")),  # its shebang names the venv
    }
    for path, expected in cases.items():
        assert layers._place(path, site, "torch-any", moved=True) == expected, path
    assert layers._place(site / "torch/RECORD", site, "torch", moved=False) == ("torch", site / "torch/RECORD")


SITE = Path("/opt/venv/lib/python3.11/site-packages")


def wheel(name: str, requires: list[str], tag: str, *files: str) -> layers.Dist:
    return layers.Dist(name, "1.0", tuple(requires), layers.is_pure_tags([tag]),
                       tuple(Path(os.path.normpath(SITE / path)) for path in files))


def installed_venv() -> dict[str, layers.Dist]:
    """A venv after ensurepip and the lock: setuptools upgraded by the lock, pip from the bootstrap."""
    return {item.name: item for item in [
        wheel("pip", [], "py3-none-any", "pip/__init__.py", "pip-23.0.1.dist-info/RECORD", "../../../bin/pip"),
        wheel("torch", ["setuptools", "nvidia-nccl-cu12"], "cp311-cp311-linux_x86_64", "torch/__init__.py",
              "torch/lib/libtorch.so", "torch-2.7.0.dist-info/RECORD", "../../../bin/torchrun"),
        wheel("setuptools", [], "py3-none-any", "_distutils_hack/__init__.py", "setuptools/__init__.py",
              "distutils-precedence.pth", "setuptools-82.0.1.dist-info/RECORD",
              "_distutils_hack/__pycache__/__init__.cpython-311.pyc"),
        wheel("nvidia-nccl-cu12", [], "py3-none-manylinux_2_17_x86_64", "nvidia/nccl/lib/libnccl.so.2",
              "nvidia/__init__.py"),
        wheel("torch-xla", ["torch"], "cp311-cp311-linux_x86_64", "torch_xla/__init__.py", "_XLAC.so"),
    ]}


def test_every_installed_file_goes_to_exactly_one_layer_and_the_layers_apply_cleanly() -> None:
    dists = installed_venv()
    layout = layers.plan(["torch", "torch-xla"], dists, set(dists) - {"pip"}, SITE)
    placed = [path for moves in layout.moves.values() for path, _ in moves]
    assert sorted(placed) == sorted(path for item in dists.values() for path in item.files)
    assert layout.groups["venv-bootstrap"] == ["pip"]
    assert layout.relocated == ["nvidia-nccl-cu12", "setuptools"]
    assert (SITE / "_distutils_hack", Path("/opt/xla-images/any/_distutils_hack")) in layout.links
    assert layers.check(layout, {Path("/opt/venv/bin/python3.11"): layers.FILE}) == []


def test_a_base_directory_the_layers_replace_with_a_symlink_is_named() -> None:
    """The 2.7.0/2.8.1 failure: setuptools 66's `_distutils_hack/` in the base venv, and the lock's setuptools
    82 relocated, its site-packages entry a symlink in the `torch` layer."""
    dists = installed_venv()
    layout = layers.plan(["torch", "torch-xla"], dists, set(dists) - {"pip"}, SITE)
    base = {SITE / "_distutils_hack" / "__init__.py": layers.FILE}
    problems = layers.check(layout, base)
    assert problems == [f"{SITE}/_distutils_hack: a directory in layer base, a symlink in layer torch"]


def test_file_and_directory_and_shadowed_paths_across_layers_are_named() -> None:
    dists = installed_venv()
    dists["torch-xla"] = wheel("torch-xla", ["torch"], "cp311-cp311-linux_x86_64", "torch_xla/__init__.py",
                               "../../../bin/torchrun/x", "../../../lib64/libextra.so")
    layout = layers.plan(["torch", "torch-xla"], dists, set(dists) - {"pip"}, SITE)
    problems = layers.check(layout, {Path("/opt/venv/lib64"): layers.SYMLINK})
    assert problems == [
        "/opt/venv/bin/torchrun: a file in layer torch, a directory in layer torch_xla",
        "/opt/venv/lib64: a symlink in layer base, a directory in layer torch_xla",
    ]
    shadow = layers.Layout({}, [], {"torch": [(Path("/a"), Path("/opt/x"))],
                                    "torch_xla": [(Path("/b"), Path("/opt/x"))]})
    assert layers.check(shadow, {}) == [
        "/opt/x: in layer torch and again in layer torch_xla (the upper one would shadow it)"]
