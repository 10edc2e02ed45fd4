"""Containers: run a command to its end, keep one running for checks, copy files in and out.

Every container started here is labelled CREATED_BY_LABEL=<role> and removed by the function that started it,
even on Ctrl-C (removal goes by the container's name, which exists before its id does).
"""
from __future__ import annotations

import contextlib
import io
import queue
import secrets
import tarfile
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Iterator

import docker
import docker.errors
import requests

from ...errors import Failure
from ...names import LABEL_PREFIX
from . import connection


# Containers this toolkit creates carry this label, so a sweep can find exactly ours.
CREATED_BY_LABEL = f"{LABEL_PREFIX}.created-by"


def extract_from_image(image: str, container_path: str, dest: Path) -> Path:
    """Copy `container_path` (a file or directory) out of `image` into the directory `dest`.

    Returns the path of the copy, `dest / basename(container_path)`; a symlink is followed (as `docker cp
    -L` does) and its target stored under the link's name. The container is created but never started, and
    is always removed, even when the copy fails. Members that would land outside `dest` (absolute paths,
    `..`) are refused; symlinks inside the copy that point outside it are skipped.
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    name = PurePosixPath(container_path.rstrip("/") or "/").name
    container = _create_stopped(image)
    try:
        archive = _get_archive(container, image, container_path)
    finally:
        remove_container(container.id)
    with tarfile.open(fileobj=archive, mode="r:") as tar:
        try:
            tar.extractall(dest, filter=_renaming_filter(name))
        except tarfile.TarError as error:
            raise Failure(f"refusing to extract {container_path} from {image}: {error}",
                          rule="safe-extract") from None
    return dest / name


def _get_archive(container, image: str, container_path: str) -> io.BytesIO:
    try:
        stream, stat = container.get_archive(container_path)
        if stat.get("linkTarget"):
            # The engine reports the fully resolved target: fetch that instead of the link itself.
            stream, stat = container.get_archive(stat["linkTarget"])
        return io.BytesIO(b"".join(stream))
    except docker.errors.NotFound:
        raise Failure(f"{container_path} does not exist in image {image}", rule="image-path-exists") from None


def _renaming_filter(name: str):
    """tarfile filter: store the archive's top entry under `name`, safely (the `data` filter)."""

    def keep(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
        top, sep, rest = member.name.partition("/")
        member = member.replace(name=name + sep + rest, deep=False)
        try:
            return tarfile.data_filter(member, path)
        except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
            return None

    return keep


def remove_container(container_id: str) -> None:
    """Force-remove a container (and its anonymous volumes); gone already is fine."""
    try:
        connection.client().api.remove_container(container_id, v=True, force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as error:
        # 409 "removal already in progress": the engine is removing it already (an aborted build's step
        # container, under load); gone is what we want.
        if getattr(error, "status_code", None) != 409:
            raise


def _create_stopped(image: str):
    try:
        # The command is never run; it only satisfies images without CMD or ENTRYPOINT (imported bases).
        return connection.client().containers.create(image, command=["true"], labels={CREATED_BY_LABEL: "extract"})
    except docker.errors.ImageNotFound:
        raise Failure(f"image {image} is not on this engine", rule="image-exists",
                      hint="build it with `build.py build TAG` or pull it with `build.py pull TAG`") from None
    except docker.errors.APIError as error:
        raise Failure(f"cannot create a container from {image}: {connection.error_text(error)}",
                      rule="engine-create") from None


@dataclass(frozen=True)
class RunOptions:
    """How to start a container: extra environment, the TPU VM settings (privileged, host network, shm), and the
    restricted ones (user, read-only root, tmpfs mounts, dropped capabilities, security options)."""

    environment: dict[str, str] = field(default_factory=dict)
    privileged: bool = False
    network_mode: str | None = None
    shm_size: str | None = None
    user: str | None = None
    read_only: bool = False
    tmpfs: dict[str, str] = field(default_factory=dict)  # mount point -> mount options
    cap_drop: tuple[str, ...] = ()
    security_opt: tuple[str, ...] = ()

    def create_kwargs(self) -> dict:
        """The docker SDK's `containers.create` keywords (only those set: an engine sees what it always saw)."""
        kwargs: dict = {"environment": self.environment, "privileged": self.privileged,
                        "network_mode": self.network_mode, "shm_size": self.shm_size}
        extra = {"user": self.user, "read_only": self.read_only, "tmpfs": self.tmpfs,
                 "cap_drop": list(self.cap_drop), "security_opt": list(self.security_opt)}
        return {**kwargs, **{key: value for key, value in extra.items() if value}}


@dataclass(frozen=True)
class ContainerRun:
    exit_code: int
    output: str
    seconds: float


@contextlib.contextmanager
def running_container(image: str, command: list[str], *, role: str,
                      options: RunOptions | None = None) -> Iterator[str]:
    """Start a detached container and yield its id; it is force-removed on leaving, whatever happened."""
    options = options or RunOptions()
    name = f"xla-images-{role}-{secrets.token_hex(6)}"
    try:
        container = connection.client().containers.create(
            image, command=command, name=name, labels={CREATED_BY_LABEL: role}, **options.create_kwargs())
        container.start()
        yield container.id
    except docker.errors.ImageNotFound:
        raise Failure(f"image {image} is not on this engine", rule="image-exists",
                      hint="build it with `build.py build TAG` or pull it with `build.py pull`") from None
    except docker.errors.APIError as error:
        raise Failure(f"cannot run a container of {image}: {connection.error_text(error)}", rule="engine-run") from None
    finally:
        _remove_by_name(name)


def _remove_by_name(name: str) -> None:
    try:
        remove_container(name)
    except docker.errors.APIError as error:
        # 409 "removal already in progress": someone else (a sweep) is removing it; gone is what we want.
        if getattr(error, "status_code", None) != 409:
            raise Failure(f"cannot remove container {name}: {connection.error_text(error)}",
                          rule="engine-remove") from None


def run_container(image: str, command: list[str], *, role: str, options: RunOptions | None = None,
                  timeout: float = 3600, copy_out: tuple[str, Path] | None = None,
                  on_line: connection.LineSink | None = None) -> ContainerRun:
    """Run `command` to its end in a fresh container; optionally copy a directory out before removal.

    `on_line` sees the output live, called from this thread (so it may raise, e.g. KeyboardInterrupt); the
    timeout holds either way, and the container is removed on every way out.
    """

    started = time.monotonic()
    with running_container(image, command, role=role, options=options) as container_id:
        if on_line is not None:
            output = _relay_output(container_id, image, on_line, started + timeout)
        exit_code = _wait(container_id, image, timeout - (time.monotonic() - started))
        if on_line is None:
            output = _logs(container_id)
        if copy_out is not None:
            # A command that died before writing leaves nothing to copy; the caller sees the exit code.
            copy_from_container(container_id, copy_out[0], copy_out[1], missing_ok=True)
    return ContainerRun(exit_code, output, time.monotonic() - started)


def _relay_output(container_id: str, image: str, on_line: connection.LineSink, deadline: float) -> str:
    """Follow the logs in a helper thread; hand each line to `on_line` here, until the stream ends."""

    lines: queue.Queue[str | None] = queue.Queue()

    def follow() -> None:
        try:
            for line in _follow_lines(container_id):
                lines.put(line)
        except (docker.errors.APIError, requests.exceptions.RequestException):
            pass  # the container went away (removed on timeout or interrupt): nothing more to relay
        finally:
            lines.put(None)

    threading.Thread(target=follow, name=f"logs-{container_id[:12]}", daemon=True).start()
    seen: list[str] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Failure(f"a container of {image} did not finish in time", rule="container-timeout",
                          hint="it was removed; raise the timeout or look at the command it ran")
        try:
            line = lines.get(timeout=min(remaining, 0.5))
        except queue.Empty:
            continue
        if line is None:
            return "\n".join(seen)
        seen.append(line)
        on_line(line)


def _follow_lines(container_id: str) -> Iterator[str]:
    pending = b""
    for chunk in connection.api().logs(container_id, stream=True, follow=True, stdout=True, stderr=True):
        pending += chunk
        *complete, pending = pending.split(b"\n")
        for line in complete:
            yield line.decode("utf-8", errors="replace")
    if pending:
        yield pending.decode("utf-8", errors="replace")


def _wait(container_id: str, image: str, timeout: float) -> int:
    try:
        return int(connection.api().wait(container_id, timeout=max(timeout, 1.0))["StatusCode"])
    except docker.errors.NotFound:
        raise Failure(f"the container of {image} vanished while it ran", rule="container-gone",
                      hint="something else removed it (a clean-up sweep?); run again") from None
    except (requests.exceptions.ReadTimeout, requests.exceptions.ConnectionError):
        raise Failure(f"a container of {image} did not finish within {timeout:.0f} s", rule="container-timeout",
                      hint="it was removed; raise the timeout or look at the command it ran") from None


def _logs(container_id: str) -> str:
    return connection.api().logs(container_id, stdout=True, stderr=True).decode("utf-8", errors="replace")


def copy_from_container(container_id: str, container_path: str, dest: Path, *, missing_ok: bool = False) -> Path:
    """Copy the contents of directory `container_path` into `dest` (streamed through a spooled file)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        stream, _ = connection.api().get_archive(container_id, container_path)
        with tempfile.SpooledTemporaryFile(max_size=64 << 20) as spool:
            for chunk in stream:
                spool.write(chunk)
            spool.seek(0)
            with tarfile.open(fileobj=spool, mode="r:") as tar:
                tar.extractall(dest, filter=_strip_top_filter)
    except docker.errors.NotFound:
        if missing_ok:
            return dest
        raise Failure(f"{container_path} does not exist in the container", rule="container-path-exists") from None
    except tarfile.TarError as error:
        raise Failure(f"refusing to extract {container_path}: {error}", rule="safe-extract") from None
    return dest


def _strip_top_filter(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
    """`reports/smoke.json` -> `smoke.json`; the top directory itself is dropped. Safe like the data filter."""
    _, sep, rest = member.name.partition("/")
    if not sep or not rest:
        return None
    try:
        return tarfile.data_filter(member.replace(name=rest, deep=False), path)
    except (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError):
        return None


def put_into_container(container_id: str, dest_dir: str, sources: dict[str, Path]) -> None:
    """Copy host files or directories into `dest_dir` (created), each under its key; caches skipped."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, source in sources.items():
            tar.add(source, arcname=name, filter=lambda info: None if "__pycache__" in info.name else info)
    try:
        exec_id = connection.api().exec_create(container_id, ["mkdir", "-p", dest_dir])["Id"]
        connection.api().exec_start(exec_id)
        connection.api().put_archive(container_id, dest_dir, buffer.getvalue())
    except docker.errors.APIError as error:
        raise Failure(f"cannot copy files into the container: {connection.error_text(error)}",
                      rule="container-copy") from None


def containers_created_by(role: str | None = None) -> list[str]:
    """Ids of containers (running or not) this toolkit created, optionally only of one role."""
    label = f"{CREATED_BY_LABEL}={role}" if role else CREATED_BY_LABEL
    return [item["Id"] for item in connection.api().containers(all=True, filters={"label": label})]
