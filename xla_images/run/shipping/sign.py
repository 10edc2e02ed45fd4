"""Signatures and SBOM attestations by digest, with cosign's key-based, offline mode.

Everything is signed and verified by manifest digest (`HOST/REPO@sha256:...`), never by tag: a tag can be
moved to another image, a digest cannot. Signing uses a local key pair (`cosign generate-key-pair`) and no
transparency log (`--tlog-upload=false`), verification correspondingly `--insecure-ignore-tlog=true`: the
trust is in the public key alone, which is what an offline, self-hosted registry can have.

Signatures and attestations live in the registry beside the image, as cosign stores them: tags
`sha256-<hex>.sig` and `sha256-<hex>.att` in the same repository. The SBOM is attached as a signed in-toto
attestation of type cyclonedx (`cosign attest --type cyclonedx`), so whoever verifies it also knows who
vouches for it and which digest it describes.

Secrets: the key's password is Key.password (COSIGN_PASSWORD, read at the CLI's edge), put in cosign's
environment where cosign reads it; registry credentials from
the environment reach cosign through a private, temporary docker config, never its command line. Only key
*paths* are ever passed or printed; cosign's messages are scrubbed of the password before being shown.
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ... import diskio, settings, userfiles
from ...errors import ConfigError, Failure, Location
from ...model.registry import Registry
from ...names import local_ref
from .. import engine, registry as registries
from ...model.published import Published
from ..registry import Credentials, load_credentials, redact, redacting

PASSWORD_ENV = settings.COSIGN_PASSWORD.env[0]  # read by settings.read_cosign_password, at the CLI
INSTALL_HINT = "install cosign with `ci/engine.sh install` (cosign 2.5 from Debian 13)"
SBOM_PREDICATE_TYPE = "https://cyclonedx.org/bom"
TIMEOUT = 300
# What cosign says, and what it means for the user (first match wins).
_VERIFY_REASONS = (
    ("no signatures found", "it is not signed (no cosign signature in the registry for this digest)"),
    ("invalid or missing digest in claim", "its signature was made for another digest (copied or tampered)"),
    ("no matching signatures", "no signature by this key (signed by another key, or the signature was altered)"),
    ("no matching attestations", "no SBOM attestation by this key (attested with another key, or altered)"),
    ("manifest_unknown", "the registry has no manifest with this digest"),
    ("connection refused", "the registry does not answer"),
)


@dataclass(frozen=True)
class Key:
    """A key path or a KMS-style URI (`env://`, `awskms://`...); its content is never read into output.
    `password` is a private key file's password (COSIGN_PASSWORD, read at the CLI's edge by
    settings.read_cosign_password): handed to cosign in its environment, scrubbed from what it says, never shown."""

    text: str
    private: bool
    password: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, text: str, *, private: bool, where: str, password: str | None = None) -> Key:
        if "://" in text:
            return cls(text, private, password)  # cosign resolves KMS and env:// keys itself
        path = Path(text)
        if not os.path.lexists(path):
            raise ConfigError(f"{'signing' if private else 'public'} key {path} does not exist",
                              location=Location(where), rule="sign-key",
                              hint="make a pair with `cosign generate-key-pair` (cosign.key signs, cosign.pub "
                                   "verifies)")
        # Bounded: a fifo, /dev/zero, a directory or a 3 GiB file is a file-* error naming it, not a hang.
        head = userfiles.read_text(path, limit=userfiles.KEY_LIMIT)[:80]
        is_private = "PRIVATE KEY" in head
        if is_private != private:
            wanted = "a private key (cosign.key)" if private else "a public key (cosign.pub)"
            raise ConfigError(f"{path} is not {wanted}", location=Location(where), rule="sign-key",
                              hint="sign with the .key file, verify with the .pub file")
        return cls(str(path.resolve()), private, password)


# --- running cosign -----------------------------------------------------------------------------------------

def cosign_binary() -> str:
    found = shutil.which("cosign")
    if found is None:
        raise Failure("cosign is not installed", rule="cosign-installed", hint=INSTALL_HINT)
    return found


def _registry_flags(registry: Registry) -> list[str]:
    """The engine's trust for this host, as cosign's flags: plain http where the engine speaks it, the
    certs.d CA and client certificate otherwise (cosign reads SSL_CERT_FILE itself, not certs.d)."""
    trust = registries.load_trust(registry.host)
    if trust.scheme == "http":
        return ["--allow-http-registry=true"]
    flags = [f"--registry-cacert={trust.ca_files[0]}"] if trust.ca_files else []
    if trust.client_cert is not None:
        flags += [f"--registry-client-cert={trust.client_cert[0]}", f"--registry-client-key={trust.client_cert[1]}"]
    return flags


@contextlib.contextmanager
def _cosign_env(registry: Registry, credentials: Credentials | None,
                password: str | None = None) -> Iterator[dict[str, str]]:
    """cosign's environment, with the key's `password` where cosign reads it; credentials from our environment go
    into a private docker config for the run."""
    env = settings.child_environment({} if password is None else {PASSWORD_ENV: password})
    if credentials is None or not credentials.from_environment:
        yield env  # anonymous, or cosign reads the same docker config we found them in
        return
    with tempfile.TemporaryDirectory(prefix="xla-images-cosign-") as directory:
        os.chmod(directory, 0o700)
        pair = base64.b64encode(f"{credentials.username}:{credentials.password}".encode()).decode()
        config = Path(directory) / "config.json"
        config.touch(mode=0o600)
        config.write_text(json.dumps({"auths": {registry.host: {"auth": pair}}}), encoding="utf-8")
        env["DOCKER_CONFIG"] = directory
        yield env


def _run(arguments: list[str], registry: Registry, credentials: Credentials | None,
         password: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [cosign_binary(), *arguments]
    with _cosign_env(registry, credentials, password) as env:
        try:
            return subprocess.run(command, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            raise Failure(f"cosign {arguments[0]} did not finish within {TIMEOUT} s", rule="cosign",
                          hint=f"is the registry {registry.host} up?") from None


def _scrub(text: str, credentials: Credentials | None, password: str | None = None) -> str:
    text = redact(text, credentials)
    if password:
        text = text.replace(password, "***")
    lines = [line for line in text.splitlines()
             if line.strip() and not line.startswith("WARNING: Skipping tlog verification")]
    return "\n".join(lines[-3:])


def _need_password(key: Key) -> None:
    if key.password is None and "://" not in key.text:
        raise ConfigError(f"{PASSWORD_ENV} is not set", location=Location(key.text), rule="sign-password",
                          hint=f"export {PASSWORD_ENV} with the key's password (empty for a key made without "
                               "one); it is read by cosign and never printed")


def _digest_ref(ref: str) -> tuple[Registry, str]:
    name, at, digest = ref.partition("@")
    if not at or not digest.startswith("sha256:"):
        raise ConfigError(f"{ref!r} is not a digest reference", rule="sign-by-digest",
                          hint="sign and verify HOST/REPO@sha256:..., as published.json records it")
    return Registry.parse(name, where=ref), digest


# --- sign and attest ----------------------------------------------------------------------------------------

def sign(ref: str, key: Key, credentials: Credentials | None) -> None:
    """Sign the manifest digest `ref` names; the signature goes to the registry beside it."""
    registry, _ = _digest_ref(ref)
    _need_password(key)
    result = _run(["sign", "--key", key.text, "--tlog-upload=false", "--yes", *_registry_flags(registry), ref],
                  registry, credentials, key.password)
    if result.returncode != 0:
        raise Failure(f"signing {ref} failed: {_scrub(result.stderr, credentials, key.password)}", rule="sign",
                      hint=_sign_hint(result.stderr))


def attest_sbom(ref: str, key: Key, sbom_path: Path, credentials: Credentials | None) -> None:
    """Attach the SBOM as a signed cyclonedx attestation of `ref` (replacing an older one of that type)."""
    registry, _ = _digest_ref(ref)
    _need_password(key)
    result = _run(["attest", "--key", key.text, "--type", "cyclonedx", "--predicate", str(sbom_path),
                   "--replace=true", "--tlog-upload=false", "--yes", *_registry_flags(registry), ref],
                  registry, credentials, key.password)
    if result.returncode != 0:
        raise Failure(f"attaching the SBOM to {ref} failed: {_scrub(result.stderr, credentials, key.password)}",
                      rule="sbom-attest", hint=_sign_hint(result.stderr))


def _sign_hint(stderr: str) -> str:
    if "decrypt" in stderr:
        return f"{PASSWORD_ENV} is not the password of this key"
    return "is the registry up and the image pushed? (`build.py push`)"


# --- verify ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Refused:
    """Why cosign refused: our reading of its message, and the message's last lines (scrubbed)."""

    reason: str
    detail: str


