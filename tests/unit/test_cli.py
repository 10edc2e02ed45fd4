"""The CLI contract: list --json keys, exit codes, no tracebacks."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from xla_images.generate.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]


def run(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "build.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def test_list_json_contract() -> None:
    result = run("list", "--json")
    assert result.returncode == 0, result.stderr
    flavours = json.loads(result.stdout)
    assert len(flavours) == len(load_plan(ROOT / "matrix.yaml").flavours)
    required = {"tag", "aliases", "torch_xla", "torch", "python", "abi", "accelerator", "libtpu", "id"}
    for flavour in flavours:
        assert required <= set(flavour)
        assert flavour["abi"] in ("cxx11", "pre-cxx11")
        assert flavour["accelerator"] in ("tpu", "cpu")
        assert (flavour["libtpu"] is None) == (flavour["accelerator"] == "cpu")
        assert flavour["id"].startswith("sha256:") and len(flavour["id"]) == 71
    assert len({flavour["id"] for flavour in flavours}) == len(flavours)


def test_list_filters() -> None:
    newest = [f for f in load_plan(ROOT / "matrix.yaml").flavours if not f.is_nightly][-1]  # releases ascend
    filters = {"abi": newest.abi.value, "python": newest.python, "torch_xla": newest.release_minor}
    result = run("list", "--json", *[f"--{key.replace('_', '-')}={value}" for key, value in filters.items()])
    chosen = json.loads(result.stdout)
    assert chosen and all(all(f[key] == value or f[key].startswith(value + ".") for key, value in filters.items())
                          for f in chosen)
    assert newest.tag in [f["tag"] for f in chosen]


def test_list_variant_devel_gives_the_devel_images_and_runtime_is_the_default() -> None:
    runtime = json.loads(run("list", "--json", "--torch-xla", "2.9", "--python", "3.11").stdout)
    devel = json.loads(run("list", "--json", "--torch-xla", "2.9", "--python", "3.11", "--variant", "devel").stdout)
    both = json.loads(run("list", "--json", "--torch-xla", "2.9", "--python", "3.11", "--variant", "all").stdout)
    assert runtime and all("variant" not in f for f in runtime)
    assert [f["tag"] for f in devel] == [f["tag"] + "_devel" for f in runtime]
    assert all(f["variant"] == "devel" and f["labels"]["io.xla-images.variant"] == "devel" for f in devel)
    assert [f["runtime_tag"] for f in devel] == [f["tag"] for f in runtime]
    assert [f["tag"] for f in both] == [tag for f in runtime for tag in (f["tag"], f["tag"] + "_devel")]
    assert len({f["id"] for f in both}) == len(both)


def test_ids_are_stable_across_runs() -> None:
    first = json.loads(run("list", "--json").stdout)
    second = json.loads(run("list", "--json").stdout)
    assert [f["id"] for f in first] == [f["id"] for f in second]


def test_bad_matrix_exit_code_2_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "matrix.yaml"
    bad.write_text("schema: 1\nreleases:\n  '2.9.0': {torch: '2.8.0'}\n")
    result = run("validate", "--matrix", str(bad))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"{bad}:3: error [schema-missing]" in result.stderr


def test_every_command_has_help() -> None:
    top = run("--help")  # build.py itself, in a process of its own
    assert top.returncode == 0
    # Each command's help through the same main() in this process: 16 interpreters less (~1 s each).
    from hostile_inputs import run_cli
    for command in ("list", "validate", "render", "lint", "lock", "build", "test", "push", "resolve", "abi", "ci",
                    "doctor", "base", "bench", "pull", "wheels"):
        result = run_cli(command, "--help")
        assert result.code == 0, (command, result.err)
        assert len(result.out.splitlines()) > 3, command


def test_set_override_changes_ids_only_where_it_matters() -> None:
    base = {f["tag"]: f["id"] for f in json.loads(run("list", "--json").stdout)}
    moved = {f["tag"]: f["id"] for f in json.loads(run("list", "--json", "--set", "bases.3.11=x/y:1").stdout)}
    changed = {tag for tag in base if base[tag] != moved[tag]}
    assert changed == {tag for tag in base if "_3.11_" in tag}


def test_a_bad_mirror_is_a_usage_error_before_any_registry_is_asked() -> None:
    # 127.0.0.1:1 answers nothing: reaching it would be exit 1 (registry-reachable) after retries, not exit 2.
    for command in ("pull", "resolve"):
        result = run(command, "--registry", "127.0.0.1:1/x", "--mirror", "https://mirror.lan:5000")
        assert result.returncode == 2 and "[mirror-format]" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""
    result = run("pull", "--registry", "127.0.0.1:1/x", "--set", "pull_mirror=mirror.lan:5000/")
    assert result.returncode == 2 and "[site-pull-mirror]" in result.stderr, result.stderr
