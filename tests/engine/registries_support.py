"""Registries as users have them, for the engine suite: real docker-registry (distribution 2.8) processes on
loopback under a DNS name that is not loopback-looking (an /etc/hosts line), so the engine and the toolkit take
the https path, with:

* TLS from a CA generated here with openssl (SAN = the name), the CA in `/etc/docker/certs.d/NAME:PORT/ca.crt`
  where dockerd reads it per request (no restart);
* `auth.htpasswd` (bcrypt), or `auth.token` whose realm is `TokenServer` (the kit's recording host, issuing RS256 JWTs
  with an x5c chain the registry checks against the `rootcertbundle` given to it: signature, issuer, service,
  expiry and the granted scopes), or a client-certificate registry (`http.tls.clientcas`);
* a credential helper `docker-credential-xlatest` (a shell script in a temp dir) for credsStore/credHelpers;
* `session_pki` (the CA, the name and its hosts line, for a module's `pki` fixture) and `Client` (`build.py`
  run with a user's docker config, helper and trust), for every engine test that needs a TLS registry.

Everything created here is removed by the fixtures' finalizers: processes by pid, the hosts line, certs.d dirs.
"""
from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator
from urllib.parse import parse_qs, urlsplit

import pytest
import requests

from registry_process import REPO, free_port
from support.host import Answer, Host, Seen, forward

HOSTS = Path("/etc/hosts")
ENGINE_CERTS_D = Path("/etc/docker/certs.d")
SYSTEM_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
HELPER_NAME = "xlatest"
KEY_PASSWORD = "key-" + os.urandom(8).hex()  # the cosign key's, for the signing steps of a Client


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@dataclass
class Pki:
    """A CA, a server certificate for `name`, a client certificate, and a JWT signing certificate."""

    directory: Path
    name: str

    def make(self) -> "Pki":
        d = self.directory
        d.mkdir(parents=True, exist_ok=True)
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
                "-subj", "/CN=xla-images test CA", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
        for leaf, usage, subject in (("server", "serverAuth", self.name), ("client", "clientAuth", "xla-client")):
            (d / f"{leaf}.ext").write_text(f"subjectAltName=DNS:{self.name}\nextendedKeyUsage={usage}\n"
                                           "basicConstraints=CA:FALSE\n")
            openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{leaf}.key", "-out", f"{leaf}.csr",
                    "-subj", f"/CN={subject}", cwd=d)
            openssl("x509", "-req", "-in", f"{leaf}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                    "-out", f"{leaf}.crt", "-days", "2", "-extfile", f"{leaf}.ext", cwd=d)
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "token.key", "-out", "token.crt",
                "-days", "2", "-subj", "/CN=xla-images test token issuer", cwd=d)
        return self

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    def token_cert_der_b64(self) -> str:
        pem = (self.directory / "token.crt").read_text()
        body = "".join(line for line in pem.splitlines() if "-----" not in line)
        return body  # base64 of the DER, as x5c wants it (standard base64, not url-safe)


# --- /etc/hosts and certs.d ----------------------------------------------------------------------------------

@contextlib.contextmanager
def session_pki(tmp_path_factory: pytest.TempPathFactory, who: str) -> Iterator[Pki]:
    """A CA and a server certificate for this session's registry name, the name in /etc/hosts while it lasts.
    Root only (the hosts file and the engine's certs.d are root's): without root, a failure in CI, else a skip."""
    if os.geteuid() != 0:
        message = f"{who} edit /etc/hosts and /etc/docker/certs.d: root is needed"
        pytest.fail(message) if os.environ.get("CI", "").lower() in ("1", "true", "yes") else pytest.skip(message)
    name = session_name()
    made = Pki(tmp_path_factory.mktemp("pki"), name).make()
    add_host(name)
    try:
        yield made
    finally:
        remove_host(name)


