"""Registry access: everything the toolkit asks a registry itself, done the way the engine does it.

* `tls`: which scheme and certificates a host gets (system store, REQUESTS_CA_BUNDLE, certs.d CAs and client
  certificates, daemon.json `insecure-registries`);
* `credentials`: credentials in docker's order (environment, credHelpers, credsStore, auths) and redaction;
* `auth`: the 401 challenge answered with basic auth or a bearer token (scopes, expiry);
* `client`: the HTTP API v2 with retries; `answers`: what a registry answers, checked; `errors`: the rules.

`connect` is the one place a client is made: push, verify, resolve, pull, promote, prune and sign call it.
"""
from __future__ import annotations

from ...model.registry import Registry
from .answers import is_digest
from .client import MANIFEST_MEDIA_TYPES, RETRIED_STATUSES, RegistryClient, RetryPolicy
from .credentials import (PASSWORD_ENV, USER_ENV, Credentials, docker_config_credentials, load_credentials, redact,
                          redacting)
from .errors import RegistryDown
from .tls import Trust, load_trust

__all__ = ["MANIFEST_MEDIA_TYPES", "PASSWORD_ENV", "RETRIED_STATUSES", "USER_ENV", "Credentials", "RegistryClient",
           "RegistryDown", "RetryPolicy", "Trust", "connect", "docker_config_credentials", "is_digest",
           "load_credentials", "load_trust", "redact", "redacting"]

# What each command needs of a repository: the scopes a token is asked for (a token service grants no more).
READ = "pull"
WRITE = "pull,push"
DELETE = "pull,push,delete"


def connect(registry: Registry, actions: str = READ, *, also_read: Registry | None = None,
            retry: RetryPolicy | None = None, docker_config_only: bool = False) -> RegistryClient:
    """A client for `registry` with the credentials docker would use for its host and the engine's trust.

    `also_read` adds a pull scope on another repository of the same host (promote's cross-repository mount).
    `docker_config_only` skips XLA_IMAGES_REGISTRY_USER/_PASSWORD (a pull mirror is not the registry they name).
    """
    extra = (f"repository:{also_read.repository}:{READ}",) if also_read is not None else ()
    credentials = (docker_config_credentials if docker_config_only else load_credentials)(registry.host)
    return RegistryClient(registry, credentials, actions=actions, extra_scopes=extra,
                          trust=load_trust(registry.host), retry=retry)
