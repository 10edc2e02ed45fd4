"""generate.update and model.wheel_index: facts -> the matrix edit (comments and order kept, validated), and the
wheel-python rule validation checks offline. The index itself: test_index.py (fake) and test_update_network.py."""
from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from xla_images import yamlsrc
from xla_images.errors import ConfigError, ErrorList, Failure
from xla_images.generate import update
from xla_images.generate.plan import load_plan
from xla_images.model import matrix, wheel_index
from xla_images.model.flavour import Accelerator
from xla_images.model.site import load_site
from xla_images.run.packages.upstream import metadata_pins
from support.matrices import RELEASE_2_9_0

MATRIX = """\
schema: 1
defaults:
  # every python we may build
  pythons: ["3.10", "3.11", "3.12", "3.13"]
  accelerators: [tpu, cpu]
releases:
  # the first one
  "2.7.0":
    torch: "2.7.0"
    pytorch_git_rev: v2.7.0
    xla_git_rev: v2.7.0
    python_support: ">=3.10,<3.12"
    libtpu: "0.0.11.1"
    torchvision: "0.22.0"
    torchaudio: "2.7.0"
  # the newest one
""" + RELEASE_2_9_0 + """\
    torchvision: "0.24.0"
    torchaudio: "2.9.0"

# trailing comment about excludes
exclude:
  - {torch_xla: "2.9.0", python: "3.13", accelerator: tpu}
"""
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
BOTH = (Accelerator.TPU, Accelerator.CPU)


def facts(version: str = "2.8.1", torch: str = "2.8.0", libtpu: str | None = "0.0.17",
          xla: tuple[str, ...] = ("3.10", "3.11", "3.12", "3.13"), torch_wheels: tuple[str, ...] = ("3.9", "3.10",
          "3.11", "3.12", "3.13", "3.14"), libtpu_wheels: tuple[str, ...] = ("3.10", "3.11", "3.12")
          ) -> update.ReleaseFacts:
    wheels = {"torch-xla": xla, "torch": torch_wheels}
    if libtpu:
        wheels["libtpu"] = libtpu_wheels
    return update.ReleaseFacts(version, torch, libtpu, wheels)


def edited(*items: update.ReleaseFacts, text: str = MATRIX) -> str:
    decisions = [update.decide(item, PYTHONS, BOTH) for item in items]
    return update.edit_matrix(text, "m.yaml", decisions).text


def test_decide_pins_support_and_excludes() -> None:
    decision = update.decide(facts(), PYTHONS, BOTH)
    settings = dict(decision.settings)
    assert settings == {"torch": '"2.8.0"', "pytorch_git_rev": "v2.8.0", "xla_git_rev": "v2.8.1",
                        "python_support": '">=3.10,<3.14"', "libtpu": '"0.0.17"'}
    assert [entry for _, entry in decision.excludes] == ['{torch_xla: "2.8.1", python: "3.13", accelerator: tpu}']
    assert decision.pythons == PYTHONS


def test_pythons_are_those_torch_xla_and_torch_share() -> None:
    decision = update.decide(facts(torch_wheels=("3.11", "3.12")), PYTHONS, BOTH)
    assert dict(decision.settings)["python_support"] == '">=3.11,<3.13"'
    assert decision.pythons == ("3.11", "3.12")


def test_a_pure_python_libtpu_serves_every_python() -> None:
    decision = update.decide(facts(libtpu_wheels=("3+",)), PYTHONS, BOTH)
    assert decision.excludes == ()


def test_no_libtpu_wheel_at_all_builds_cpu_only() -> None:
    assert dict(update.decide(facts(libtpu_wheels=()), PYTHONS, BOTH).settings)["accelerators"] == "[cpu]"
    assert "libtpu" not in dict(update.decide(facts(libtpu=None), PYTHONS, BOTH).settings)
    with pytest.raises(Failure) as caught:
        update.decide(facts(libtpu=None), PYTHONS, (Accelerator.TPU,))
    assert caught.value.rule == "update-facts"


def test_no_shared_python_is_a_clear_failure() -> None:
    with pytest.raises(Failure) as caught:
        update.decide(facts(torch_wheels=("3.9",)), PYTHONS, BOTH)
    assert caught.value.rule == "update-facts"


def test_edit_keeps_every_line_and_puts_the_release_in_order() -> None:
    text = edited(facts())
    old_lines, new_lines = MATRIX.splitlines(), text.splitlines()
    # Nothing removed or changed: every old line is still there, in the same order.
    iterator = iter(new_lines)
    assert all(line in iterator for line in old_lines)
    # 2.8.1 goes between 2.7.0 and 2.9.0, above the comment that introduces 2.9.0.
    assert new_lines.index('  "2.8.1":') < new_lines.index("  # the newest one") < new_lines.index('  "2.9.0":')
    assert new_lines[-1] == '  - {torch_xla: "2.8.1", python: "3.13", accelerator: tpu}'
    releases = list(yamlsrc.loads(text, "m.yaml").data["releases"])
    assert releases == ["2.7.0", "2.8.1", "2.9.0"]
    update.validate(text, "m.yaml", load_site(None), None)