def pki_fixture(who: str):  # type: ignore[no-untyped-def]
    """A module's `pki` fixture: `pki = support.pki_fixture("the ... tests")` (`who` names it in the skip)."""
    @pytest.fixture(scope="module")
    def pki(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pki]:
        with session_pki(tmp_path_factory, who) as made:
            yield made
    return pki


def session_name() -> str:
    """A registry name of this session: resolvable only through the hosts line added for it."""
    return f"xla-reg-{uuid.uuid4().hex[:10]}.internal"


def add_host(name: str) -> None:
    _edit_hosts(lambda lines: lines + [f"127.0.0.1 {name}  # xla-images registries test"])


def remove_host(name: str) -> None:
    _edit_hosts(lambda lines: [line for line in lines if name not in line.split("#")[0].split()])


def _edit_hosts(change) -> None:  # type: ignore[no-untyped-def]
    # In place (the file may be a bind mount: no rename), under a lock against our own parallel edits.
    with HOSTS.open("r+", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        lines = handle.read().splitlines()
        handle.seek(0)
        handle.write("\n".join(change(lines)) + "\n")
        handle.truncate()


def place_engine_certs(host: str, pki: Pki, *, client: bool = False) -> Path:
    directory = ENGINE_CERTS_D / host
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ca.crt").write_bytes(pki.ca.read_bytes())
    if client:
        (directory / "client.cert").write_bytes((pki.directory / "client.crt").read_bytes())
        (directory / "client.key").write_bytes((pki.directory / "client.key").read_bytes())
    return directory


def remove_engine_certs(directory: Path) -> None:
    for child in directory.iterdir():
        child.unlink()
    directory.rmdir()
    try:
        ENGINE_CERTS_D.rmdir()  # only when no one else placed a directory there
    except OSError:
        pass


# --- the token service ---------------------------------------------------------------------------------------

SERVICE = "xla-test-registry"
ISSUER = "xla-test-issuer"


class TokenServer(Host):
    """The realm of a token-auth registry, on the kit's recording host: checks basic credentials (or a refresh
    token), issues RS256 JWTs; `issued` and `refused` count its answers, `seen` holds every request."""

    def __init__(self, pki: Pki, users: dict[str, str], identity_tokens: set[str], lifetime: int = 300) -> None:
        super().__init__("127.0.0.1")
        self.pki, self.users, self.identity_tokens, self.lifetime = pki, users, identity_tokens, lifetime
        self.issued = 0
        self.refused = 0

    @property
    def realm(self) -> str:
        return f"{self.url}/token"

    def answer(self, seen: Seen) -> Answer:
        if seen.method == "POST":  # an identity token (docker's refresh token) traded for an access token
            form = parse_qs(seen.body.decode())
            if form.get("grant_type") != ["refresh_token"] or \
                    (form.get("refresh_token") or [""])[0] not in self.identity_tokens:
                return self._refuse("bad refresh token")
            return self._issue(" ".join(form.get("scope", [])).split(), "token-user")
        header = seen.authorization or ""
        user = None
        if header.startswith("Basic "):
            name, _, password = base64.b64decode(header[6:]).decode().partition(":")
            user = name if self.users.get(name) == password else None
            if user is None:
                return self._refuse("bad credentials")
        return self._issue(parse_qs(urlsplit(seen.path).query).get("scope", []), user)

    def _refuse(self, details: str) -> Answer:
        self.refused += 1
        return 401, {"Content-Type": "application/json"}, json.dumps({"details": details}).encode()

    def _issue(self, scopes: list[str], user: str | None) -> Answer:
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            if kind == "repository" and user is not None:  # anonymous users get an empty grant
                access.append({"type": kind, "name": name, "actions": [a for a in actions.split(",") if a]})
        now = int(time.time())
        claims = {"iss": ISSUER, "sub": user or "", "aud": SERVICE, "exp": now + self.lifetime, "nbf": now - 10,
                  "iat": now, "jti": uuid.uuid4().hex, "access": access}
        token = self.jwt(claims)
        self.issued += 1
        document = {"token": token, "access_token": token, "expires_in": self.lifetime}
        return 200, {"Content-Type": "application/json"}, json.dumps(document).encode()

    def jwt(self, claims: dict) -> str:
        header = {"typ": "JWT", "alg": "RS256", "x5c": [self.pki.token_cert_der_b64()]}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.pki.directory / "token.key")],
                                   input=signing_input.encode(), capture_output=True, check=True, timeout=30).stdout
        return f"{signing_input}.{_b64url(signature)}"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


