"""ci/setup.sh: each step a no-op when its result is there, never skipped when something changed; --bases.

The real script runs in a copy of the checkout's layout whose collaborators record their arguments instead of
acting: ci/engine.sh and ci/registry.sh, the venv's pip and python. What is tested is setup.sh's own logic: when
it runs pip (the venv stamp), and which `build.py base` it asks for.
"""
from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
RECORDER = '#!/bin/sh\nprintf "%s %s\\n" "$(basename "$0")" "$*" >> "$CALLS"\n'
# pip as installing the lock leaves it: one more distribution in the venv.
PIP = RECORDER + 'case "$*" in *requirements.lock*) mkdir -p "$SITE/torch-2.9.0.dist-info" ;; esac\n'


@dataclass
class Checkout:
    root: Path
    venv: Path
    calls: Path

    @property
    def site(self) -> Path:
        return self.venv / "lib" / "python3.11" / "site-packages"

    def setup(self, *args: str) -> subprocess.CompletedProcess[str]:
        self.calls.write_text("")
        return subprocess.run(["bash", str(self.root / "ci" / "setup.sh"), *args], capture_output=True, text=True,
                              timeout=60, env={"PATH": "/usr/bin:/bin", "VENV": str(self.venv),
                                               "CALLS": str(self.calls), "SITE": str(self.site)})

    def recorded(self) -> list[str]:
        return self.calls.read_text().splitlines()

    def pip_calls(self) -> list[str]:
        return [line for line in self.recorded() if line.startswith("pip ")]


@pytest.fixture
def checkout(tmp_path: Path) -> Checkout:
    root = tmp_path / "checkout"
    (root / "ci").mkdir(parents=True)
    shutil.copy(REPO / "ci" / "setup.sh", root / "ci" / "setup.sh")
    for script in ("engine.sh", "registry.sh"):
        (root / "ci" / script).write_text(RECORDER)
    (root / "pyproject.toml").write_text('[project]\ndependencies = ["click==8.5.1"]\n')
    lock = root / "Dockerfiles" / "r2.9.0_3.11_cpu" / "requirements.lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("torch==2.9.0 --hash=sha256:00\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.2\n")
    for tool, script in (("pip", PIP), ("python", RECORDER)):
        (venv / "bin" / tool).write_text(script)
        (venv / "bin" / tool).chmod(0o755)
    made = Checkout(root, venv, tmp_path / "calls")
    (made.site / "click-8.5.1.dist-info").mkdir(parents=True)
    return made


def test_second_run_installs_nothing_and_a_changed_pin_installs_again(checkout: Checkout) -> None:
    first = checkout.setup("--no-torch")
    assert first.returncode == 0, first.stderr
    assert checkout.pip_calls() == ["pip install --quiet --disable-pip-version-check pip==26.3",
                                    "pip install --quiet --disable-pip-version-check -e .[test]"]
    assert checkout.setup("--no-torch").returncode == 0
    assert checkout.pip_calls() == []
    # The engine, the registry and the base are still asked every time: they skip on their own.
    assert checkout.recorded()[:3] == ["engine.sh install", "engine.sh start", "registry.sh start"]

    pyproject = checkout.root / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("8.5.1", "8.5.2"))
    checkout.setup("--no-torch")
    assert len(checkout.pip_calls()) == 2


@pytest.mark.parametrize("change", ["removed", "upgraded", "added", "new python"])
def test_a_venv_changed_by_hand_installs_again(checkout: Checkout, change: str) -> None:
    checkout.setup("--no-torch")
    click = checkout.site / "click-8.5.1.dist-info"
    if change == "removed":
        click.rmdir()
    elif change == "upgraded":
        click.rename(checkout.site / "click-8.6.0.dist-info")
    elif change == "added":
        (checkout.site / "six-1.17.0.dist-info").mkdir()
    else:
        (checkout.venv / "pyvenv.cfg").write_text("home = /usr/local/bin\nversion = 3.11.9\n")
    checkout.setup("--no-torch")
    assert len(checkout.pip_calls()) == 2


def test_another_checkout_installs_again(checkout: Checkout, tmp_path: Path) -> None:
    """The editable install points at one checkout: the same venv used from another must be re-pointed."""
    checkout.setup("--no-torch")
    other = shutil.copytree(checkout.root, tmp_path / "other")
    checkout.root = other
    checkout.setup("--no-torch")
    assert len(checkout.pip_calls()) == 2


def test_torch_step_has_its_own_stamp(checkout: Checkout) -> None:
    checkout.setup("--no-torch")
    checkout.setup()
    assert [call.split()[-1] for call in checkout.pip_calls()] == ["Dockerfiles/r2.9.0_3.11_cpu/requirements.lock"]
    # The lock added a distribution; the stamps were taken after it, so neither step runs again.
    assert (checkout.site / "torch-2.9.0.dist-info").is_dir()
    checkout.setup()
    assert checkout.pip_calls() == []
    checkout.setup("--no-torch")
    assert checkout.pip_calls() == []

    lock = checkout.root / "Dockerfiles" / "r2.9.0_3.11_cpu" / "requirements.lock"
    lock.write_text("torch==2.9.0 --hash=sha256:01\n")
    checkout.setup()
    assert [call.split()[-1] for call in checkout.pip_calls()] == ["Dockerfiles/r2.9.0_3.11_cpu/requirements.lock"]


def test_a_failed_install_leaves_no_stamp(checkout: Checkout) -> None:
    pip = checkout.venv / "bin" / "pip"
    pip.write_text(PIP + 'case "$*" in *-e*) exit 1 ;; esac\n')
    assert checkout.setup("--no-torch").returncode != 0
    pip.write_text(PIP)
    checkout.setup("--no-torch")
    assert len(checkout.pip_calls()) == 2


@pytest.mark.parametrize(("bases", "asked"), [
    ([], "python build.py base --python=3.11"),
    (["--bases", "all"], "python build.py base"),
    (["--bases=3.11,3.13"], "python build.py base --python=3.11 --python=3.13"),
    (["--bases", "none"], None),
])
def test_bases_option(checkout: Checkout, bases: list[str], asked: str | None) -> None:
    result = checkout.setup("--no-torch", *bases)
    assert result.returncode == 0, result.stderr
    base_calls = [call for call in checkout.recorded() if call.startswith("python build.py base")]
    assert base_calls == ([asked] if asked else [])
    assert checkout.recorded()[-1] == "python build.py doctor"


@pytest.mark.parametrize("args", [["--bases"], ["--bases", "3"], ["--bases", "3.11,"], ["--bases", "3.11;id"],
                                  ["--torch"]])
def test_bad_options_are_refused_before_any_work(checkout: Checkout, args: list[str]) -> None:
    result = checkout.setup(*args)
    assert result.returncode == 2
    assert "usage:" in result.stderr
    assert checkout.recorded() == []
