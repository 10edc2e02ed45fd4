"""Registry credentials, found where the docker CLI finds them, in its order, and never shown.

1. XLA_IMAGES_REGISTRY_USER / XLA_IMAGES_REGISTRY_PASSWORD (CI secrets), for XLA_IMAGES_REGISTRY's host or,
   when it is unset, for the registries the command names (policy, rule 4): never for another host;
2. the docker config ($DOCKER_CONFIG/config.json, else ~/.docker/config.json; a DOCKER_CONFIG that is not a
   directory is one warning, as the docker CLI gives): `credHelpers[HOST]`, a helper program
   `docker-credential-<name>` found in PATH's absolute directories (never the current directory, as Go's
   exec.LookPath), asked as the docker CLI asks (`get`, the host on stdin, JSON
   `{"Username", "Secret"}` on stdout; `<token>` as the user means the secret is an identity token);
3. its `credsStore`, the same way;
4. its inline `auths[HOST]`: `auth` (base64 of USER:PASSWORD), `username`/`password`, `identitytoken` (an
   OAuth refresh token, traded at the registry's token service) or `registrytoken` (a bearer token as is).

Nothing found is anonymous access. The docker config is read bounded and checked; a helper runs with a
timeout and a cap on what it may print; a failing one is named with its exit code and a redacted line.
Secrets go where policy.py says and to the engine only; `redact` scrubs them (and their base64 forms) from any
message.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from ... import userfiles
from ...errors import ConfigError, Failure, Location, XlaImagesError
from . import policy

USER_ENV = "XLA_IMAGES_REGISTRY_USER"
PASSWORD_ENV = "XLA_IMAGES_REGISTRY_PASSWORD"
HELPER_PREFIX = "docker-credential-"
HELPER_TIMEOUT = 30.0
HELPER_OUTPUT_LIMIT = 64 * userfiles.KIB
CONFIG_LIMIT = 4 * userfiles.MIB
IDENTITY_TOKEN_USER = "<token>"
_HELPER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
_ENTRY_FIELDS = ("auth", "username", "password", "identitytoken", "registrytoken", "email", "serveraddress")


@dataclass(frozen=True)
class Credentials:
    """A user and password, or a token; `source` says where they came from (shown), the rest never is."""

    username: str
    password: str = field(default="", repr=False)
    source: str = "environment"
    identity_token: str = field(default="", repr=False)
    registry_token: str = field(default="", repr=False)
    from_environment: bool = False

    def auth_config(self, host: str) -> dict[str, str]:
        """What the engine's push and pull take (X-Registry-Auth): the same credentials as our own calls."""
        if self.registry_token:
            return {"registrytoken": self.registry_token, "serveraddress": host}
        if self.identity_token:
            return {"identitytoken": self.identity_token, "serveraddress": host}
        return {"username": self.username, "password": self.password, "serveraddress": host}

    @property
    def basic(self) -> tuple[str, str] | None:
        return (self.username, self.password) if self.password else None

    @property
    def secrets(self) -> tuple[str, ...]:
        """Strings that must never appear in output: the secrets and the encodings they travel in."""
        pair = f"{self.username}:{self.password}".encode()
        encoded = (base64.b64encode(pair).decode(), base64.urlsafe_b64encode(pair).decode()) if self.password else ()
        return tuple(s for s in (self.password, self.identity_token, self.registry_token, *encoded) if s)

    def __repr__(self) -> str:
        return f"Credentials(username={self.username!r}, secret='***', source={self.source!r})"


