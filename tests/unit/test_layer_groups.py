"""How installed wheels are grouped into layers (xla_images/layers.py), and the classic builder's Dockerfile."""
from __future__ import annotations

from pathlib import Path

from xla_images import layers
from xla_images.run import context


class FakeDist:
    def __init__(self, name: str, requires: list[str], tag: str) -> None:
        self.name, self.requires, self.tag = name, requires, tag
        self.version = "1.0"

    def read_text(self, name: str) -> str:
        return f"Wheel-Version: 1.0\nTag: {self.tag}\n" if name == "WHEEL" else ""


def dists() -> dict[str, FakeDist]:
    specific, pure = "cp311-cp311-manylinux_2_28_x86_64", "py3-none-manylinux_2_17_x86_64"
    items = [
        FakeDist("torch", ["nvidia-cublas-cu12; platform_system == 'Linux'", "sympy>=1", "triton",
                           "numpy; extra == 'numpy'", "dask; python_version < '3.0'",
                           "setuptools; python_version >= '3.8'"], specific),
        FakeDist("setuptools", ["wheel-helper"], "py3-none-any"),
        FakeDist("wheel-helper", [], "py3-none-any"),
        FakeDist("nvidia-cublas-cu12", [], pure),
        FakeDist("sympy", ["mpmath"], "py3-none-any"),
        FakeDist("mpmath", [], "py3-none-any"),
        FakeDist("triton", [], specific),
        FakeDist("torch-xla", ["torch", "numpy", "absl-py"], specific),
        FakeDist("numpy", [], specific),
        FakeDist("absl-py", [], "py3-none-any"),
        FakeDist("libtpu", ["numpy"], specific),
        FakeDist("stray", [], "py3-none-any"),
    ]
    return {item.name: item for item in items}


def test_groups_follow_closures_and_wheel_tags() -> None:
    everything = dists()
    groups = layers.assign_groups(["torch", "torch-xla", "libtpu"], everything, set(everything))
    assert groups == {
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
    everything["sympy"].requires = ["mpmath", "setuptools"]
    groups = layers.assign_groups(["torch", "torch-xla"], everything, set(everything) - {"libtpu"})
    assert groups["torch-any"] == ["mpmath", "nvidia-cublas-cu12", "setuptools", "sympy", "wheel-helper"]
    assert groups["torch"] == ["torch", "triton"]


def test_cpu_and_tpu_get_the_same_groups_but_libtpus() -> None:
    everything = dists()
    cpu_locked = set(everything) - {"libtpu"}
    cpu = layers.assign_groups(["torch", "torch-xla"], everything, cpu_locked)
    tpu = layers.assign_groups(["torch", "torch-xla", "libtpu"], everything, set(everything))
    assert {name: members for name, members in tpu.items() if name != "libtpu"} == cpu
    assert layers.layer_names(2) == ["torch-any", "torch", "torch_xla"]
    assert layers.layer_names(3) == ["torch-any", "torch", "torch_xla", "libtpu"]


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