def test_a_newer_release_goes_last_and_an_existing_one_is_left_alone() -> None:
    text = edited(facts("2.10.0", "2.10.0", "0.0.30"), facts("2.9.0", "2.9.0", "0.0.21"))
    assert list(yamlsrc.loads(text, "m.yaml").data["releases"]) == ["2.7.0", "2.9.0", "2.10.0"]
    assert text.count('"2.9.0":') == 1
    assert text.index('  "2.10.0":') < text.index("# trailing comment about excludes")


def test_a_matrix_without_excludes_gains_the_section() -> None:
    text = MATRIX[:MATRIX.index("# trailing comment")]
    text = text.replace('    libtpu: "0.0.21"\n', '    libtpu: "0.0.21"\n    pythons: ["3.10", "3.11", "3.12"]\n')
    result = edited(facts(), text=text)
    assert yamlsrc.loads(result, "m.yaml").data["exclude"] == [
        {"torch_xla": "2.8.1", "python": "3.13", "accelerator": "tpu"}]


def test_a_flow_exclude_list_is_refused_not_rewritten() -> None:
    text = MATRIX.replace('exclude:\n  - {torch_xla: "2.9.0", python: "3.13", accelerator: tpu}\n',
                          'exclude: [{torch_xla: "2.9.0", python: "3.13", accelerator: tpu}]\n')
    with pytest.raises(ConfigError) as caught:
        edited(facts(), text=text)
    assert caught.value.rule == "update-edit" and caught.value.location.line == text.splitlines().index(
        'exclude: [{torch_xla: "2.9.0", python: "3.13", accelerator: tpu}]') + 1


def test_flow_releases_are_refused_and_a_flow_release_is_followed() -> None:
    flow = 'schema: 1\nreleases: {"2.7.0": {torch: "2.7.0", pytorch_git_rev: v2.7.0, xla_git_rev: v2.7.0, ' \
           'python_support: ">=3.10,<3.12", libtpu: "0.0.11.1"}}\n'
    with pytest.raises(ConfigError) as caught:
        edited(facts(libtpu_wheels=("3+",)), text=flow)
    assert caught.value.rule == "update-edit" and caught.value.location.line == 2
    one_line = MATRIX.replace('  "2.9.0":\n    torch: "2.9.0"\n    pytorch_git_rev: v2.9.1\n    xla_git_rev: v2.9.0\n'
                              '    python_support: ">=3.10,<3.14"\n    libtpu: "0.0.21"\n'
                              '    torchvision: "0.24.0"\n    torchaudio: "2.9.0"\n',
                              '  "2.9.0": {torch: "2.9.0", pytorch_git_rev: v2.9.1, xla_git_rev: v2.9.0, '
                              'python_support: ">=3.10,<3.14", libtpu: "0.0.21", torchvision: "0.24.0", '
                              'torchaudio: "2.9.0"}\n')
    assert one_line != MATRIX
    text = edited(facts("2.10.0", "2.10.0", "0.0.30"), text=one_line)
    assert '  "2.10.0":\n    torch: "2.10.0"\n' in text
    update.validate(text, "m.yaml", load_site(None), None)


def test_an_edit_that_would_not_validate_raises() -> None:
    text = edited(facts())
    cache = wheel_index.WheelIndex(wheel_index.PUBLIC_INDEX, {"libtpu": {"0.0.17": ("3.10",)}})
    with pytest.raises(ErrorList) as caught:
        update.validate(text, "m.yaml", load_site(None), cache)
    assert [error.rule for error in caught.value.errors] == ["wheel-python", "wheel-python"]


# --- model.wheel_index --------------------------------------------------------------------------------------

def test_wheel_pythons_reads_linux_x86_64_cpython_tags() -> None:
    names = ["libtpu-0.0.21-cp310-cp310-manylinux_2_31_x86_64.whl",
             "libtpu-0.0.21-cp313-cp313t-manylinux_2_31_x86_64.whl",
             "libtpu-0.0.21-cp312-cp312-manylinux_2_31_aarch64.whl", "libtpu-0.0.21-cp311-cp311-win_amd64.whl",
             "libtpu-0.0.21.1-cp313-cp313-manylinux_2_31_x86_64.whl",
             "libtpu-0.0.7.1-py3-none-manylinux_2_27_x86_64.whl", "x-1.0-cp39-abi3-manylinux2014_x86_64.whl"]
    assert wheel_index.wheel_pythons(names, "libtpu", "0.0.21") == ("3.10",)
    assert wheel_index.wheel_pythons(names, "libtpu", "0.0.7.1") == ("3+",)
    assert wheel_index.wheel_pythons(names, "x", "1.0") == ("3.9+",)
    assert wheel_index.serves(("3.9+",), "3.13") and not wheel_index.serves(("3.9+",), "3.8")
    assert not wheel_index.serves(("3.10", "3.11"), "3.13") and wheel_index.serves(("3+",), "3.13")


def test_the_cache_round_trips_and_bad_caches_name_the_rule(tmp_path: Path) -> None:
    cache = wheel_index.WheelIndex(wheel_index.PUBLIC_INDEX, {"libtpu": {"0.0.21": ("3.10", "3.11")},
                                                             "torch": {"2.9.0": ("3.10",)}})
    path = tmp_path / wheel_index.WHEELS_FILE
    path.write_text(cache.dumps())
    assert wheel_index.load(path).wheels == cache.wheels
    for bad in ("{", '{"schema": 2}', '{"schema": 1, "index": "x", "wheels": {"torch": {"2.9.0": ["3.1x"]}}}',
                "[" * 200_000 + "]" * 200_000):
        path.write_text(bad)
        with pytest.raises(ConfigError) as caught:
            wheel_index.load(path)
        assert caught.value.rule == "wheel-cache"