def load_credentials(host: str, environ: Mapping[str, str] | None = None, docker_config: Path | None = None, *,
                     named: Iterable[str] = ()) -> Credentials | None:
    """The credentials for `host` in docker's order (see the module docstring), or None for anonymous.

    `named`: the registry hosts the command names itself (--registry, --from, --to, the site's registry); the
    environment's credentials go only to one of them, or only to XLA_IMAGES_REGISTRY's host when that is set
    (policy, rule 4). For any other host they are skipped and the docker config is asked."""
    environ = os.environ if environ is None else environ
    user, password = environ.get(USER_ENV), environ.get(PASSWORD_ENV)
    if user or password:
        if not (user and password):
            missing = PASSWORD_ENV if user else USER_ENV
            raise ConfigError(f"{missing} is not set but its partner is", rule="registry-credentials",
                              hint=f"set both {USER_ENV} and {PASSWORD_ENV}, or neither")
        if host in policy.environment_hosts(environ, named):
            return Credentials(user, password, f"the environment ({USER_ENV}/{PASSWORD_ENV})",
                               from_environment=True)
    path = docker_config or docker_config_path(environ)
    if not os.path.lexists(path):
        return None
    config = read_docker_config(path)
    helper = _helper_for(config.get("credHelpers") or {}, host)
    if helper:
        found = run_helper(helper, host, f"credHelpers in {path}", environ)
        if found is not None:
            return found
    if config.get("credsStore"):
        found = run_helper(config["credsStore"], host, f"credsStore in {path}", environ)
        if found is not None:
            return found
    return _from_auths(config.get("auths") or {}, host, path)


def docker_config_credentials(host: str, environ: Mapping[str, str] | None = None) -> Credentials | None:
    """`host`'s credentials from the docker config alone, skipping USER_ENV/PASSWORD_ENV: for a host those
    are not meant for (a pull mirror: the environment's credentials are the origin's)."""
    environ = os.environ if environ is None else environ
    return load_credentials(host, {key: value for key, value in environ.items()
                                   if key not in (USER_ENV, PASSWORD_ENV)})


def docker_config_path(environ: Mapping[str, str]) -> Path:
    directory = environ.get("DOCKER_CONFIG")
    if directory and os.path.lexists(directory) and not os.path.isdir(directory):
        # What the docker CLI does: one warning, then no config (anonymous), not a silent anonymous access.
        _warn_once(f"warning: DOCKER_CONFIG={directory} is not a directory: no docker config is read "
                   "(credHelpers, credsStore and auths are not used)")
    return Path(directory) / "config.json" if directory else Path.home() / ".docker" / "config.json"


_WARNED: set[str] = set()  # one warning per process and text: credentials are looked up once per client


def _warn_once(line: str) -> None:
    if line not in _WARNED:
        _WARNED.add(line)
        print(line, file=sys.stderr)


# --- the docker config ---------------------------------------------------------------------------------------

def read_docker_config(path: Path) -> dict[str, Any]:
    """The docker config, read bounded and checked field by field (values are secrets: never shown)."""
    text = userfiles.read_text(path, limit=CONFIG_LIMIT, missing_hint="run `docker login`, which writes it")

    def refuse(message: str, hint: str = "fix it, or let `docker login` rewrite it") -> ConfigError:
        return ConfigError(message, location=Location(str(path)), rule="docker-config", hint=hint)

    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"not JSON: {error.msg}", location=Location(str(path), error.lineno),
                          rule="docker-config", hint="fix it, or let `docker login` rewrite it") from None
    except (ValueError, RecursionError) as error:
        raise refuse(f"not JSON: {type(error).__name__}") from None
    if not isinstance(document, dict):
        raise refuse(f"the top level is a {type(document).__name__}, not an object")
    auths = document.get("auths") or {}
    if not isinstance(auths, dict):
        raise refuse(f"`auths` is a {type(auths).__name__}, not an object of registries")
    for key, entry in auths.items():
        if not isinstance(entry, dict):
            raise refuse(f"`auths[{key[:80]!r}]` is a {type(entry).__name__}, not an object")
        for name in _ENTRY_FIELDS:
            if name in entry and not isinstance(entry[name], str):
                raise refuse(f"`auths[{key[:80]!r}].{name}` is a {type(entry[name]).__name__}, not a string")
    store = document.get("credsStore")
    if store not in (None, "") and not (isinstance(store, str) and _HELPER_NAME.match(store)):
        raise refuse("`credsStore` is not a helper name (letters, digits, . _ -)",
                     hint="for example \"credsStore\": \"pass\" (runs docker-credential-pass)")
    helpers = document.get("credHelpers") or {}
    if not isinstance(helpers, dict) or not all(isinstance(name, str) and _HELPER_NAME.match(name)
                                                for name in helpers.values()):
        raise refuse("`credHelpers` is not an object of HOST: helper name",
                     hint="for example \"credHelpers\": {\"us-docker.pkg.dev\": \"gcloud\"}")
    return document