# --- registry processes --------------------------------------------------------------------------------------

@dataclass
class TlsRegistry:
    """One `docker-registry serve` with TLS and an auth kind, on NAME:PORT."""

    name: str
    port: int
    directory: Path
    process: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"{self.name}:{self.port}"

    def start(self, pki: Pki, *, auth: str, htpasswd: Path | None = None, token: TokenServer | None = None,
              client_cas: bool = False, access_log: bool = False) -> "TlsRegistry":
        """`access_log`: one combined-format line per request in registry.log (what a test counts requests by)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        lines = ["version: 0.1", "log:", "  level: warn",
                 "  accesslog:", f"    disabled: {str(not access_log).lower()}",
                 "storage:", "  filesystem:", f"    rootdirectory: {self.directory / 'data'}",
                 "  delete:", "    enabled: true",
                 "http:", f"  addr: 127.0.0.1:{self.port}", "  tls:",
                 f"    certificate: {pki.directory / 'server.crt'}", f"    key: {pki.directory / 'server.key'}"]
        if client_cas:
            lines += ["    clientcas:", f"      - {pki.ca}"]
        lines.append("auth:")
        if auth == "htpasswd":
            lines += ["  htpasswd:", "    realm: xla-test", f"    path: {htpasswd}"]
        else:
            assert token is not None
            lines += ["  token:", f"    realm: {token.realm}", f"    service: {SERVICE}", f"    issuer: {ISSUER}",
                      f"    rootcertbundle: {pki.directory / 'token.crt'}"]
        config = self.directory / "config.yml"
        config.write_text("\n".join(lines) + "\n")
        log = (self.directory / "registry.log").open("ab")
        self.process = subprocess.Popen(["docker-registry", "serve", str(config)], stdout=log, stderr=log,
                                        stdin=subprocess.DEVNULL)
        log.close()
        deadline = time.monotonic() + 30
        while True:
            try:
                requests.get(f"https://{self.host}/v2/", verify=str(pki.ca), timeout=2,
                             cert=(str(pki.directory / "client.crt"), str(pki.directory / "client.key")))
                return self
            except requests.RequestException:
                assert self.process.poll() is None, (self.directory / "registry.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "the registry did not answer within 30 s"
                time.sleep(0.2)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def log(self) -> str:
        path = self.directory / "registry.log"
        return path.read_text(errors="replace") if path.exists() else ""


@contextlib.contextmanager
def running_registry(pki: Pki, directory: Path, **start: object) -> Iterator[TlsRegistry]:
    """A TlsRegistry under the session's name on a free port, its CA (and with `client_cas=True` the client
    certificate) in the engine's certs.d while it runs; `start` goes to TlsRegistry.start. Stopped and its
    certs.d removed on the way out."""
    registry = TlsRegistry(pki.name, free_port(), directory)
    certs = place_engine_certs(registry.host, pki, client=bool(start.get("client_cas")))
    try:
        yield registry.start(pki, **start)  # type: ignore[arg-type]
    finally:
        registry.stop()
        remove_engine_certs(certs)


def write_htpasswd(path: Path, users: dict[str, str]) -> Path:
    """bcrypt entries, as distribution wants them, at cost 4 rather than 12: the registry checks the hash on every
    request (~0.3 s each at 12, which made a push of 1 MB take 17 s instead of 2)."""
    path.write_text("".join(f"{user}:{_bcrypt(password)}\n" for user, password in users.items()))
    return path


def _bcrypt(password: str) -> str:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            import crypt  # the stdlib's libxcrypt binding (gone in 3.13): bcrypt without a new dependency
        return crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH, rounds=16))
    except ImportError:  # apache2-utils' htpasswd, where the Python has no crypt module
        result = subprocess.run(["htpasswd", "-nbBC", "4", "x", password], capture_output=True, text=True,
                                check=True, timeout=30)
        return result.stdout.strip().split(":", 1)[1]


# --- docker configs and the credential helper ----------------------------------------------------------------

def write_helper(bin_dir: Path, store: Path) -> Path:
    """`docker-credential-xlatest`: `get` answers from `store` (JSON {host: {Username, Secret}}), as the real
    helpers do: "credentials not found in native keychain" and exit 1 when it has none."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / f"docker-credential-{HELPER_NAME}"
    script.write_text(f"""#!/usr/bin/env python3
import json, sys
if sys.argv[1:] != ["get"]:
    sys.exit(2)
host = sys.stdin.read().strip()
entry = json.load(open({str(store)!r})).get(host)
if entry is None:
    print("credentials not found in native keychain")
    sys.exit(1)
print(json.dumps(entry))
""")
    script.chmod(0o700)
    return script


