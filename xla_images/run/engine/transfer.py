"""Images to and from registries through the engine: push (with per-layer upload status) and pull (with a
stall watchdog)."""
from __future__ import annotations

import re
import socket

import docker
import docker.auth
import docker.errors
import docker.utils
import requests
import urllib3

from ... import settings
from ...errors import Failure
from ...model.registry import Registry
from . import connection, images


# Push progress statuses: the engine HEADs each blob first and uploads only what the registry lacks.
PUSH_UPLOADED = "Pushed"
PUSH_PRESENT = ("Layer already exists", "Mounted from")
# The classic store reports the pushed manifest's digest in an `aux` event; the containerd store (dockerd 26)
# only in the closing status line, `TAG: digest: sha256:... size: N`.
_PUSHED_DIGEST = re.compile(r"\bdigest: (sha256:[0-9a-f]{64}) size: \d+")


def push_image(repository: str, tag: str, auth_config: dict | None, on_line: connection.LineSink | None = None,
               layer_status: dict[str, str] | None = None) -> str:
    """Push `repository:tag`; return the manifest digest the engine reports. Errors become Failures.

    `layer_status`, when given, receives per layer (the first 12 hex of its diff id, as the engine names it)
    `uploaded` or `present`: what the registry already had by digest was not sent again.
    """
    digest = None
    try:
        for event in connection.api().push(repository, tag=tag, stream=True, decode=True, auth_config=auth_config):
            if "error" in event:
                raise Failure(f"push of {repository}:{tag} failed: {event['error'].strip()}", rule="push",
                              hint=_registry_hint(repository))
            status = str(event.get("status") or "")
            if layer_status is not None and event.get("id"):
                if status == PUSH_UPLOADED:
                    layer_status[str(event["id"])] = "uploaded"
                elif status.startswith(PUSH_PRESENT):
                    layer_status[str(event["id"])] = "present"
            digest = (event.get("aux") or {}).get("Digest", digest)
            if found := _PUSHED_DIGEST.search(status):
                digest = digest or found.group(1)
            if on_line is not None and event.get("status") and not event.get("progressDetail"):
                on_line(f"  {event.get('id', '')} {event['status']}".rstrip())
    except (docker.errors.APIError, requests.exceptions.ConnectionError) as error:
        raise Failure(f"push of {repository}:{tag} failed: {connection.error_text(error)}", rule="push",
                      hint=_registry_hint(repository)) from None
    if not digest:
        raise Failure(f"the engine reported no digest for {repository}:{tag}", rule="push")
    return digest


# A pull whose engine sends nothing for this long is stalled: seen with dockerd 26 after a layer download was
# reset half-way, where it logged nothing for five minutes and never retried. Progress events arrive several
# times a second while anything downloads or extracts, so minutes of silence mean nothing will come.
PULL_STALL_ENV = settings.PULL_STALL.env[0]
PULL_STALL_SECONDS = settings.PULL_STALL_SECONDS
PULL_ATTEMPTS = 3


class _PullStalled(Exception):
    pass


def pull_stall_seconds() -> float:
    """The stall limit: $XLA_IMAGES_PULL_STALL_SECONDS, else PULL_STALL_SECONDS; bad values are a Failure
    (read by settings.read_pull_stall, where the setting is declared)."""
    return settings.read_pull_stall()


def pull_image(ref: str, auth_config: dict | None, on_line: connection.LineSink | None = None, *,
               stall_seconds: float | None = None, attempts: int = PULL_ATTEMPTS) -> str:
    """Pull `ref` (a tag or `@sha256:` digest reference); return the local image id.

    A stall watchdog bounds the pull: when the engine reports no progress for `stall_seconds` (default
    `pull_stall_seconds()`), the request is closed — which makes the engine cancel that pull and drop what it
    had half-downloaded — and the pull starts again, up to `attempts` times; then a Failure (rule `pull-stall`).
    Nothing is tagged by a pull that did not finish.
    """
    stall = stall_seconds if stall_seconds is not None else pull_stall_seconds()
    say = on_line or (lambda _line: None)
    for attempt in range(1, attempts + 1):
        try:
            _pull_once(ref, auth_config, say, stall)
            break
        except _PullStalled:
            if attempt == attempts:
                raise Failure(f"pull of {ref} stalled: the engine reported no progress for {stall:.0f} s, "
                              f"{attempts} times", rule="pull-stall",
                              hint=f"{_registry_hint(ref)}; {PULL_STALL_ENV} sets the limit") from None
            say(f"  no progress for {stall:.0f} s: pulling {ref} again (attempt {attempt + 1} of {attempts})")
    attrs = images.image_inspect(ref)
    if attrs is None:
        raise Failure(f"{ref} is not on the engine after its pull", rule="pull")
    return str(attrs["Id"])


def _pull_once(ref: str, auth_config: dict | None, say: connection.LineSink, stall: float) -> None:
    """One `POST /images/create`, read with a per-read timeout of `stall` seconds.

    The SDK's `pull` sends its request with no timeout at all, so a silent engine would block it forever;
    this is the same request with a read timeout, and the response is closed on any way out.
    """
    client = connection.api()
    repository, tag = docker.utils.parse_repository_tag(ref)  # a digest comes back as the tag, as dockerd wants
    params = {"fromImage": repository, "tag": tag or "latest"}
    headers = {"X-Registry-Auth": docker.auth.encode_header(auth_config)} if auth_config else {}
    try:
        response = client._post(client._url("/images/create"), params=params, headers=headers, stream=True,
                                timeout=stall)
    except requests.exceptions.Timeout:
        raise _PullStalled() from None
    except requests.exceptions.ConnectionError as error:
        raise Failure(f"pull of {ref} failed: {connection.error_text(error)}", rule="pull",
                      hint=_registry_hint(ref)) from None
    try:
        client._raise_for_status(response)
        for event in client._stream_helper(response, decode=True):
            if "error" in event:
                raise Failure(f"pull of {ref} failed: {event['error'].strip()}", rule="pull",
                              hint=_registry_hint(ref))
            if event.get("status") and not event.get("progressDetail"):
                say(f"  {event.get('id', '')} {event['status']}".rstrip())
    except (TimeoutError, socket.timeout, urllib3.exceptions.ReadTimeoutError, requests.exceptions.Timeout):
        raise _PullStalled() from None
    except requests.exceptions.ConnectionError as error:
        if isinstance(error.args[0] if error.args else None, urllib3.exceptions.ReadTimeoutError):
            raise _PullStalled() from None
        raise Failure(f"pull of {ref} failed: {connection.error_text(error)}", rule="pull",
                      hint=_registry_hint(ref)) from None
    except docker.errors.APIError as error:
        raise Failure(f"pull of {ref} failed: {connection.error_text(error)}", rule="pull",
                      hint=_registry_hint(ref)) from None
    finally:
        response.close()


def _registry_hint(ref: str) -> str:
    host = ref.split("/", 1)[0]
    # The suite registry is a loopback one; a remote host gets no hint about a script it does not run.
    where = ("`ci/registry.sh start` for the suite registry" if Registry(host, "_").base_url.startswith("http://")
             else f"its CA belongs in /etc/docker/certs.d/{host}/ca.crt")
    return (f"is the registry {host} up? ({where}); credentials come from XLA_IMAGES_REGISTRY_USER/_PASSWORD, "
            "the docker config's credential helpers or `docker login`")