def test_validate_refuses_a_flavour_whose_libtpu_has_no_wheel(tmp_path: Path) -> None:
    (tmp_path / "matrix.yaml").write_text(MATRIX.replace(
        '  - {torch_xla: "2.9.0", python: "3.13", accelerator: tpu}\n', '  - {python: "3.10", accelerator: cpu}\n'))
    load_plan(tmp_path / "matrix.yaml")  # no cache: nothing is known, nothing is checked
    cache = {"schema": 1, "index": wheel_index.PUBLIC_INDEX, "wheels": {"libtpu": {"0.0.21": ["3.10", "3.11", "3.12"]}}}
    (tmp_path / wheel_index.WHEELS_FILE).write_text(json.dumps(cache))
    with pytest.raises(ConfigError) as caught:
        load_plan(tmp_path / "matrix.yaml")
    assert caught.value.rule == "wheel-python" and "r2.9.0_3.13_tpuvm" in caught.value.message
    assert caught.value.location.line == MATRIX.splitlines().index('  "2.9.0":') + 1
    # Another index's facts say nothing about the public index's wheels.
    (tmp_path / wheel_index.WHEELS_FILE).write_text(json.dumps({**cache, "index": "https://mirror.example/simple/"}))
    load_plan(tmp_path / "matrix.yaml")


def test_metadata_pins_read_the_tpu_extra() -> None:
    text = ("Metadata-Version: 2.1\nName: torch_xla\nVersion: 2.6.0\nRequires-Dist: absl-py\n"
            'Requires-Dist: libtpu==0.0.7.1; extra == "tpu"\n'
            'Requires-Dist: libtpu-nightly==0.1.dev20241010+nightly.cleanup; extra == "tpu"\n'
            'Requires-Dist: jax==0.7.1; extra == "pallas"\n')
    assert metadata_pins(text, "u") == {"libtpu": "0.0.7.1"}
    assert metadata_pins(text + "Requires-Dist: torch==2.6.0\n", "u") == {"libtpu": "0.0.7.1", "torch": "2.6.0"}
    for bad in ("Name: x\n", text + "Requires-Dist: torch==2.6.0+cu12\n", text + "Requires-Dist: ==\n"):
        with pytest.raises(Failure) as caught:
            metadata_pins(bad, "u")
        assert caught.value.rule == "wheel-metadata"


@pytest.mark.parametrize("release", ["foo bar", "2.9", "2.9.0\n", "2.9.0; rm -rf /", "\u0662.\u0669.\u0660"])
def test_a_release_option_that_is_no_version_is_refused_before_the_network(tmp_path: Path, release: str) -> None:
    from xla_images.run.packages.upstream import plan_update

    (tmp_path / "matrix.yaml").write_text(MATRIX)

    class NoNetwork:
        url = "http://127.0.0.1:9/simple/"

        def files(self, project: str) -> list:
            raise AssertionError("the index was asked")

    with pytest.raises(ConfigError) as caught:
        plan_update(tmp_path / "matrix.yaml", load_site(None), (release,), index=NoNetwork())
    assert caught.value.rule == "update-release"


def test_matrix_defaults_are_what_releases_inherit() -> None:
    defaults = matrix.matrix_defaults(yamlsrc.loads(MATRIX, "m.yaml"))
    assert defaults["pythons"] == PYTHONS and defaults["accelerators"] == BOTH


# --- run.packages.upstream end to end, against an index in memory ----------------------------------------------------

class MemoryIndex:
    """The run.packages.index.Index interface over file names; every torch_xla wheel's METADATA pins `libtpu`,
    every companion's pins torch (`companion_torch`: its version -> the torch it pins; none: no torch requirement)."""

    url = wheel_index.PUBLIC_INDEX

    def __init__(self, names: dict[str, list[str]], libtpu: dict[str, str], yanked: frozenset[str] = frozenset(),
                 marker: str = 'extra == "tpu"', companion_torch: dict[str, str | None] | None = None) -> None:
        from xla_images.run.packages.index import IndexFile

        self.names, self.libtpu, self.marker = names, libtpu, marker
        self.companion_torch = companion_torch or {}
        self.read: list[str] = []  # the wheels whose METADATA was read, in order
        self.pages = {project: [IndexFile(name, f"https://files.example/{name}", yanked=name in yanked)
                                for name in found] for project, found in names.items()}

    def files(self, project: str) -> list:
        from xla_images.run.packages.index import NotFound

        if project not in self.pages:
            raise NotFound(f"{self.url}{project}/ answered HTTP 404", rule="index-answer")
        return self.pages[project]

    def wheel_member(self, file, wanted) -> str | None:
        project, version = file.filename.split("-")[:2]
        if project in ("torchvision", "torchaudio") and wanted(f"{project}-x.dist-info/METADATA"):
            self.read.append(file.filename)
            pin = self.companion_torch.get(f"{project}-{version}")
            return f"Name: {project}\nVersion: {version}\nRequires-Dist: numpy\n" + (
                f"Requires-Dist: torch (=={pin})\n" if pin else "")
        if wanted("torch_xla-x.dist-info/METADATA"):
            return (f"Metadata-Version: 2.1\nName: torch_xla\nVersion: {version}\n"
                    f'Requires-Dist: libtpu=={self.libtpu[version]}; {self.marker}\n')
        return "__xla_gitrev__ = '0123456789abc'\n" if wanted("torch_xla/version.py") else None