def auth_key_host(key: str) -> str:
    """`https://host:5000/v1/` -> `host:5000`, as docker login writes keys in several spellings."""
    key = re.sub(r"^[a-z]+://", "", key)
    return key.split("/", 1)[0]


def _helper_for(helpers: dict[str, str], host: str) -> str | None:
    for key, name in helpers.items():
        if auth_key_host(key) == host:
            return name
    return None


def _from_auths(auths: dict[str, dict[str, str]], host: str, path: Path) -> Credentials | None:
    for key, entry in auths.items():
        if auth_key_host(key) != host:
            continue
        source = f"`auths` in {path}"
        if entry.get("registrytoken"):
            return Credentials(entry.get("username", ""), "", source, registry_token=entry["registrytoken"])
        if entry.get("identitytoken"):
            return Credentials(entry.get("username", ""), "", source, identity_token=entry["identitytoken"])
        if entry.get("auth"):
            try:
                user, sep, password = base64.b64decode(entry["auth"], validate=True).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                sep = ""
            if not sep:
                # Never echo the value: it is a secret even when malformed.
                raise ConfigError(f"the auth entry for {host} is not base64 of USER:PASSWORD",
                                  location=Location(str(path)), rule="docker-config",
                                  hint=f"run `docker login {host}` again")
            return Credentials(user, password, source)
        if entry.get("username") and entry.get("password"):
            return Credentials(entry["username"], entry["password"], source)
    return None


# --- credential helpers --------------------------------------------------------------------------------------

