"""A plain install is the whole product (issue 14): `pip install .`, not editable, no extras, outside the checkout.

The `plain_install` fixture (conftest.py, plain_install.py) builds the wheel and installs it into a fresh venv.
Each command then runs as a new user would run it, in a directory that holds nothing but a copy of matrix.yaml,
and its answer is compared with what the checkout itself gives for the same input: same commands, same rendered
files and CI files, same flavour ids (they hash the templates and the smoke suite, so the package data is
complete), same ABI report. With the engine: the image checks (pytest + testinfra) of a small built image run
from the plain install. tests/engine/test_e2e_real_flavour.py runs `test` of the real flavour through it too.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xla_images.generate import cigen
from xla_images.run.building import build
from xla_images.run.building.build import BuildOptions, Outcome

from plain_install import environment

REPO = Path(__file__).resolve().parents[2]
# Every CI file `ci github` and `ci bake` write (what render writes and render --check watches, besides Dockerfiles/).
GENERATED_CI = tuple(str(path) for path in (cigen.BUILD_WORKFLOW, cigen.RESOLVE_WORKFLOW, cigen.EXAMPLE_WORKFLOW,
                                            cigen.UPDATE_WORKFLOW, cigen.BAKE_FILE))
LOCK = "requirements.lock"
# Run by a python: every command path of the CLI it imports and, with HELP set, each path's `--help` (one process:
# a process start per command would cost a second each; the console script itself is run below for the root).
WALK = """
import json, os, click
from click.testing import CliRunner
from xla_images.cli import cli
def walk(command, path):
    yield path
    if isinstance(command, click.Group):
        for name in sorted(command.commands):
            yield from walk(command.commands[name], path + [name])
answers = []
for path in walk(cli, []):
    if os.environ.get("HELP"):
        done = CliRunner().invoke(cli, path + ["--help"], prog_name="xla-images")
        answers.append([path, done.exit_code, done.output[:300], repr(done.exception) if done.exception else None])
    else:
        answers.append([path])
