"""What went wrong talking to a registry, each kind under its own rule, never with a secret in it.

Rules: `registry-tls` (the certificate was not trusted, or the registry wants a client certificate),
`registry-dns` (the name does not resolve), `registry-reachable` (refused, reset or timed out: retried first),
`registry-auth` (401/403, naming the credential source tried), `registry-answer` (the registry or a credential
helper answered something that is not what the protocol says), `registry-request` (any other HTTP error).
"""
from __future__ import annotations

import ssl

import requests

from ...errors import Failure
from ...model.registry import is_loopback

SUITE_REGISTRY_HINT = "start the suite registry with `ci/registry.sh start`"
CERTS_D_DEFAULT = "/etc/docker/certs.d"


class RegistryDown(Exception):
    """Connection refused, reset or timed out: worth retrying, then a Failure naming the registry."""


def unreachable_hint(host: str) -> str:
    """A loopback registry is most likely the suite's, not started; a remote one is named as it is."""
    if is_loopback(host):
        return f"{SUITE_REGISTRY_HINT}, or pass the right --registry HOST[:PORT]/REPO"
    return f"check that {host} is up and reachable from here (firewall, VPN, proxy), or pass the right --registry"


def _root_cause(error: BaseException) -> BaseException:
    """The innermost exception requests/urllib3 wrapped (SSL and socket errors sit several levels down)."""
    seen: set[int] = set()
    current: BaseException = error
    while id(current) not in seen:
        seen.add(id(current))
        inner = getattr(current, "reason", None) or current.__cause__ or current.__context__
        if inner is None and current.args and isinstance(current.args[0], BaseException):
            inner = current.args[0]
        if not isinstance(inner, BaseException):
            break
        current = inner
    return current


def classify(error: requests.RequestException, host: str, trust_description: str, certs_dir: str) -> Exception:
    """A requests error as a Failure with its own rule, or RegistryDown when a retry may help."""
    cause = _root_cause(error)
    text = f"{error} {cause}".lower()
    if isinstance(error, requests.exceptions.SSLError) or isinstance(cause, ssl.SSLError):
        return tls_failure(host, cause, trust_description, certs_dir)
    if any(needle in text for needle in ("name or service not known", "temporary failure in name resolution",
                                         "nodename nor servname", "no address associated", "nameresolutionerror",
                                         "failed to resolve")):
        return Failure(f"registry {host}: its name does not resolve (DNS)", rule="registry-dns",
                       hint=f"check the spelling of {host.rsplit(':', 1)[0]}, /etc/hosts and the DNS servers")
    for reason in ("connection refused", "connection reset", "timed out", "no route to host",
                   "remote end closed connection"):
        if reason in text:
            return RegistryDown(reason)
    if isinstance(error, (requests.ConnectionError, requests.Timeout)):
        return RegistryDown(type(cause).__name__)
    return Failure(f"registry {host}: {type(error).__name__}", rule="registry-request", hint=unreachable_hint(host))


def tls_failure(host: str, cause: BaseException, trust_description: str, certs_dir: str) -> Failure:
    """TLS failed: which CAs were tried and which file would fix it."""
    fix_dir = f"{certs_dir}/{host}"
    if isinstance(cause, ssl.SSLCertVerificationError):
        reason = cause.verify_message or "certificate verify failed"
        return Failure(f"registry {host}: TLS verification failed ({reason}); trusted: {trust_description}",
                       rule="registry-tls",
                       hint=f"put the CA that signed the registry's certificate in {fix_dir}/ca.crt (the engine "
                            "reads the same file), or add it to the bundle SSL_CERT_FILE / REQUESTS_CA_BUNDLE names")
    text = str(cause).lower()
    if "certificate required" in text or "bad certificate" in text or "handshake failure" in text:
        return Failure(f"registry {host}: TLS handshake refused, it asks for a client certificate "
                       f"({type(cause).__name__})", rule="registry-tls",
                       hint=f"put the client certificate and key in {fix_dir}/client.cert and {fix_dir}/client.key")
    if "wrong version number" in text or "record layer failure" in text:
        return Failure(f"registry {host} does not speak TLS on that port", rule="registry-tls",
                       hint="a plain-http registry on a non-loopback host must be listed in the engine's "
                            "daemon.json `insecure-registries`")
    return Failure(f"registry {host}: TLS failed ({type(cause).__name__}: {str(cause)[:120]})", rule="registry-tls",
                   hint=f"trusted: {trust_description}; certificates go in {fix_dir}/")