def wheels(project: str, version: str, pythons: tuple[str, ...]) -> list[str]:
    tag = "manylinux_2_28_x86_64"
    return [f"{project}-{version}-cp{p.replace('.', '')}-cp{p.replace('.', '')}-{tag}.whl" for p in pythons]


# The companions of torch 2.7.0, 2.9.0 and 2.10.0 (and 2.9.1), as the public index has them.
COMPANION_TORCH = {"torchvision-0.22.0": "2.7.0", "torchvision-0.24.0": "2.9.0", "torchvision-0.24.1": "2.9.1",
                   "torchvision-0.25.0": "2.10.0", "torchaudio-2.7.0": "2.7.0", "torchaudio-2.9.0": "2.9.0",
                   "torchaudio-2.9.1": "2.9.1", "torchaudio-2.10.0": "2.10.0"}


def companion_pages(pins: dict[str, str | None]) -> dict[str, list[str]]:
    """Project pages of companions: one x86_64 wheel per `name-version` of `pins`."""
    pages: dict[str, list[str]] = {"torchvision": [], "torchaudio": []}
    for key in pins:
        name, version = key.split("-")
        pages[name] += wheels(name, version, ("3.11",))
    return pages


def memory_index(extra: tuple[str, ...] = (), companions: dict[str, str | None] | None = None,
                 **options) -> MemoryIndex:
    """The index of 2.7.0, 2.9.0, 2.10.1 (and 2.11.0rc1); `extra` torch_xla releases too, each with its torch;
    `companions` (COMPANION_TORCH unless given): the companion releases and the torch each pins."""
    four = ("3.10", "3.11", "3.12", "3.13")
    companions = COMPANION_TORCH if companions is None else companions
    return MemoryIndex({
        **companion_pages(companions),
        "torch-xla": wheels("torch_xla", "2.7.0", four) + wheels("torch_xla", "2.9.0", four)
        + wheels("torch_xla", "2.10.1", four) + wheels("torch_xla", "2.11.0rc1", four)
        + [name for version in extra for name in wheels("torch_xla", version, four)],
        "torch": wheels("torch", "2.7.0", four) + wheels("torch", "2.9.0", four) + wheels("torch", "2.10.0", four)
        + wheels("torch", "2.10.2", four) + [name for version in extra for name in wheels("torch", version, four)],
        "libtpu": ["libtpu-0.0.11.1-py3-none-manylinux_2_31_x86_64.whl"] + wheels("libtpu", "0.0.21", four[:3])
        + wheels("libtpu", "0.0.30", four[:3]),
    }, {"2.9.0": "0.0.21", "2.10.1": "0.0.30", **{version: "0.0.30" for version in extra}},
        companion_torch=companions, **options)


def test_plan_update_adds_the_newer_release_from_the_index(tmp_path: Path) -> None:
    from xla_images.run.packages.upstream import plan_update, write_update

    (tmp_path / "matrix.yaml").write_text(MATRIX)
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), index=memory_index())
    # 2.11.0rc1 is no release; 2.10.1 pairs with torch 2.10.0, the newest 2.10 not newer than itself.
    assert result.added == ("2.10.1",) and result.missing
    release = yamlsrc.loads(result.after, "m.yaml").data["releases"]["2.10.1"]
    assert (release["torch"], release["libtpu"], release["python_support"]) == ("2.10.0", "0.0.30", ">=3.10,<3.14")
    assert '  - {torch_xla: "2.10.1", python: "3.13", accelerator: tpu}' in result.after
    assert result.diff.startswith("--- a/") and "+  \"2.10.1\":" in result.diff
    assert write_update(result) == [tmp_path / "matrix.yaml", tmp_path / wheel_index.WHEELS_FILE]
    plan = load_plan(tmp_path / "matrix.yaml")  # validates against the cache just written
    assert "r2.10.1_3.13_tpuvm" not in {flavour.tag for flavour in plan.flavours}
    again = plan_update(tmp_path / "matrix.yaml", load_site(None), index=memory_index())
    assert again.added == () and not again.missing and again.after == again.before
    assert write_update(again) == []


def test_plan_update_of_a_named_release_and_an_absent_one(tmp_path: Path) -> None:
    from xla_images.run.packages.upstream import plan_update

    (tmp_path / "matrix.yaml").write_text(MATRIX)
    named = plan_update(tmp_path / "matrix.yaml", load_site(None), ("2.9.0",), index=memory_index())
    assert named.added == ()  # already in the matrix: nothing to add
    with pytest.raises(ConfigError) as caught:
        plan_update(tmp_path / "matrix.yaml", load_site(None), ("2.8.0",), index=memory_index())
    assert caught.value.rule == "update-release" and "2.10.1" in caught.value.hint


