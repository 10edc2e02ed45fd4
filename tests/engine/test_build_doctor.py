"""`build.py doctor` on this machine: the real engine, and with no engine or registry at all."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path



REPO = Path(__file__).resolve().parents[2]


def _doctor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "build.py"), "doctor", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "CI": "true", **(env or {})})


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _line(output: str, name: str) -> str:
    return next(line for line in output.splitlines() if line.split(maxsplit=1)[1].startswith(name))


def test_doctor_reports_engine_bases_and_tools(bootstrapped_base) -> None:
    result = _doctor()
    assert "Traceback" not in result.stderr
    engine_line = _line(result.stdout, "engine")
    assert engine_line.startswith("ok") and "dockerd" in engine_line and "API 1." in engine_line
    buildkit = _line(result.stdout, "buildkit")
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):  # ci/engine.sh install provides docker-buildx; elsewhere the classic fallback is a warning
        assert buildkit.startswith("ok") and "docker buildx " in buildkit and "driver" in buildkit, buildkit
    else:
        assert buildkit.startswith(("ok", "warn")), buildkit
    assert _line(result.stdout, "base python 3.11").startswith("ok")
    assert "xla-images/base:3.11" in _line(result.stdout, "base python 3.11")
    buildable = _line(result.stdout, "pythons buildable")
    now = buildable.split("now: ", 1)[1].split(";")[0].split(", ")
    assert "3.11" in now
    for name in ("CA bundle", "disk", "shellcheck", "hadolint"):
        _line(result.stdout, name)


def test_doctor_names_the_fix_for_a_missing_registry_and_exits_1() -> None:
    nobody = f"127.0.0.1:{_free_port()}/xla-images"
    result = _doctor("--set", f"registry={nobody}")
    assert result.returncode == 1
    registry = result.stdout[result.stdout.index("missing  registry"):]
    assert "fix: ci/registry.sh start" in registry
    assert "required item(s) missing: registry" in result.stderr


def test_doctor_without_an_engine_names_the_engine_script(tmp_path: Path) -> None:
    result = _doctor(env={"DOCKER_HOST": f"unix://{tmp_path}/none.sock"})
    assert result.returncode == 1
    assert _line(result.stdout, "engine").startswith("missing")
    assert "ci/engine.sh start" in result.stdout
    assert "Traceback" not in result.stderr


def test_doctor_says_where_each_compression_is_done_on_this_engine() -> None:
    """On the containerd store the build compresses either format and the engine pushes the stored blobs; on the
    classic store the engine gzips at push and the toolkit compresses zstd."""
    from xla_images.run.engine import connection

    containerd = connection.image_store() == "containerd"
    for layer_format, classic_words in (("gzip", "the engine compresses at push"), ("zstd", "compressed here")):
        result = _doctor("--set", f"compression.format={layer_format}")
        line = _line(result.stdout, "layer compression")
        assert line.startswith("ok") and f"{layer_format}" in line, line
        expected = "builds store them compressed so" if containerd else classic_words
        assert expected in line, line
