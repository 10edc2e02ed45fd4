"""smoke_runner's restricted run: the relay program prints the reports as marked lines, read back whole."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from xla_images.model import running
from xla_images.run.checking import smoke_runner


def test_relay_round_trip(tmp_path: Path) -> None:
    """RELAY, run for real with a stand-in suite, prints reports that relayed_reports reads back byte for byte;
    the suite's own output stays, its exit code is RELAY's."""
    suite = tmp_path / "xla_smoke"
    suite.mkdir()
    report = '{"summary": {"passed": 3}, "pad": "' + "x" * 10000 + '"}'
    (suite / "__main__.py").write_text(
        "import os, sys\n"
        "directory = sys.argv[sys.argv.index('--report-dir') + 1]\n"
        "os.makedirs(directory, exist_ok=True)\n"
        f"open(os.path.join(directory, 'report.json'), 'w').write({report!r})\n"
        "print('suite says hello')\n"
        "sys.exit(1)\n")
    directory = tmp_path / "reports"
    relay = smoke_runner.RELAY.format(directory=str(directory), chunk=smoke_runner.CHUNK, mark=smoke_runner.REPORT_MARK)
    # The stand-in comes first on the path (never the real suite, which PYTHONPATH may name).
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", relay, "--report-dir", str(directory)], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    reports, output = smoke_runner.relayed_reports(result.stdout)
    assert reports == {"report.json": report.encode()}
    assert output.strip() == "suite says hello"
    assert max(len(line) for line in result.stdout.splitlines()) < 16 * 1024  # the engine's log line


def test_a_damaged_report_is_left_out() -> None:
    output = f"{smoke_runner.REPORT_MARK} report.json !!notbase64\nplain line"
    assert smoke_runner.relayed_reports(output) == ({}, "plain line")


def test_restricted_names_and_command() -> None:
    assert smoke_runner.restricted_names() == {"report.json": "smoke-restricted.json",
                                               "junit.xml": "smoke-restricted.xml"}
    command = smoke_runner.restricted_command()
    assert command[command.index("--only") + 1] == "environment,scan,tracing"
    assert command[command.index("--report-dir") + 1].startswith(running.FALLBACK_ROOT + "/")


def test_options_follow_the_profile() -> None:
    options = smoke_runner.options_for(running.restricted_profile())
    kwargs = options.create_kwargs()
    assert kwargs["user"] == f"{running.ARBITRARY_UID}:0" and kwargs["read_only"] is True
    assert kwargs["tmpfs"] == {"/tmp": running.TMPFS_OPTIONS} and kwargs["cap_drop"] == ["ALL"]
    assert kwargs["security_opt"] == ["no-new-privileges"] and kwargs["network_mode"] == "none"
    # The default profile asks the engine for nothing more than it always did.
    plain = smoke_runner.run_options(None, tpu=False).create_kwargs()  # type: ignore[arg-type]
    assert set(plain) == {"environment", "privileged", "network_mode", "shm_size"}