# --- silent accepts made errors or warnings (issue 35) --------------------------------------------------------

def test_a_release_that_skips_minor_releases_is_left_out_unless_allowed(tmp_path: Path) -> None:
    from xla_images.run.packages.upstream import plan_update

    (tmp_path / "matrix.yaml").write_text(MATRIX)
    index = memory_index(("9999.0.0", "2.12.0"))
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), index=index)
    assert result.added == ("2.10.1",)  # 2.12.0 skips 2.11 after 2.10.1; 9999.0.0 skips thousands
    assert [line.split(" skips")[0] for line in result.warnings] == ["torch_xla 2.12.0", "torch_xla 9999.0.0"]
    assert all("--allow" in line for line in result.warnings)
    allowed = plan_update(tmp_path / "matrix.yaml", load_site(None), index=index, allow=("2.12.0",))
    assert allowed.added == ("2.10.1", "2.12.0") and len(allowed.warnings) == 1
    with pytest.raises(ConfigError) as caught:  # named: refused, not skipped
        plan_update(tmp_path / "matrix.yaml", load_site(None), ("9999.0.0",), index=index)
    assert caught.value.rule == "update-jump" and "--allow 9999.0.0" in caught.value.hint
    named = plan_update(tmp_path / "matrix.yaml", load_site(None), ("9999.0.0",), index=index, allow=("9999.0.0",))
    assert named.added == ("9999.0.0",)


def test_a_yanked_release_is_not_proposed(tmp_path: Path) -> None:
    from xla_images.run.packages.upstream import plan_update

    (tmp_path / "matrix.yaml").write_text(MATRIX)
    yanked = frozenset(wheels("torch_xla", "2.10.1", ("3.10", "3.11", "3.12", "3.13")))
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), index=memory_index(yanked=yanked))
    assert result.added == () and result.after == result.before
    assert result.warnings == ("torch_xla 2.10.1 is yanked on the index (PEP 592): not proposed",)
    with pytest.raises(ConfigError) as caught:
        plan_update(tmp_path / "matrix.yaml", load_site(None), ("2.10.1",), index=memory_index(yanked=yanked))
    assert caught.value.rule == "update-release" and "yanked" in caught.value.message


def test_a_yanked_file_does_not_count_as_a_wheel(tmp_path: Path) -> None:
    from xla_images.run.packages.upstream import plan_update

    (tmp_path / "matrix.yaml").write_text(MATRIX)
    yanked = frozenset(wheels("libtpu", "0.0.30", ("3.12",)))
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), index=memory_index(yanked=yanked))
    cache = json.loads(result.cache_after)
    assert cache["wheels"]["libtpu"]["0.0.30"] == ["3.10", "3.11"]


def test_markers_are_evaluated_for_the_matrix_pythons_not_the_host(tmp_path: Path) -> None:
    from xla_images.run.packages.upstream import plan_update

    (tmp_path / "matrix.yaml").write_text(MATRIX)
    host = f"{sys.version_info.major}.{sys.version_info.minor}"
    marker = f'extra == "tpu" and python_version != "{host}"'
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), index=memory_index(marker=marker))
    assert result.facts[0].libtpu == "0.0.30"
    assert yamlsrc.loads(result.after, "m.yaml").data["releases"]["2.10.1"]["libtpu"] == "0.0.30"
    # A marker no image python meets pins nothing, whatever python runs update.
    text = ('Name: torch_xla\nVersion: 2.9.0\n'
            f'Requires-Dist: libtpu==0.0.21; extra == "tpu" and python_version == "{host}"\n')
    others = tuple(python for python in PYTHONS if python != host)
    assert metadata_pins(text, "u", "2.9.0", others) == {}


@pytest.mark.parametrize("text, needle", [
    ("Name: torch\nVersion: 2.9.0\n", "not torch_xla"),
    ("Name: torch-xla\nVersion: 2.8.0\n", "not torch_xla 2.9.0"),
    ("Name: torch_xla\nVersion: not a version\n", "not torch_xla 2.9.0"),
    ("Name: torch_xla\nVersion: 2.9.0\nRequires-Dist: libtpu==1; " + "(" * 3000 + 'extra == "tpu"' + ")" * 3000
     + "\n", "Requires-Dist"),
], ids=["other-project", "other-version", "bad-version", "deep-marker"])
def test_metadata_of_another_wheel_or_too_deep_is_refused(text: str, needle: str) -> None:
    with pytest.raises(Failure) as caught:
        metadata_pins(text, "u", "2.9.0")
    assert caught.value.rule == "wheel-metadata" and needle in caught.value.message
    assert metadata_pins("Name: Torch_XLA\nVersion: 2.9\n", "u", "2.9.0") == {}  # names and versions normalised


