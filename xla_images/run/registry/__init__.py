"""Registry access: everything the toolkit asks a registry itself, done the way the engine does it.

* `tls`: which scheme and certificates a host gets (system store, REQUESTS_CA_BUNDLE, certs.d CAs and client
  certificates, daemon.json `insecure-registries`);
* `credentials`: credentials in docker's order (environment, credHelpers, credsStore, auths) and redaction;
* `auth`: the 401 challenge answered with basic auth or a bearer token (scopes, expiry);
* `policy`: which credential may go to which host (the registry's origin, its challenge's realm; redirects);
* `client`: the HTTP API v2 with retries; `answers`: what a registry answers, checked; `errors`: the rules.

`connect` is the one place a client is made: push, verify, resolve, pull, promote, prune and sign call it.
"""
from __future__ import annotations

from typing import Iterable

from ...model.registry import Registry
from .answers import is_digest
from .client import MANIFEST_MEDIA_TYPES, RETRIED_STATUSES, RegistryClient, RetryPolicy
from .credentials import (PASSWORD_ENV, USER_ENV, Credentials, docker_config_credentials, load_credentials, redact,
                          redacting)
from .errors import RegistryDown
from .tls import Trust, load_trust

__all__ = ["MANIFEST_MEDIA_TYPES", "PASSWORD_ENV", "RETRIED_STATUSES", "USER_ENV", "Credentials", "RegistryClient",
           "RegistryDown", "RetryPolicy", "Trust", "connect", "docker_config_credentials", "is_digest",
           "load_credentials", "load_trust", "named_hosts", "redact", "redacting"]

# What each command needs of a repository: the scopes a token is asked for (a token service grants no more).
READ = "pull"
WRITE = "pull,push"
DELETE = "pull,push,delete"


def connect(registry: Registry, actions: str = READ, *, named: Iterable[str] = (), also_read: Registry | None = None,
            retry: RetryPolicy | None = None, docker_config_only: bool = False) -> RegistryClient:
    """A client for `registry` with the credentials docker would use for its host and the engine's trust.

    `named`: the registry hosts the command names itself (--registry, --from, --to, the site's registry): the
    environment's credentials go to `registry` only when its host is one of them, or is XLA_IMAGES_REGISTRY's
    (policy, rule 4) — a host only published.json names gets the docker config's credentials for it, or none.
    `also_read` adds a pull scope on another repository of the same host (promote's cross-repository mount).
    `docker_config_only` skips XLA_IMAGES_REGISTRY_USER/_PASSWORD (a pull mirror is not the registry they name).
    """
    extra = (f"repository:{also_read.repository}:{READ}",) if also_read is not None else ()
    credentials = (docker_config_credentials(registry.host) if docker_config_only
                   else load_credentials(registry.host, named=named))
    return RegistryClient(registry, credentials, actions=actions, extra_scopes=extra,
                          trust=load_trust(registry.host), retry=retry)


def named_hosts(*texts: str | None) -> tuple[str, ...]:
    """The hosts of the registries a command names (`HOST[:PORT]/REPO` texts, None skipped): `named` above."""
    return tuple(text.strip().partition("/")[0] for text in texts if text)