print(json.dumps(answers))
"""


def checkout(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The same command from the checkout (build.py), for comparison."""
    return subprocess.run([sys.executable, str(REPO / "build.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "CI": "true", "PYTHONPATH": str(REPO)})


def ok(done: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr
    return done


def files_under(root: Path) -> dict[str, bytes]:
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty directory with a copy of matrix.yaml, far from the checkout."""
    root = tmp_path_factory.mktemp("plain-project")
    shutil.copyfile(REPO / "matrix.yaml", root / "matrix.yaml")
    return root


@pytest.fixture(scope="module")
def rendered(plain_install, project: Path) -> Path:
    """`render` there, then the checkout's locks added (a lock needs the index; its format is tested elsewhere)
    and `render` again: each image's constraints.txt is made from its lock."""
    ok(plain_install.run("render", cwd=project))
    for lock in (REPO / "Dockerfiles").glob(f"*/{LOCK}"):
        shutil.copyfile(lock, project / "Dockerfiles" / lock.parent.name / LOCK)
    ok(plain_install.run("render", cwd=project))
    return project


def test_installed_not_the_checkout(plain_install) -> None:
    found = subprocess.run([str(plain_install.python), "-c", "import xla_images; print(xla_images.__file__)"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""}, cwd="/")
    location = Path(ok(found).stdout.strip()).resolve()
    assert location.is_relative_to(plain_install.venv.resolve()) and not location.is_relative_to(REPO), location
    assert not (location.parent / "templates").is_symlink(), "the wheel must hold the templates themselves"


def test_every_command_and_subcommand_answers_help(plain_install, tmp_path: Path) -> None:
    walked = ok(subprocess.run([str(plain_install.python), "-c", WALK], capture_output=True, text=True, cwd=tmp_path,
                               env={**environment(), "HELP": "1"}))
    answers = json.loads(walked.stdout)
    from_checkout = ok(subprocess.run([sys.executable, "-c", WALK], capture_output=True, text=True,
                                      env={**os.environ, "PYTHONPATH": str(REPO)}))
    # _register skips a command module that is absent: a wheel without one would lose the command silently.
    assert [path for path, *_ in answers] == [path for path, in json.loads(from_checkout.stdout)]
    assert len(answers) > 15
    for path, exit_code, output, exception in answers:
        assert exit_code == 0 and exception is None, (path, exit_code, exception, output)
        assert output.startswith(f"Usage: xla-images {' '.join(path)}".rstrip()), (path, output)
    root = ok(plain_install.run("--help", cwd=tmp_path))  # the console script itself
    assert root.stdout.startswith("Usage: xla-images [OPTIONS] COMMAND")


def test_validate_and_list_answer_as_the_checkout_does(plain_install, project: Path) -> None:
    assert ok(plain_install.run("validate", cwd=project)).stdout == ok(checkout("validate", cwd=project)).stdout
    listed = ok(plain_install.run("list", "--json", cwd=project)).stdout
    assert listed == ok(checkout("list", "--json", cwd=project)).stdout
    assert len(json.loads(listed)) == len(json.loads(ok(checkout("list", "--json", cwd=REPO)).stdout))


def test_render_writes_the_repository_files(rendered: Path) -> None:
    written = files_under(rendered / "Dockerfiles")
    committed = {path: data for path, data in files_under(REPO / "Dockerfiles").items() if not path.endswith(LOCK)}
    assert {path: data for path, data in written.items() if not path.endswith(LOCK)} == committed
    for relative in GENERATED_CI:
        assert (rendered / relative).read_bytes() == (REPO / relative).read_bytes(), relative


def test_with_the_locks_ids_and_checks_equal_the_repository(plain_install, rendered: Path) -> None:
    # The ids hash the rendered files, the lock and the smoke suite: equal ids mean the wheel's data is complete.
    assert ok(plain_install.run("list", "--json", cwd=rendered)).stdout == ok(checkout("list", "--json",
                                                                                       cwd=REPO)).stdout
    ok(plain_install.run("render", "--check", cwd=rendered))
    ok(plain_install.run("ci", "github", "--check", cwd=rendered))
    ok(plain_install.run("ci", "bake", "--check", cwd=rendered))


def test_lint(plain_install, rendered: Path) -> None:
    if shutil.which("shellcheck") is None and not os.environ.get("CI"):
        pytest.skip("shellcheck is not installed (ci/engine.sh install installs it)")
    assert "clean" in ok(plain_install.run("lint", cwd=rendered)).stdout


def test_ci_commands_write_the_repository_files(plain_install, tmp_path: Path) -> None:
    shutil.copyfile(REPO / "matrix.yaml", tmp_path / "matrix.yaml")
    ok(plain_install.run("ci", "github", cwd=tmp_path))
    ok(plain_install.run("ci", "bake", cwd=tmp_path))
    assert sorted(files_under(tmp_path)) == sorted(["matrix.yaml", *GENERATED_CI])
    for relative in GENERATED_CI:
        assert (tmp_path / relative).read_bytes() == (REPO / relative).read_bytes(), relative


def test_abi_inspect_of_a_small_elf(plain_install, tmp_path: Path) -> None:
    libstdcxx = Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6")  # apt itself links it: on every Debian
    if not libstdcxx.exists():
        pytest.skip(f"no {libstdcxx} here")
    site = tmp_path / "site-packages"
    site.mkdir()
    shutil.copyfile(libstdcxx, site / "libstdc++.so.6")
    report = ok(plain_install.run("abi", "inspect", str(site), "--json", cwd=tmp_path)).stdout
    assert report == ok(checkout("abi", "inspect", str(site), "--json", cwd=tmp_path)).stdout
    (library,) = json.loads(report)["shared_objects"]
    assert library["path"] == "libstdc++.so.6" and library["glibc"], library


def test_doctor_runs_and_names_the_missing_plot_extra(plain_install, project: Path) -> None:
    done = ok(plain_install.run("doctor", cwd=project))
    line = next(line for line in done.stdout.splitlines() if "extra 'plot'" in line)
    assert line.startswith("warn") and "matplotlib" in line, line
    assert "pip install 'xla-images[plot]'" in done.stdout


def test_bench_plot_without_the_extra_names_it_and_exits_2(plain_install, project: Path) -> None:
    done = plain_install.run("bench", "r2.9.0_3.11_cpu", "--plot", "compile.png", cwd=project)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "optional extra 'plot'" in done.stderr and "pip install 'xla-images[plot]'" in done.stderr
    assert "==" not in done.stderr, "it must refuse before running any image"


def test_image_checks_run_from_the_plain_install(plain_install, make_project, reporter, no_leaked_containers,
                                                 tmp_path: Path) -> None:
    """`test` needs pytest and testinfra at run time (the bug of issue 14): a small image, checked from the venv."""
    project = make_project("8.141.0")
    plan = project.plan()
    (flavour,) = plan.flavours
    (result,) = build.build_flavours(plan, [flavour], BuildOptions(), reporter)
    assert result.outcome is Outcome.BUILT, result.message
    reports = tmp_path / "reports"
    # The stand-in torch has no C++ libraries and computes nothing: the ABI checks, the runs as each user and the
    # smoke suite need the real one (e2e and every-release tests).
    done = ok(plain_install.run("test", flavour.tag, "--checks-only", "-k", "not abi and not runs_as", "--reports",
                                str(reports), cwd=project.root, timeout=600))
    summary = json.loads((reports / flavour.tag / "checks.json").read_text())
    statuses = {check["name"]: check["status"] for check in summary["checks"]}
    assert statuses.get("test_built_for_this_flavour") == "passed", statuses  # same id from the installed data
    assert statuses.get("test_python_version") == "passed", statuses  # testinfra in the container
    assert summary["summary"]["failed"] == 0 and summary["summary"]["passed"] >= 8, summary["summary"]
    assert f"reports in {reports}" in done.stdout
