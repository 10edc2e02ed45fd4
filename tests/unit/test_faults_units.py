"""Error paths behind the fault tests (tests/engine/test_faults_*.py), without an engine: the push retry on a
transient registry answer, atomic writes on a failing disk, a stalled pull, pytest crashing under Ctrl-C.
The per-flavour build lock across real processes is in test_build_mutex.py.
"""
from __future__ import annotations

import errno
import os
import signal
import types
from pathlib import Path

import pytest

from xla_images import diskio
from xla_images.errors import Failure
from xla_images.model.registry import Registry
from xla_images.run import engine
from xla_images.run.shipping import publish
from xla_images.run.registry import RetryPolicy

NO_WAIT = RetryPolicy(attempts=3, first_wait=0.0, max_wait=0.0)
DIGEST = "sha256:" + "a" * 64
REGISTRY = Registry.parse("127.0.0.1:5999/xla-images")


# --- push retried on a transient answer --------------------------------------------------------------------

class FlakyPush:
    """engine.transfer.push_image failing with `errors` one after another, then answering DIGEST."""

    def __init__(self, errors: list[str]) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.tags: list[str] = []

    def push_image(self, repository: str, tag: str, auth: object, on_line: object = None,
                   layer_status: object = None) -> str:
        self.calls += 1
        if self.errors:
            raise Failure(f"push of {repository}:{tag} failed: {self.errors.pop(0)}", rule="push")
        return DIGEST

    def tag_image(self, image: str, repository: str, tag: str) -> None:
        self.tags.append(f"{repository}:{tag}")

    def remove_tag(self, ref: str) -> None:
        self.tags.remove(ref)


@pytest.fixture
def flaky(monkeypatch: pytest.MonkeyPatch):
    def make(errors: list[str]) -> FlakyPush:
        fake = FlakyPush(errors)
        for module, name in ((engine.transfer, "push_image"), (engine.images, "tag_image"),
                             (engine.images, "remove_tag")):
            monkeypatch.setattr(module, name, getattr(fake, name))
        return fake
    return make


def test_a_5xx_on_the_manifest_put_is_pushed_again(flaky) -> None:
    # The classic store's wording, then the containerd store's (its push asks for the tag's manifest first).
    fake = flaky(["received unexpected HTTP status: 503 Service Unavailable",
                  "unexpected status from HEAD request to http://127.0.0.1:5000/v2/x/manifests/t: "
                  "500 Internal Server Error"])
    said: list[str] = []
    assert publish._push_tag("img", REGISTRY, "t", None, said.append, NO_WAIT) == DIGEST
    assert fake.calls == 3 and fake.tags == []
    assert [line for line in said if "pushing t again" in line][0].endswith("(attempt 2 of 3)")


def test_a_layer_upload_cut_on_the_containerd_store_is_pushed_again(flaky) -> None:
    # Unlike the classic store's dockerd, the containerd store's push does not retry a cut upload itself.
    fake = flaky(['failed to copy: failed to do request: Put "http://127.0.0.1:5000/v2/x/blobs/uploads/u?digest=d": '
                  "write tcp 127.0.0.1:1->127.0.0.1:2: use of closed network connection"])
    assert publish._push_tag("img", REGISTRY, "t", None, lambda line: None, NO_WAIT) == DIGEST
    assert fake.calls == 2 and fake.tags == []


def test_a_registry_that_keeps_answering_503_fails_naming_the_attempts(flaky) -> None:
    fake = flaky(["received unexpected HTTP status: 503 Service Unavailable"] * 5)
    with pytest.raises(Failure) as caught:
        publish._push_tag("img", REGISTRY, "t", None, lambda line: None, NO_WAIT)
    assert fake.calls == 3 and fake.tags == []
    assert caught.value.message.endswith("503 Service Unavailable (3 attempts)")


@pytest.mark.parametrize("error", ["denied: requested access to the resource is denied",
                                   "write tcp 127.0.0.1:1->127.0.0.1:2: use of closed network connection",
                                   "received unexpected HTTP status: 404 Not Found",
                                   "unexpected status from HEAD request to http://h/v2/x/manifests/t: 401 "
                                   "Unauthorized"])
def test_other_push_errors_are_not_pushed_again(flaky, error: str) -> None:
    # Connection errors come out of dockerd's own five layer retries: a second round would double the wait.
    fake = flaky([error])
    with pytest.raises(Failure, match="push of"):
        publish._push_tag("img", REGISTRY, "t", None, lambda line: None, NO_WAIT)
    assert fake.calls == 1 and fake.tags == []