def docker_config(directory: Path, mode: str, host: str, user: str, password: str) -> Path:
    """A DOCKER_CONFIG dir whose config gives `host` these credentials through `mode`: auths, credsStore or
    credHelpers (the helper's store file sits beside it)."""
    directory.mkdir(parents=True, exist_ok=True)
    store = directory / "helper-store.json"
    entries = json.loads(store.read_text()) if store.exists() else {}
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    if mode == "auths":
        pair = base64.b64encode(f"{user}:{password}".encode()).decode()
        config.setdefault("auths", {})[host] = {"auth": pair}
    else:
        entries[host] = {"ServerURL": host, "Username": user, "Secret": password}
        if mode == "credsStore":
            config["credsStore"] = HELPER_NAME
        else:
            config.setdefault("credHelpers", {})[host] = HELPER_NAME
    store.write_text(json.dumps(entries))
    config_path.write_text(json.dumps(config))
    return directory


def iter_texts(root: Path) -> Iterator[tuple[Path, str]]:
    for path in root.rglob("*"):
        if path.is_file() and path.stat().st_size < (8 << 20):
            yield path, path.read_text(errors="replace")


# --- the CLI as a user runs it ------------------------------------------------------------------------------

class Client:
    """The CLI with a user's environment: a docker config, the helper on PATH, and the chosen trust."""

    def __init__(self, project, tmp_path: Path, pki: Pki, trust: str) -> None:  # type: ignore[no-untyped-def]
        self.project = project
        self.config_dir = tmp_path / "docker-config"
        self.bin = tmp_path / "bin"
        self.outputs: list[str] = []
        env = {key: value for key, value in os.environ.items()
               if key not in ("XLA_IMAGES_REGISTRY_USER", "XLA_IMAGES_REGISTRY_PASSWORD")}
        env.update({"CI": "true", "DOCKER_CONFIG": str(self.config_dir), "COSIGN_PASSWORD": KEY_PASSWORD,
                    "PATH": f"{self.bin}{os.pathsep}{env.get('PATH', '')}", "PYTHONPATH": str(REPO)})
        if trust == "bundle":
            # The CA only in a bundle the environment names; the toolkit's certs.d is empty (the engine keeps its
            # own certs.d: it is not what this case tests, and /etc/ssl is not ours to edit).
            bundle = tmp_path / "bundle.pem"
            bundle.write_bytes(SYSTEM_BUNDLE.read_bytes() + b"\n" + pki.ca.read_bytes())
            empty = tmp_path / "no-certs.d"
            empty.mkdir()
            env.update({"SSL_CERT_FILE": str(bundle), "REQUESTS_CA_BUNDLE": str(bundle),
                        "XLA_IMAGES_CERTS_D": str(empty)})
        self.env = env
        write_helper(self.bin, self.config_dir / "helper-store.json")

    def login(self, mode: str, host: str, user: str, password: str) -> None:
        docker_config(self.config_dir, mode, host, user, password)

    def __call__(self, *args: str, expect: int = 0) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, str(REPO / "build.py"), *args, "--matrix", str(self.project.root / "matrix.yaml"),
                   "--site", str(self.project.root / "site.yaml")]
        if args[0] == "published":
            command = [sys.executable, str(REPO / "build.py"), *args]
        started = time.monotonic()
        result = subprocess.run(command, cwd=self.project.root, env=self.env, capture_output=True, text=True,
                                timeout=600)
        print(f"{args[0]}: {time.monotonic() - started:.1f} s", file=sys.stderr)
        self.outputs += [result.stdout, result.stderr]
        assert "Traceback" not in result.stderr, result.stderr
        assert result.returncode == expect, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        return result