def _refusal(result: subprocess.CompletedProcess[str], credentials: Credentials | None) -> Refused:
    text = result.stderr.lower()
    reason = next((meaning for needle, meaning in _VERIFY_REASONS if needle in text),
                  f"cosign refused it (exit {result.returncode})")
    return Refused(reason, _scrub(result.stderr, credentials))


def verify(ref: str, key: Key, credentials: Credentials | None) -> None:
    """Verify a signature by `key` over exactly this digest; a Failure names the ref and the reason."""
    registry, digest = _digest_ref(ref)
    result = _run(["verify", "--key", key.text, "--insecure-ignore-tlog=true", "--output", "json",
                   *_registry_flags(registry), ref], registry, credentials)
    if result.returncode != 0:
        refused = _refusal(result, credentials)
        raise Failure(f"refusing {ref}: {refused.reason}", rule="signature-verified",
                      hint=f"cosign said: {refused.detail}" if refused.detail else None)
    signed = _signed_digests(result.stdout)
    if digest not in signed:
        # cosign checks this claim itself; a second look costs nothing and guards the exact digest.
        raise Failure(f"refusing {ref}: the signatures name {', '.join(sorted(signed)) or 'no digest'}",
                      rule="signature-verified")


def _signed_digests(stdout: str) -> set[str]:
    try:
        payloads = json.loads(stdout)
    except (ValueError, RecursionError):
        return set()
    if not isinstance(payloads, list):  # cosign's answer is checked like a registry's: a list of payloads
        return set()
    digests = set()
    for item in payloads:
        critical = item.get("critical") if isinstance(item, dict) else None
        image = critical.get("image") if isinstance(critical, dict) else None
        if isinstance(image, dict) and isinstance(image.get("docker-manifest-digest"), str):
            digests.add(image["docker-manifest-digest"])
    return digests