# --- atomic writes on a failing disk ----------------------------------------------------------------------

def test_atomic_write_on_a_full_disk_keeps_the_old_file_and_no_temp(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "published.json"
    target.write_text("old\n")

    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(Failure) as caught:
        diskio.write_text_atomic(target, "new\n", "published.json")
    assert caught.value.rule == "disk-write"
    assert caught.value.message == f"cannot write published.json {target}: No space left on device"
    assert target.read_text() == "old\n" and [path.name for path in tmp_path.iterdir()] == ["published.json"]


def test_log_file_fails_once_naming_itself_then_drops_lines(tmp_path: Path) -> None:
    blocker = tmp_path / "reports"
    blocker.write_text("a file where the directory should be")
    log = diskio.LogFile(blocker / "t" / "build.log", "the build log")
    with pytest.raises(Failure, match=f"cannot write the build log {blocker}/t/build.log"):
        log.write("first\n")
    log.write("second\n")  # dropped, no second error
    log.close()
    assert log.failed


# --- the pull stall watchdog's limit ---------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [("", engine.transfer.PULL_STALL_SECONDS), ("5", 5.0), (" 90.5 ", 90.5)])
def test_pull_stall_limit_comes_from_the_environment(text: str, seconds: float, monkeypatch) -> None:
    monkeypatch.setenv(engine.transfer.PULL_STALL_ENV, text)
    assert engine.transfer.pull_stall_seconds() == seconds


@pytest.mark.parametrize("text", ["0", "0.5", "3601", "nan", "inf", "-5", "ten", "1e9"])
def test_a_pull_stall_limit_out_of_range_is_a_clear_error(text: str, monkeypatch) -> None:
    monkeypatch.setenv(engine.transfer.PULL_STALL_ENV, text)
    with pytest.raises(Failure) as raised:
        engine.transfer.pull_stall_seconds()
    assert raised.value.rule == "pull-stall" and engine.transfer.PULL_STALL_ENV in raised.value.message


def test_a_stalled_pull_is_retried_then_reported(monkeypatch) -> None:
    """Every attempt stalls: `attempts` tries, a progress line between them, then one pull-stall Failure."""
    tries: list[float] = []

    def stalling(ref: str, auth: object, say, stall: float) -> None:
        tries.append(stall)
        raise engine.transfer._PullStalled()

    monkeypatch.setattr(engine.transfer, "_pull_once", stalling)
    lines: list[str] = []
    with pytest.raises(Failure) as raised:
        engine.transfer.pull_image("127.0.0.1:5999/x@" + DIGEST, None, lines.append, stall_seconds=7, attempts=3)
    assert tries == [7, 7, 7]
    assert raised.value.rule == "pull-stall"
    assert "no progress for 7 s, 3 times" in raised.value.message
    assert lines == [f"  no progress for 7 s: pulling 127.0.0.1:5999/x@{DIGEST} again (attempt {n} of 3)"
                     for n in (2, 3)]


# --- Ctrl-C while the image checks run in pytest.main ------------------------------------------------------

class CrashingPytest:
    """pytest.main as it behaved in CI: it catches the Ctrl-C, then its report of it crashes with a TypeError."""

    def __init__(self, interrupt: bool) -> None:
        self.interrupt = interrupt

    def __call__(self, args, plugins=()):
        if self.interrupt:
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                pass
        raise TypeError("unsupported operand type(s) for -: 'NoneType' and 'int'")


@pytest.mark.usefixtures("ctrl_c_raises")
@pytest.mark.parametrize("interrupt", [True, False])
def test_a_crash_of_pytest_while_reporting_ctrl_c_is_still_the_interrupt(interrupt: bool, tmp_path: Path,
                                                                        monkeypatch) -> None:
    """With a Ctrl-C noted, what pytest.main raises becomes a KeyboardInterrupt (the CLI: `aborted`, exit 130,
    no report); without one, a crash is a crash and is not hidden."""
    import pytest as pytest_module

    from xla_images.run.checking import checks

    monkeypatch.setattr(pytest_module, "main", CrashingPytest(interrupt))
    monkeypatch.setattr(checks, "_target_plugin", lambda target: object())
    target = checks.CheckTarget(types.SimpleNamespace(tag="r9.9.9_3.11_cpu"), "xla-images:r9.9.9_3.11_cpu", None)
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt if interrupt else TypeError):
        checks.run(target, tmp_path / "reports")
    assert signal.getsignal(signal.SIGINT) is before  # the handlers in place are back
    assert not list((tmp_path / "reports").glob("checks.*"))