# --- a front that redirects blob reads to another host ---------------------------------------------------------

class RedirectingFront(Host):
    """A plain-http front on 127.0.0.1 for a real TLS registry (the registry the toolkit is told to use), on the
    kit's recording host: every request goes through to the registry as it came, Authorization and all
    (support.host.forward), except a blob GET, answered with a 307 to `storage` — another host, as a registry
    whose storage serves blobs behind signed URLs does. `blob_location(digest)`, when set, is the Location of
    that 307 instead; `upload_location(location)`, when set, rewrites the Location of the registry's upload
    answers (a misbehaving registry or proxy). Started on creation; `authorizations()` says what it was sent."""

    def __init__(self, upstream: str, ca: Path, storage: "RecordingStorage") -> None:
        super().__init__("127.0.0.1")
        self.upstream, self.storage = upstream, storage
        self.blob_location: Callable[[str], str] | None = None
        self.upload_location: Callable[[str], str] | None = None
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.verify = str(ca)
        self.start()

    def answer(self, seen: Seen) -> Answer:
        path = urlsplit(seen.path).path
        if seen.method == "GET" and "/blobs/sha256:" in path:
            digest = path.rsplit("/", 1)[1]
            location = (self.blob_location(digest) if self.blob_location
                        else f"{self.storage.url}/blobs/{digest}?signature=public")
            return 307, {"Location": location}, b""
        status, headers, body = forward(seen, f"https://{self.upstream}", self.session)
        if "/blobs/uploads/" in path and "Location" in headers and self.upload_location:
            headers["Location"] = self.upload_location(headers["Location"])
        return status, headers, body


class RecordingStorage(Host):
    """Blob storage on 127.0.0.2 (another host), on the kit's recording host: serves any blob of `repository`
    to anyone, fetching it from the registry with the test's own reader, and records every request (`seen`);
    or, with `challenge_realm`, asks for credentials of its own. Started on creation."""

    def __init__(self, reader: requests.Session, base: str, repository: str, address: str = "127.0.0.2") -> None:
        super().__init__(address)
        self.reader, self.base, self.repository = reader, base, repository
        self.challenge_realm: str | None = None  # set: answer 401 with a Bearer challenge naming this realm
        self.start()

    def answer(self, seen: Seen) -> Answer:
        if self.challenge_realm:
            return 401, {"WWW-Authenticate": f'Bearer realm="{self.challenge_realm}",service="s"'}, b""
        if seen.method != "GET":  # a request only a misdirected upload would send: recorded, refused
            return 405, {}, b""
        digest = urlsplit(seen.path).path.rsplit("/", 1)[1]
        blob = self.reader.get(f"{self.base}/v2/{self.repository}/blobs/{digest}", timeout=30)
        return blob.status_code, {}, blob.content
