"""The classic builder through the SDK: streamed builds another thread may abort, and plain directory builds."""
from __future__ import annotations

import contextlib
import re
import socket
import threading
from pathlib import Path

import docker
import docker.errors
import requests
import urllib3

from ...errors import Failure
from . import builds, connection


_STEP_IMAGE = re.compile(r"^ ---> ([0-9a-f]{12})$")
_STEP_CONTAINER = re.compile(r"^ ---> Running in ([0-9a-f]{12})$")


class StreamingBuild:
    """One classic-builder build whose output is streamed, and which another thread may abort.

    Aborting shuts the build's connection down: the engine then cancels the build and kills and removes the
    container of the step in progress. Each build has its own connection, so aborting one never touches
    another.
    """

    def __init__(self, context: Path, buildargs: dict[str, str], labels: dict[str, str] | None = None,
                 target: str | None = None, no_cache: bool = False) -> None:
        self.context = Path(context)
        self.buildargs = dict(buildargs)
        self.labels = dict(labels or {})
        self.target = target
        self.no_cache = no_cache
        self.trace = builds.BuildTrace()
        self._aborted = threading.Event()
        self._responses: list[requests.Response] = []
        self._lock = threading.Lock()

    def run(self, on_line: connection.LineSink) -> str:
        """Build untagged; return the image id. Raises Failure on a failed step, BuildAborted if aborted."""
        own = docker.from_env(version=connection.api().api_version, timeout=None).api
        own.hooks["response"].append(self._remember)
        try:
            events = own.build(path=str(self.context), buildargs=self.buildargs, labels=self.labels, rm=True,
                               forcerm=True, decode=True, pull=False, target=self.target,
                               nocache=self.no_cache)
            if self._aborted.is_set():
                self._disconnect()
            for event in events:
                self._handle(event, on_line)
        except Exception as error:
            if self._aborted.is_set():
                raise builds.BuildAborted() from None  # whatever the cut connection raised
            if isinstance(error, (docker.errors.APIError, requests.exceptions.RequestException,
                                  urllib3.exceptions.HTTPError, OSError)):
                raise Failure(f"the engine failed the build: {connection.error_text(error)}", rule="build") from None
            raise
        finally:
            own.close()
        if self._aborted.is_set():
            raise builds.BuildAborted()
        if not self.trace.image_id:
            raise Failure("the build ended without an image (the engine closed the stream)", rule="build")
        return self.trace.image_id

    def abort(self) -> None:
        self._aborted.set()
        self._disconnect()

    def _remember(self, response: requests.Response, *args, **kwargs) -> None:
        with self._lock:
            self._responses.append(response)

    def _disconnect(self) -> None:
        with self._lock:
            responses = list(self._responses)
        for response in responses:
            # shutdown() (unlike close()) wakes the thread blocked reading this socket.
            sock = getattr(getattr(response.raw, "connection", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _handle(self, event: dict, on_line: connection.LineSink) -> None:
        if "error" in event:
            raise Failure(str(event["error"]).strip(), rule="build")
        aux = event.get("aux") or {}
        if aux.get("ID"):
            self.trace.image_id = str(aux["ID"])
        text = event.get("stream")
        if not text:
            return
        for line in text.splitlines():
            self._note(line)
            if line.strip():
                on_line(line)

    def _note(self, line: str) -> None:
        found = _STEP_CONTAINER.match(line)
        if found:
            self.trace.containers.append(found.group(1))
            return
        found = _STEP_IMAGE.match(line)
        if found:
            self.trace.images.append(found.group(1))


def build_directory(context: Path, tag: str, buildargs: dict[str, str] | None = None,
                    on_line: connection.LineSink | None = None) -> str:
    """Build a plain Dockerfile directory (examples, test images) with the classic builder; return the id."""
    image_id = None
    try:
        for event in connection.api().build(path=str(context), tag=tag, buildargs=buildargs or {}, rm=True,
                                 forcerm=True, decode=True):
            if "error" in event:
                raise Failure(f"building {context} failed: {event['error'].strip()}", rule="build")
            if "stream" in event and on_line is not None:
                text = event["stream"].rstrip("\n")
                if text:
                    on_line(text)
            image_id = (event.get("aux") or {}).get("ID", image_id)
    except docker.errors.APIError as error:
        raise Failure(f"building {context} failed: {connection.error_text(error)}", rule="build") from None
    if not image_id:
        raise Failure(f"building {context} reported no image", rule="build")
    return str(image_id)
