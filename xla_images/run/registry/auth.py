"""Token auth as the distribution spec describes it, and basic auth where a registry asks for that.

A registry that wants credentials answers 401 with `WWW-Authenticate`. `Basic realm=...`: the request goes
again with the user and password. `Bearer realm="URL",service="...",scope="..."`: a token is fetched from the
realm (GET with service and scopes, basic-authenticated with the user and password, or anonymous; a POST
`grant_type=refresh_token` with an identity token), cached per scope set until `expires_in` runs out, and
sent as `Authorization: Bearer`. A registry token from the docker config is sent as it is.

Only the registry's own challenges reach this class (policy.py, rule 2: the client refuses one from a host it was
redirected to), so the realm that gets the credentials is always one the registry named, as with docker.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable

import requests

from ...errors import Failure
from . import answers
from .credentials import Credentials

CLIENT_ID = "xla-images"
DEFAULT_EXPIRY = 60  # seconds, what the spec says a token without `expires_in` lives
# A token is kept at most a day whatever `expires_in` says (a huge one overflowed the clock arithmetic); a
# registry that revokes it sooner answers 401 and a fresh one is fetched.
MAX_EXPIRY = 24 * 3600
_PARAM = re.compile(r'(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s,]+))')
Send = Callable[..., requests.Response]


@dataclass(frozen=True)
class Challenge:
    scheme: str  # "bearer" or "basic", lowercased
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge | None:
    """`Bearer realm="https://auth/token",service="reg",scope="repository:x:pull"` -> Challenge; None if empty."""
    scheme, _, rest = header.strip().partition(" ")
    if not scheme:
        return None
    # Each match is (name, quoted value, bare value); a quoted value may hold backslash escapes.
    params = {name.lower(): bare or re.sub(r"\\(.)", r"\1", quoted) for name, quoted, bare in _PARAM.findall(rest)}
    return Challenge(scheme.lower(), params)


@dataclass
class _Token:
    value: str
    expires: float


class Authenticator:
    """Authorization headers for one registry host, from one set of credentials (or none)."""

    def __init__(self, host: str, credentials: Credentials | None, send: Send) -> None:
        self.host = host
        self.credentials = credentials
        self._send = send
        self._tokens: dict[str, _Token] = {}
        self.scheme: str | None = None  # what the registry asked for last: "basic", "bearer", or None yet

    def header(self, scopes: tuple[str, ...]) -> str | None:
        """The Authorization header to send first, from what the registry asked before (None: try without)."""
        if self.credentials is not None and self.credentials.registry_token:
            return f"Bearer {self.credentials.registry_token}"
        if self.scheme == "basic" and self.credentials is not None and self.credentials.basic:
            return requests.auth._basic_auth_str(*self.credentials.basic)
        if self.scheme == "bearer":
            token = self._tokens.get(" ".join(scopes))
            if token is not None and token.expires > time.monotonic():
                return f"Bearer {token.value}"
        return None

    def answer(self, challenge_header: str, scopes: tuple[str, ...]) -> str | None:
        """The Authorization header that answers a 401's challenge, or None when there is nothing to try."""
        challenge = parse_challenge(challenge_header)
        if challenge is None:
            return None
        self.scheme = challenge.scheme
        if challenge.scheme == "basic":
            basic = self.credentials.basic if self.credentials else None
            return requests.auth._basic_auth_str(*basic) if basic else None
        if challenge.scheme != "bearer":
            raise Failure(f"registry {self.host} asks for {challenge.scheme} auth, which the toolkit does not speak",
                          rule="registry-auth", hint="registries use Basic or Bearer (token) auth")
        self._tokens.pop(" ".join(scopes), None)
        token = self._fetch(challenge, scopes)
        self._tokens[" ".join(scopes)] = token
        return f"Bearer {token.value}"

    def _fetch(self, challenge: Challenge, scopes: tuple[str, ...]) -> _Token:
        realm = challenge.params.get("realm", "")
        if not realm.startswith(("https://", "http://")):
            raise Failure(f"registry {self.host} asks for a token without a usable realm", rule="registry-auth",
                          hint="the registry's token auth is misconfigured (`auth.token.realm`)")
        service = challenge.params.get("service")
        wanted = list(scopes) or ([challenge.params["scope"]] if challenge.params.get("scope") else [])
        credentials = self.credentials
        if credentials is not None and credentials.identity_token:
            form = {"grant_type": "refresh_token", "refresh_token": credentials.identity_token,
                    "client_id": CLIENT_ID, "scope": " ".join(wanted), **({"service": service} if service else {})}
            response = self._send("POST", realm, {}, None, {"data": form, "stream": True})
        else:
            params = [("scope", scope) for scope in wanted] + ([("service", service)] if service else [])
            auth = credentials.basic if credentials else None
            response = self._send("GET", realm, {}, auth, {"params": params, "stream": True})
        if response.status_code in (401, 403):
            response.close()
            raise auth_refused(self.host, credentials, f"the token service refused the credentials "
                                                       f"({response.status_code})")
        if response.status_code != 200:
            response.close()
            raise Failure(f"registry {self.host}: its token service answered HTTP {response.status_code}",
                          rule="registry-auth", hint=f"the realm is {realm.split('?')[0]}")
        document = answers.json_object(answers.body(response, answers.TOKEN_LIMIT, self.host, "a token request"),
                                       self.host, "a token request")
        value = document.get("token") or document.get("access_token")
        if not isinstance(value, str) or not value or len(value) > answers.TOKEN_LIMIT:
            raise answers.refuse(self.host, "a token request", "no `token` string")
        lifetime = document.get("expires_in", DEFAULT_EXPIRY)
        if not isinstance(lifetime, int) or isinstance(lifetime, bool) or lifetime <= 0:
            lifetime = DEFAULT_EXPIRY
        # Renew a little early: a token that runs out between the check and the request costs a 401 round.
        return _Token(value, time.monotonic() + max(min(lifetime, MAX_EXPIRY) - 5, 1))


def auth_refused(host: str, credentials: Credentials | None, what: str) -> Failure:
    """401/403, naming which credential source was tried (never a secret)."""
    tried = credentials.source if credentials else "no credentials (anonymous)"
    return Failure(f"registry {host} refused {what}; credentials tried: {tried}", rule="registry-auth",
                   hint=f"check them (`docker login {host}`, a credential helper, or XLA_IMAGES_REGISTRY_USER/"
                        "XLA_IMAGES_REGISTRY_PASSWORD), and that they may read/write this repository")