def verify_sbom(ref: str, key: Key, credentials: Credentials | None) -> dict[str, Any]:
    """Verify the cyclonedx attestation by `key` of exactly this digest; return the SBOM it carries."""
    registry, digest = _digest_ref(ref)
    result = _run(["verify-attestation", "--key", key.text, "--type", "cyclonedx",
                   "--insecure-ignore-tlog=true", *_registry_flags(registry), ref], registry, credentials)
    if result.returncode != 0:
        refused = _refusal(result, credentials)
        raise Failure(f"refusing the SBOM of {ref}: {refused.reason}", rule="sbom-attestation-verified",
                      hint=f"cosign said: {refused.detail}" if refused.detail else None)
    for statement in _statements(result.stdout):
        listed = statement.get("subject")
        subjects = {f"sha256:{item['digest'].get('sha256')}" for item in (listed if isinstance(listed, list) else [])
                    if isinstance(item, dict) and isinstance(item.get("digest"), dict)}
        predicate = statement.get("predicate")
        if statement.get("predicateType") == SBOM_PREDICATE_TYPE and digest in subjects and isinstance(predicate, dict):
            return dict(predicate)
    raise Failure(f"refusing the SBOM of {ref}: no verified cyclonedx statement names this digest",
                  rule="sbom-attestation-verified")


def _statements(stdout: str) -> Iterator[dict[str, Any]]:
    """The in-toto statements inside the DSSE envelopes cosign prints, one JSON document per line."""
    for line in stdout.splitlines():
        try:
            statement = json.loads(base64.b64decode(json.loads(line)["payload"]))
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
        if isinstance(statement, dict):  # anything else cosign might print is no statement
            yield statement


