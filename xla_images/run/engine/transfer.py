"""Images to and from registries through the engine: push (with per-layer upload status) and pull."""
from __future__ import annotations

import docker
import docker.errors
import requests

from ...errors import Failure
from . import connection, images


# Push progress statuses: the engine HEADs each blob first and uploads only what the registry lacks.
PUSH_UPLOADED = "Pushed"
PUSH_PRESENT = ("Layer already exists", "Mounted from")


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
            if on_line is not None and event.get("status") and not event.get("progressDetail"):
                on_line(f"  {event.get('id', '')} {event['status']}".rstrip())
    except (docker.errors.APIError, requests.exceptions.ConnectionError) as error:
        raise Failure(f"push of {repository}:{tag} failed: {connection.error_text(error)}", rule="push",
                      hint=_registry_hint(repository)) from None
    if not digest:
        raise Failure(f"the engine reported no digest for {repository}:{tag}", rule="push")
    return digest


def pull_image(ref: str, auth_config: dict | None, on_line: connection.LineSink | None = None) -> str:
    """Pull `ref` (a tag or `@sha256:` digest reference); return the local image id."""
    try:
        for event in connection.api().pull(ref, stream=True, decode=True, auth_config=auth_config):
            if "error" in event:
                raise Failure(f"pull of {ref} failed: {event['error'].strip()}", rule="pull",
                              hint=_registry_hint(ref))
            if on_line is not None and event.get("status") and not event.get("progressDetail"):
                on_line(f"  {event.get('id', '')} {event['status']}".rstrip())
    except (docker.errors.APIError, requests.exceptions.ConnectionError) as error:
        raise Failure(f"pull of {ref} failed: {connection.error_text(error)}",
                      rule="pull", hint=_registry_hint(ref)) from None
    attrs = images.image_inspect(ref)
    if attrs is None:
        raise Failure(f"{ref} is not on the engine after its pull", rule="pull")
    return str(attrs["Id"])


def _registry_hint(ref: str) -> str:
    host = ref.split("/", 1)[0]
    return (f"is the registry {host} up? (`ci/registry.sh start` for the suite registry); "
            "credentials come from XLA_IMAGES_REGISTRY_USER/_PASSWORD or `docker login`")