def test_write_keeps_a_symlinked_matrix_and_the_modes(tmp_path: Path) -> None:
    """A matrix linked to another file of its own folder (matrix.yaml -> matrix.prod.yaml) stays a link whose
    target is rewritten, every file keeping its mode."""
    from xla_images.run.packages.upstream import plan_update, write_update

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "matrix.prod.yaml").write_text(MATRIX)
    (repo / "matrix.prod.yaml").chmod(0o664)
    (repo / "matrix.yaml").symlink_to("matrix.prod.yaml")
    result = plan_update(repo / "matrix.yaml", load_site(None), index=memory_index())
    write_update(result)
    assert (repo / "matrix.yaml").is_symlink() and os.readlink(repo / "matrix.yaml") == "matrix.prod.yaml"
    assert '"2.10.1":' in (repo / "matrix.prod.yaml").read_text()
    assert stat.S_IMODE((repo / "matrix.prod.yaml").stat().st_mode) == 0o664
    umask = os.umask(0o022)
    os.umask(umask)
    # Beside the matrix file itself, where validation reads it; new: a checkout file's mode, not 0600.
    cache = repo / wheel_index.WHEELS_FILE
    assert stat.S_IMODE(cache.stat().st_mode) == 0o666 & ~umask
    cache.chmod(0o640)
    (repo / "matrix.prod.yaml").write_text(MATRIX)
    write_update(plan_update(repo / "matrix.yaml", load_site(None), index=memory_index(("2.11.0",))))
    assert stat.S_IMODE(cache.stat().st_mode) == 0o640 and '"2.11.0"' in cache.read_text()
    assert sorted(path.name for path in repo.iterdir()) == [  # no temp file
        "matrix.prod.yaml", "matrix.wheels.json", "matrix.yaml"]
    assert wheel_index.load(load_plan(repo / "matrix.yaml").root / wheel_index.WHEELS_FILE) is not None


def test_write_refuses_a_matrix_linked_into_another_folder(tmp_path: Path) -> None:
    """Issue 41: repo/matrix.yaml -> ../shared/matrix.yaml made `update --write` write Dockerfiles/ and
    matrix.wheels.json beside the shared file, outside the checkout. Refused (disk-outside) before any write."""
    from xla_images.run.packages.upstream import plan_update, write_update

    shared, repo = tmp_path / "shared", tmp_path / "repo"
    shared.mkdir()
    repo.mkdir()
    (shared / "matrix.yaml").write_text(MATRIX)
    (repo / "matrix.yaml").symlink_to("../shared/matrix.yaml")
    result = plan_update(repo / "matrix.yaml", load_site(None), index=memory_index())
    with pytest.raises(ConfigError) as caught:
        write_update(result)
    assert caught.value.rule == "disk-outside" and caught.value.exit_code == 2
    assert str(shared / "matrix.yaml") in caught.value.message
    assert sorted(path.name for path in shared.iterdir()) == ["matrix.yaml"]
    assert (shared / "matrix.yaml").read_text() == MATRIX
    assert sorted(path.name for path in repo.iterdir()) == ["matrix.yaml"]


def test_credentials_in_the_index_url_are_never_printed_or_written(index_server: str, tmp_path: Path) -> None:
    from support.index import FakeIndex, json_page, wheel
    from hostile_inputs import run_cli

    four = ("3.10", "3.11", "3.12", "3.13")
    pages = {project: [name for version in versions for name in wheels(project.replace("-", "_"), version, four)]
             for project, versions in (("torch-xla", ("2.7.0", "2.9.0", "2.10.0", "9999.0.0")),
                                       ("torch", ("2.7.0", "2.9.0", "2.10.0")), ("libtpu", ("0.0.11.1", "0.0.21")))}
    pages["libtpu"] += wheels("libtpu", "0.0.30", four[:3])
    metadata = 'Name: torch_xla\nVersion: 2.10.0\nRequires-Dist: libtpu==0.0.30; extra == "tpu"\n'
    for project, names in pages.items():
        FakeIndex.routes[f"/simple/{project}/"] = json_page([{"filename": name, "url": f"../../files/{name}"}
                                                             for name in names])
        for name in names:
            FakeIndex.routes[f"/files/{name}"] = (200, "application/octet-stream",
                                                  wheel({"torch_xla-2.10.0.dist-info/METADATA": metadata}))
    (tmp_path / "matrix.yaml").write_text(MATRIX)
    host = index_server.removeprefix("http://")
    source = f'wheel_sources=[{{name: corp, index_url: "http://user:s3cret@{host}/simple"}}]'
    outcome = run_cli("update", "--write", "--matrix", str(tmp_path / "matrix.yaml"), "--set", source)
    assert outcome.code == 0, outcome.err
    assert "s3cret" not in outcome.out + outcome.err and f"http://***@{host}/simple/" in outcome.err
    assert "warning: torch_xla 9999.0.0 skips more than a minor release after 2.10.0: not proposed (--allow " \
           "9999.0.0 takes it)" in outcome.err
    assert all(authorization == "Basic dXNlcjpzM2NyZXQ=" for authorization in FakeIndex.authorizations)
    written = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert not [path for path in written if b"s3cret" in path.read_bytes()]
    cache = wheel_index.load(tmp_path / wheel_index.WHEELS_FILE)
    assert cache.index == f"http://{host}/simple/" and cache.pythons("libtpu", "0.0.30") == four[:3]
    # The cache still describes the source's index: validation checks it (wheel-python) as before.
    plan = load_plan(tmp_path / "matrix.yaml", overrides=(source,))
    assert "r2.10.0_3.13_tpuvm" not in {flavour.tag for flavour in plan.flavours}
    checked = run_cli("update", "--check", "--matrix", str(tmp_path / "matrix.yaml"), "--set", source)
    assert checked.code == 0 and "s3cret" not in checked.out + checked.err, checked.err