def run_helper(name: str, host: str, configured: str, environ: Mapping[str, str] | None = None) -> Credentials | None:
    """Ask `docker-credential-<name>` for `host`'s credentials, as the docker CLI does; None when it has none."""
    program = HELPER_PREFIX + name
    source = f"credential helper {program} ({configured})"
    environ = os.environ if environ is None else environ
    search = environ.get("PATH", os.defpath)
    executable = find_program(program, search)
    if executable is None:
        skipped = " (PATH's empty and relative elements, the current directory, are not searched)" \
            if any(not os.path.isabs(part) for part in search.split(os.pathsep)) else ""
        raise ConfigError(f"{program} is not on PATH{skipped}", rule="registry-credentials",
                          location=Location(configured),
                          hint=f"install the helper {configured} names (gcloud, docker-credential-ecr-login, pass "
                               "...) in a directory PATH names by its absolute path, or remove that entry from the "
                               "docker config")
    code, out, err = bounded_run([executable, "get"], host.encode(), HELPER_TIMEOUT, HELPER_OUTPUT_LIMIT, program)
    if code != 0:
        said = (err or out).decode("utf-8", "replace").strip()
        if "credentials not found" in said.lower():
            return None
        raise Failure(f"{program} ({executable}) get failed with exit {code}: {redacted_line(said)}",
                      rule="registry-credentials", hint=f"run `echo {host} | {program} get` to see why ({configured})")
    try:
        answer = json.loads(out.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        answer = None
    if not (isinstance(answer, dict) and isinstance(answer.get("Username", ""), str)
            and isinstance(answer.get("Secret"), str)):
        raise Failure(f"{program} answered something that is not {{\"Username\": ..., \"Secret\": ...}}",
                      rule="registry-answer", hint=f"check the helper ({configured})")
    user, secret = answer.get("Username", ""), answer["Secret"]
    if not secret:
        return None
    if user == IDENTITY_TOKEN_USER:
        return Credentials("", "", source, identity_token=secret)
    return Credentials(user, secret, source)


def find_program(program: str, search: str) -> str | None:
    """`program` in the absolute directories of `search` (a PATH), as Go's exec.LookPath finds a helper for the
    docker CLI since Go 1.19: an empty or relative element (the current directory) never supplies the program.
    (Go then fails with ErrDot; we skip the element, so a helper later on PATH is still found.)"""
    for directory in search.split(os.pathsep):
        if not os.path.isabs(directory):
            continue
        candidate = os.path.join(directory, program)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


# Whatever may be a secret in a helper's words: a JSON answer, `password=...`-like pairs, and any word of 4 or
# more characters that is not plain lowercase prose (a digit, a base64 sign, a capital past the first letter):
# a failing helper may have printed the secret it was asked for, and `hunter2` is as secret as a token.
_SECRET_PAIR = re.compile(r"(?i)\b(password|passwd|secret|token|auth|pw)(\s*[=:]\s*)\S+")
_TOKEN_LIKE = re.compile(r"[A-Za-z0-9+/=_.~-]{4,}")


def redacted_line(said: str) -> str:
    """The first line of what a failing helper said, with anything that may be a secret replaced by ***."""
    line = next((part.strip() for part in said.splitlines() if part.strip()), "")
    if not line:
        return "it printed nothing"
    if "{" in line or '"Secret"' in said:
        return "(its output is not shown: it may hold the secret)"
    line = _SECRET_PAIR.sub(lambda match: f"{match[1]}{match[2]}***", line[:160])
    return _TOKEN_LIKE.sub(lambda match: "***" if _may_be_secret(match[0]) else match[0], line)


def _may_be_secret(word: str) -> bool:
    """A word with a digit, a base64 sign or a capital past its first letter; `docker-credential-pass`,
    `keychain`, `Credentials` are not (over-redacting `HTTP` is the price of never showing `S3CRET`)."""
    return bool(re.search(r"[0-9+/=_~]", word)) or any(c.isupper() for c in word[1:])


def bounded_run(command: list[str], stdin: bytes, timeout: float, limit: int, what: str) -> tuple[int, bytes, bytes]:
    """Run `command` feeding `stdin`; its exit code, stdout and stderr. Killed past `timeout` s or `limit` bytes."""
    try:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as error:
        raise Failure(f"cannot run {what}: {error.strerror}", rule="registry-credentials") from None
    assert process.stdin and process.stdout and process.stderr
    out_fd, err_fd = process.stdout.fileno(), process.stderr.fileno()
    outputs: dict[int, bytearray] = {out_fd: bytearray(), err_fd: bytearray()}
    try:
        with contextlib.suppress(BrokenPipeError):
            process.stdin.write(stdin)
            process.stdin.close()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:
            for stream in (process.stdout, process.stderr):
                selector.register(stream, selectors.EVENT_READ)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Failure(f"{what} did not answer within {timeout:.0f} s", rule="registry-credentials",
                                  hint="is it waiting for a password prompt or a locked keyring?")
                for key, _ in selector.select(remaining):
                    data = os.read(key.fd, 65536)
                    if not data:
                        selector.unregister(key.fileobj)
                        continue
                    outputs[key.fd] += data
                    if len(outputs[key.fd]) > limit:
                        raise Failure(f"{what} printed more than {limit} bytes", rule="registry-answer",
                                      hint="a credential helper prints one small JSON object")
        code = process.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        raise Failure(f"{what} did not exit within {timeout:.0f} s", rule="registry-credentials") from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    return code, bytes(outputs[out_fd]), bytes(outputs[err_fd])


# --- keeping secrets out of messages -------------------------------------------------------------------------

def redact(text: str, credentials: Credentials | None) -> str:
    if credentials is None:
        return text
    for secret in credentials.secrets:
        text = text.replace(secret, "***")
    return text


@contextlib.contextmanager
def redacting(*credentials: Credentials | None) -> Iterator[None]:
    """Scrub secrets out of any error raised inside (engine and registry messages may quote requests)."""
    try:
        yield
    except XlaImagesError as error:
        for each in credentials:
            error.message = redact(error.message, each)
            error.hint = redact(error.hint, each) if error.hint else error.hint
        error.args = (error.message,)
        raise