def verify_ref(ref: str, key_text: str | None, site_key: str | None, say: Any = None, *,
               named: Iterable[str] = ()) -> None:
    """What `resolve --verify` / `pull --verify` do: the key from --key or the site, then `verify`."""
    chosen = key_text or site_key
    if not chosen:
        raise ConfigError("--verify needs a public key", location=Location("--key"), rule="sign-key",
                          hint="pass --key cosign.pub, or set cosign_public_key in site.yaml")
    key = Key.parse(chosen, private=False, where="--key" if key_text else "site cosign_public_key")
    registry, _ = _digest_ref(ref)
    verify(ref, key, load_credentials(registry.host, named=named))
    if say is not None:
        say(f"verified: {ref} is signed by {key.text}")


# --- published flavours: sign + attest, verify --------------------------------------------------------------

Say = Callable[[str], None]


@dataclass(frozen=True)
class Signed:
    tag: str
    ref: str
    sbom: Path | None  # the SBOM file attested, None with --no-sbom


def sign_published(entries: list[Published], key: Key, *, sbom_for: Callable[[Published], Path] | None,
                   say: Say, named: Iterable[str] = ()) -> list[Signed]:
    """Sign each published digest and, with `sbom_for`, attest the SBOM it writes for that digest.

    The digest is re-checked in the registry first: signing a digest the registry no longer holds would
    leave a signature for nothing.
    """
    done = []
    for entry in entries:
        registry, digest = _digest_ref(entry.ref)
        client = registries.connect(registry, named=named)
        credentials = client.credentials
        with redacting(credentials):
            if client.manifest_digest(digest) is None:
                raise Failure(f"{entry.ref} ({entry.tag}) is not in the registry", rule="sign-published",
                              hint=f"push it again: `build.py push {entry.tag}`")
            sign(entry.ref, key, credentials)
            say(f"{entry.tag}: signed {entry.ref}")
            path = None
            if sbom_for is not None:
                path = sbom_for(entry)
                attest_sbom(entry.ref, key, path, credentials)
                say(f"{entry.tag}: SBOM {path} attached as a signed cyclonedx attestation")
        done.append(Signed(entry.tag, entry.ref, path))
    return done


def pushed_image(entry: Published, named: Iterable[str] = ()) -> str:
    """A local image that is exactly the pushed one (same config or manifest digest), to read an SBOM from."""
    registry, digest = _digest_ref(entry.ref)
    client = registries.connect(registry, named=named)
    with redacting(client.credentials):
        manifest = client.manifest(digest)
    wanted = {digest, str((manifest.get("config") or {}).get("digest"))}
    for candidate in (entry.ref, local_ref(entry.tag)):
        attrs = engine.images.image_inspect(candidate)
        if attrs is not None and attrs.get("Id") in wanted:
            return candidate
    raise Failure(f"no local image is {entry.ref} ({entry.tag}), so its SBOM cannot be read",
                  rule="sbom-image", hint=f"pull it (`build.py pull` with its filters, or `docker pull "
                                          f"{entry.ref}`), or sign with --no-sbom")


@dataclass(frozen=True)
class Verified:
    tag: str
    ref: str
    sbom_components: int | None  # None when the SBOM was not asked for


def verify_published(entries: list[Published], key: Key, *, with_sbom: bool, sbom_dir: Path | None,
                     say: Say, named: Iterable[str] = ()) -> tuple[list[Verified], list[str]]:
    """Verify signature (and SBOM attestation) of each entry; return the verified ones and the refusals."""
    verified, refused = [], []
    for entry in entries:
        registry, digest = _digest_ref(entry.ref)
        credentials = load_credentials(registry.host, named=named)
        try:
            verify(entry.ref, key, credentials)
            count = None
            if with_sbom:
                document = verify_sbom(entry.ref, key, credentials)
                described = ((document.get("metadata") or {}).get("component") or {}).get("version")
                if described != digest:
                    raise Failure(f"refusing the SBOM of {entry.ref}: it describes {described}, not {digest}",
                                  rule="sbom-attestation-verified")
                count = len(document.get("components") or [])
                if sbom_dir is not None:
                    diskio.write_text_atomic(sbom_dir / f"{entry.tag}.cdx.json", json.dumps(document, indent=2) + "\n",
                                             "the verified SBOM", shared=True)
        except Failure as error:
            refused.append(f"{entry.tag}: {error.message}")
            say(f"{entry.tag}: {error.render()}")
            continue
        verified.append(Verified(entry.tag, entry.ref, count))
    return verified, refused