# --- companions: the torchvision and torchaudio that pin each release's torch (issue 33) ---------------------

def without_companions(text: str, release: str | None = None) -> str:
    """MATRIX without the companion lines (of one release when named)."""
    for version, vision, audio in (("2.7.0", "0.22.0", "2.7.0"), ("2.9.0", "0.24.0", "2.9.0")):
        if release in (None, version):
            text = text.replace(f'    torchvision: "{vision}"\n    torchaudio: "{audio}"\n', "", 1)
    return text


def test_a_new_release_records_the_companions_that_pin_its_torch(tmp_path: Path) -> None:
    from xla_images.run.packages.upstream import plan_update

    (tmp_path / "matrix.yaml").write_text(MATRIX)
    index = memory_index()
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), index=index)
    release = yamlsrc.loads(result.after, "m.yaml").data["releases"]["2.10.1"]
    assert (release["torchvision"], release["torchaudio"]) == ("0.25.0", "2.10.0")
    assert result.facts[0].companions == {"torchvision": "0.25.0", "torchaudio": "2.10.0"}
    assert '    libtpu: "0.0.30"\n    torchvision: "0.25.0"\n    torchaudio: "2.10.0"\n' in result.after
    # The newest of each pins torch 2.10.0: one wheel read each, and the matrix's releases have theirs already.
    assert index.read == ["torchvision-0.25.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                          "torchaudio-2.10.0-cp311-cp311-manylinux_2_28_x86_64.whl"]
    assert result.filled == () and result.warnings == ()


def test_a_release_the_matrix_has_without_companions_gains_them(tmp_path: Path) -> None:
    from xla_images.run.packages.upstream import plan_update, write_update

    text = without_companions(MATRIX)
    (tmp_path / "matrix.yaml").write_text(text)
    index = memory_index()
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), ("2.9.0",), index=index)
    assert result.added == () and result.missing  # `update --check` fails on it
    assert result.filled == (("2.7.0", (("torchvision", '"0.22.0"'), ("torchaudio", '"2.7.0"'))),
                             ("2.9.0", (("torchvision", '"0.24.0"'), ("torchaudio", '"2.9.0"'))))
    assert result.after == MATRIX  # each at the end of its release's block, every other line as it was
    # Newest first, each wheel read once, down to the one that pins the torch.
    assert [name.split("-cp")[0] for name in index.read] == [
        "torchvision-0.25.0", "torchvision-0.24.1", "torchvision-0.24.0", "torchvision-0.22.0",
        "torchaudio-2.10.0", "torchaudio-2.9.1", "torchaudio-2.9.0", "torchaudio-2.7.0"]
    write_update(result)
    again = plan_update(tmp_path / "matrix.yaml", load_site(None), ("2.9.0",), index=memory_index())
    assert not again.missing and again.after == again.before


def test_companions_are_read_until_a_pin_below_the_torch(tmp_path: Path) -> None:
    from xla_images.run.packages.upstream import plan_update

    (tmp_path / "matrix.yaml").write_text(without_companions(MATRIX, "2.7.0"))
    pins = {"torchvision-0.23.0": "2.8.0", "torchvision-0.22.1": "2.7.1", "torchvision-0.21.0": "2.6.0",
            "torchvision-0.20.0": "2.5.0", "torchaudio-2.10.0": None, "torchaudio-2.7.0": "2.7.0"}
    index = memory_index(companions=pins)
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), ("2.9.0",), index=index)
    # torchvision: no release pins torch 2.7.0, and 0.21.0's 2.6.0 ends the search (0.20.0 is never read);
    # torchaudio 2.10.0 pins no torch at all: passed over, not a match.
    assert result.filled == (("2.7.0", (("torchaudio", '"2.7.0"'),)),)
    assert [name.split("-cp")[0] for name in index.read] == [
        "torchvision-0.23.0", "torchvision-0.22.1", "torchvision-0.21.0", "torchaudio-2.10.0", "torchaudio-2.7.0"]


def test_an_index_without_companions_records_none_and_says_so(tmp_path: Path) -> None:
    from xla_images.run.packages.upstream import plan_update

    (tmp_path / "matrix.yaml").write_text(MATRIX)
    index = memory_index(companions={key: pin for key, pin in COMPANION_TORCH.items() if key != "torchvision-0.25.0"})
    del index.pages["torchaudio"]  # a private index: no such project (HTTP 404)
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), index=index)
    release = yamlsrc.loads(result.after, "m.yaml").data["releases"]["2.10.1"]
    assert "torchvision" not in release and "torchaudio" not in release and result.filled == ()
    assert result.warnings == ("the index has no torchaudio: no torchaudio version is recorded",)
    assert result.facts[0].notes == ("no torchvision on the index pins torch 2.10.0: none recorded",)


def test_companions_are_read_from_an_http_index(index_server: str, tmp_path: Path) -> None:
    """Over HTTP (range requests into real zips): a companion's METADATA of another project or version is refused,
    the old `torch (==X)` form is read, and a page the index does not have is a warning, not a failure."""
    from support.index import FakeIndex, json_page, wheel
    from xla_images.run.packages.index import Index
    from xla_images.run.packages.upstream import plan_update

    four = ("3.10", "3.11", "3.12", "3.13")
    pages = {project: [name for version in versions for name in wheels(project.replace("-", "_"), version, four)]
             for project, versions in (("torch-xla", ("2.7.0", "2.9.0")), ("torch", ("2.7.0", "2.9.0")),
                                       ("torchvision", ("0.22.0", "0.24.0")))}
    pages["libtpu"] = ["libtpu-0.0.11.1-py3-none-manylinux_2_31_x86_64.whl"] + wheels("libtpu", "0.0.21", four[:3])
    for project, names in pages.items():
        FakeIndex.routes[f"/simple/{project}/"] = json_page([{"filename": name, "url": f"../../files/{name}"}
                                                             for name in names])
        for name in names:
            version = name.split("-")[1]
            FakeIndex.routes[f"/files/{name}"] = (200, "application/octet-stream", wheel({
                f"torchvision-{version}.dist-info/METADATA":
                    f"Name: torchvision\nVersion: {version}\nRequires-Dist: numpy\n"
                    f"Requires-Dist: torch (=={ {'0.22.0': '2.7.0', '0.24.0': '2.9.0'}.get(version) })\n"}))
    (tmp_path / "matrix.yaml").write_text(without_companions(MATRIX))
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), ("2.9.0",),
                         index=Index(f"{index_server}/simple/", attempts=1))
    assert result.filled == (("2.7.0", (("torchvision", '"0.22.0"'),)), ("2.9.0", (("torchvision", '"0.24.0"'),)))
    assert result.warnings == ("the index has no torchaudio: no torchaudio version is recorded",)
    assert "/simple/torchaudio/" in FakeIndex.requests
    # `update --check` fails while a release lacks its companions, naming them and the rule.
    from hostile_inputs import run_cli

    source = f'wheel_sources=[{{name: local, index_url: "{index_server}/simple"}}]'
    checked = run_cli("update", "--check", "--matrix", str(tmp_path / "matrix.yaml"), "--set", source)
    assert checked.code == 1 and "[update-behind]" in checked.err, checked.err
    assert "the index has the companions of torch_xla 2.7.0, 2.9.0, which the matrix lacks" in checked.err
    assert "torch_xla 2.7.0: companions torchvision 0.22.0" in checked.out
    # A wheel whose METADATA is another project's gives no pin: the index is refused, naming the rule.
    name = next(name for name in pages["torchvision"] if "-0.24.0-" in name)
    FakeIndex.routes[f"/files/{name}"] = (200, "application/octet-stream", wheel({
        "torch-0.24.0.dist-info/METADATA": "Name: torch\nVersion: 0.24.0\nRequires-Dist: torch==2.9.0\n"}))
    with pytest.raises(Failure) as caught:
        plan_update(tmp_path / "matrix.yaml", load_site(None), ("2.9.0",),
                    index=Index(f"{index_server}/simple/", attempts=1))
    assert caught.value.rule == "wheel-metadata" and "not torchvision 0.24.0" in caught.value.message


def test_companions_follow_torch_xla_s_jump_and_yank_rules(tmp_path: Path) -> None:
    """Issue 41: a torchvision 9999.0.0 pinning the release's torch was recorded; and a yanked companion must not
    be. Both are passed over like torch_xla's: the jump with a note naming it, the yanked one silently."""
    from xla_images.run.packages.upstream import plan_update

    (tmp_path / "matrix.yaml").write_text(MATRIX)
    pins = {**COMPANION_TORCH, "torchvision-9999.0.0": "2.10.0", "torchaudio-2.10.5": "2.10.0"}
    yanked = frozenset(wheels("torchaudio", "2.10.5", ("3.11",)))
    index = memory_index(companions=pins, yanked=yanked)
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), index=index)
    assert result.facts[0].companions == {"torchvision": "0.25.0", "torchaudio": "2.10.0"}
    assert "torchvision 9999.0.0 skips more than a minor release after 0.24.0: not recorded" in result.facts[0].notes
    assert not any("9999" in name or "2.10.5" in name for name in index.read)


def test_build_tagged_companion_wheels_are_read_like_the_others(tmp_path: Path) -> None:
    """Issue 41: `torchvision-0.25.0-1-cp311-cp311-manylinux_2_28_x86_64.whl` (a build tag) stopped update with a
    false "has no x86_64 Linux wheel": wheel names are parsed by packaging, build tags included."""
    from xla_images.run.packages.upstream import plan_update

    (tmp_path / "matrix.yaml").write_text(MATRIX)
    index = memory_index()
    index.pages["torchvision"] = [dataclasses.replace(file, filename=file.filename.replace("-cp311-", "-1-cp311-", 1))
                                  for file in index.pages["torchvision"]]
    result = plan_update(tmp_path / "matrix.yaml", load_site(None), index=index)
    assert result.facts[0].companions == {"torchvision": "0.25.0", "torchaudio": "2.10.0"}
    assert wheel_index.wheel_pythons(["torchvision-0.25.0-1-cp311-cp311-manylinux_2_28_x86_64.whl"], "torchvision",
                                     "0.25.0") == ("3.11",)
