"""CI generated from the matrix: GitHub Actions workflows and a `docker buildx bake` file.

Builds of 30+ flavours outgrow one machine, so they fan out on engines that already exist: GitHub Actions runners
(one job per flavour) or BuildKit through `docker buildx bake`. Both are rendered from templates/ci/ and committed;
`render --check` compares the committed files with `generated_files(plan)`.

Committed files must be the same on every site (like the rendered Dockerfiles), so nothing site-specific goes into
them: the workflows ask `./build.py list --json` for the matrix at run time, and the bake file names the built-in
default registry (`REGISTRY` variable) and a contexts directory. `ci bake --contexts DIR` assembles the build
contexts and writes a second, uncommitted bake file with what depends on the site and the files on disk: the
site's registry, each flavour's base image and content-addressed id.
"""
from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

import jinja2

from .. import names, resources
from ..errors import ConfigError, Failure
from ..model.site import load_site
from ..model.target import Target
from ..names import GENERATED_MARK, RUNTIME_STAGE
from .plan import Plan

GITHUB_DIR = Path("ci") / "github"
BUILD_WORKFLOW = GITHUB_DIR / "xla-images-build.yml"
RESOLVE_WORKFLOW = GITHUB_DIR / "xla-images-resolve.yml"
EXAMPLE_WORKFLOW = GITHUB_DIR / "example-downstream.yml"
BAKE_FILE = Path("docker-bake.json")
# Where `ci bake --contexts` assembles build contexts unless told otherwise (build/ is git-ignored).
DEFAULT_CONTEXTS = Path("build") / "bake"
OVERRIDE_NAME = "docker-bake.override.json"

# The python that runs build.py on CI runners (pyproject: requires-python >= 3.11).
TOOL_PYTHON = "3.11"
# GitHub refuses a matrix of more than 256 jobs per workflow run.
GITHUB_MATRIX_LIMIT = 256

# Actions pinned to full commit SHAs: tags are mutable, a SHA is not. The comment names the release.
ACTIONS = {
    "checkout": ("actions/checkout", "11bd71901bbe5b1630ceea73d27597364c9af683", "v4.2.2"),
    "setup_python": ("actions/setup-python", "a26af69be951a213d495a4c3e4e4022e16d87065", "v5.6.0"),
    "upload_artifact": ("actions/upload-artifact", "ea165f8d65b6e75b540449e92b4886f43607fa02", "v4.6.2"),
    "download_artifact": ("actions/download-artifact", "d3f86a106a0bac45b974a628896c90dbdf5c8093", "v4.3.0"),
}

# docker buildx bake accepts target and group names of these characters only; on its command line it turns `.`
# into `_`, so `docker buildx bake r2.9.0_3.11_cpu` finds the target we name `r2_9_0_3_11_cpu`.
BAKE_NAME = re.compile(r"^[a-zA-Z0-9_-]+$")


def generated_files(plan: Plan) -> dict[Path, str]:
    """Every CI file, by path relative to the repository root, as `ci github` and `ci bake` write them."""
    return {**github_files(plan), **bake_files(plan)}


def github_files(plan: Plan) -> dict[Path, str]:
    context = {"actions": _action_refs(), "tool_python": TOOL_PYTHON, "matrix_limit": GITHUB_MATRIX_LIMIT,
               "build_workflow": BUILD_WORKFLOW.name, "resolve_workflow": RESOLVE_WORKFLOW.name}
    return {path: _render(path.name + ".j2", path, context)
            for path in (BUILD_WORKFLOW, RESOLVE_WORKFLOW, EXAMPLE_WORKFLOW)}


def bake_files(plan: Plan) -> dict[Path, str]:
    return {BAKE_FILE: _render(BAKE_FILE.name + ".j2", BAKE_FILE, {"bake": bake_config(plan)})}


def bake_config(plan: Plan) -> dict[str, Any]:
    """The committed bake definition: one target per flavour, groups per release, ABI and accelerator."""
    flavours = list(plan.flavours)
    targets = {bake_target_name(flavour): _bake_target(flavour) for flavour in flavours}
    _check_unique_names(flavours, targets)
    groups = bake_groups(flavours)
    invalid = sorted(name for name in [*targets, *groups] if not BAKE_NAME.match(name))
    if invalid:
        raise ConfigError(f"not a bake target or group name: {', '.join(invalid)}", rule="bake-names",
                          hint="bake names are letters, digits, `_` and `-` (`.` becomes `_`)")
    clashes = sorted(set(groups) & set(targets))
    if clashes:
        raise ConfigError(f"bake group name(s) {', '.join(clashes)} equal a target name", rule="bake-names",
                          hint="a flavour tag must not look like a release, ABI or accelerator group name")
    return {
        "variable": {
            # The built-in default, not this site's registry: the committed file is the same on every site.
            # `REGISTRY=host/repo docker buildx bake ...` or the override that `ci bake --contexts` writes set it.
            "REGISTRY": {"default": load_site(None, root=plan.root).registry},
            "CONTEXTS": {"default": DEFAULT_CONTEXTS.as_posix()},
        },
        "group": groups,
        "target": targets,
    }


def bake_target_name(flavour: Target) -> str:
    return flavour.tag.replace(".", "_")


def bake_group_name(word: str) -> str:
    return word.replace(".", "_")


def bake_groups(flavours: list[Target]) -> dict[str, dict[str, list[str]]]:
    """`default` = all; `r2_9` per release (`docker buildx bake r2.9` works); `cxx11`/`pre-cxx11`; `tpu`/`cpu`."""
    members: dict[str, list[str]] = {"default": [bake_target_name(flavour) for flavour in flavours]}
    facets = (
        lambda flavour: f"r{flavour.release_minor}",
        lambda flavour: flavour.abi.value,
        lambda flavour: flavour.accelerator.value,
    )
    for facet in facets:
        # Groups of one facet together, in matrix order (releases ascend there).
        for flavour in flavours:
            members.setdefault(bake_group_name(facet(flavour)), []).append(bake_target_name(flavour))
    return {group: {"targets": names} for group, names in members.items()}


def bake_override(plan: Plan, flavours: list[Target], contexts: Path, base_images: dict[str, str],
                  secrets: dict[str, dict[str, Path]] | None = None) -> str:
    """The uncommitted second bake file: this site's registry, the contexts directory, per-target build args
    and BuildKit secrets (the pip settings and CA bundle `ci bake --contexts` wrote beside each context)."""
    secrets = secrets or {}
    override = {
        "//": "written by `./build.py ci bake --contexts`; site- and checkout-specific, do not commit",
        "variable": {
            "REGISTRY": {"default": plan.site.registry},
            "CONTEXTS": {"default": contexts.as_posix()},
        },
        "target": {
            bake_target_name(flavour): {
                "args": {"BASE_IMAGE": _bake_literal(base_images[flavour.tag]),
                         "FLAVOUR_ID": _bake_literal(flavour.id),
                         "SOURCE_DATE_EPOCH": str(names.SOURCE_DATE_EPOCH)},
                "secret": [f"id={name},src={_bake_literal(path.as_posix())}"
                           for name, path in sorted(secrets.get(flavour.tag, {}).items())],
            }
            for flavour in flavours
        },
    }
    return json.dumps(override, indent=2) + "\n"


def assemble_bake_contexts(plan: Plan, flavours: list[Target], contexts: Path,
                           choose_base: Callable[[Target], str] | None = None) -> Path:
    """Write each flavour's build context to `contexts/<tag>/` and the override file; return its path.

    The contexts are exactly what `build` gives the engine (build.write_context), so bake builds the same image
    from the same lock, wheels and smoke suite. The base is chosen as `build` chooses it (site base if here or
    pullable, else the bootstrapped one): a bootstrapped base exists only on this engine, so a remote builder
    needs a site base it can pull (site.yaml `bases`).
    """
    from ..run import build as building  # the engine side, only when contexts are asked for

    chooser = choose_base or (lambda flavour: building.choose_base(flavour.python, flavour.base_image))
    unlocked = []
    for flavour in flavours:
        try:
            building.check_lock(plan, flavour)
        except Failure as error:
            unlocked.append(error.message)
    if unlocked:
        raise Failure("cannot assemble contexts without fresh locks:\n  " + "\n  ".join(unlocked),
                      rule="lock-fresh", hint="run `./build.py lock TAG...`, or choose flavours with "
                                              "--abi/--python/--torch-xla/--accelerator")
    contexts = contexts.resolve()
    contexts.mkdir(parents=True, exist_ok=True)
    base_images = {}
    for flavour in flavours:
        base_images[flavour.tag] = chooser(flavour)
        _replace_context(plan, flavour, contexts / flavour.tag, building.write_context)
    secrets = {flavour.tag: building.context_secrets(contexts / flavour.tag) for flavour in flavours}
    override = contexts / OVERRIDE_NAME
    override.write_text(bake_override(plan, flavours, contexts, base_images, secrets), encoding="utf-8")
    return override


def _replace_context(plan: Plan, flavour: Target, target: Path,
                     write_context: Callable[[Plan, Target, Path], list[str]]) -> None:
    """Assemble next to `target`, then swap: an interrupted run never leaves half a context under its name."""
    if target.exists() and not (target / "Dockerfile").is_file():
        raise ConfigError(f"{target} exists and is not a build context", rule="bake-contexts",
                          hint="point --contexts at a directory of its own, e.g. build/bake")
    scratch = Path(tempfile.mkdtemp(prefix=f".{flavour.tag}-", dir=target.parent))
    scratch.chmod(0o755)  # mkdtemp makes it private; a builder running as another user must read it
    from ..run.build import secrets_dir_for

    try:
        write_context(plan, flavour, scratch)
        for old in (target, secrets_dir_for(target)):
            if old.exists():
                shutil.rmtree(old)
        if secrets_dir_for(scratch).exists():
            secrets_dir_for(scratch).rename(secrets_dir_for(target))
        scratch.rename(target)
    finally:
        for leftover in (scratch, secrets_dir_for(scratch)):
            if leftover.exists():
                shutil.rmtree(leftover)


def stale_files(plan: Plan, files: dict[Path, str]) -> list[str]:
    """Paths (relative) whose content on disk differs from `files`, each with why: missing or stale."""
    problems = []
    for relative, content in files.items():
        path = plan.root / relative
        if not path.is_file():
            problems.append(f"{relative.as_posix()}: missing")
        elif path.read_text(encoding="utf-8") != content:
            problems.append(f"{relative.as_posix()}: stale")
    return problems


def write_files(plan: Plan, files: dict[Path, str]) -> list[Path]:
    """Write the files that differ; returns those written (relative paths)."""
    written = []
    for relative, content in files.items():
        path = plan.root / relative
        if path.is_file() and path.read_text(encoding="utf-8") == content:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content, encoding="utf-8")
        written.append(relative)
    return written


def _bake_target(flavour: Target) -> dict[str, Any]:
    return {
        "description": _bake_literal(flavour.labels["org.opencontainers.image.description"]),
        "context": f"${{CONTEXTS}}/{flavour.tag}",
        "dockerfile": "Dockerfile",
        "target": RUNTIME_STAGE,
        "tags": [f"${{REGISTRY}}:{tag}" for tag in flavour.tags],
        "labels": {key: _bake_literal(value) for key, value in flavour.labels.items()},
    }


def _bake_literal(value: str) -> str:
    """Bake evaluates `${...}` and `%{...}` in every JSON string; data must not be read as an expression."""
    return value.replace("${", "$${").replace("%{", "%%{")


def _check_unique_names(flavours: list[Target], targets: dict[str, Any]) -> None:
    if len(targets) == len(flavours):
        return
    seen: dict[str, str] = {}
    for flavour in flavours:
        name = bake_target_name(flavour)
        if name in seen:
            raise ConfigError(f"flavours {seen[name]} and {flavour.tag} map to the same bake target {name}",
                              location=flavour.declared_at, rule="bake-names",
                              hint="bake target names replace `.` by `_`; make the tags differ in more than that")
        seen[name] = flavour.tag


def _action_refs() -> dict[str, str]:
    return {key: f"{repo}@{sha} # {version}" for key, (repo, sha, version) in ACTIONS.items()}


def _environment() -> jinja2.Environment:
    # `[[ ]]`/`[% %]` delimiters: workflows are full of GitHub's own `${{ }}` expressions, which must pass through.
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(resources.ci_templates_dir()),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        variable_start_string="[[",
        variable_end_string="]]",
        block_start_string="[%",
        block_end_string="%]",
        comment_start_string="[#",
        comment_end_string="#]",
    )


def _render(template_name: str, output: Path, context: dict[str, Any]) -> str:
    environment = _environment()
    environment.filters["json"] = lambda value: json.dumps(value, ensure_ascii=False)
    try:
        template = environment.get_template(template_name)
    except jinja2.TemplateNotFound as error:
        raise Failure(f"CI template {resources.ci_templates_dir() / template_name} is missing", rule="ci-template",
                      hint="templates/ci/ ships inside the xla_images package; reinstall xla-images") from error
    header = (f"{GENERATED_MARK} from templates/ci/{template_name}. Do not edit this file: regenerate it with "
              f"`./build.py {'ci bake' if output == BAKE_FILE else 'ci github'}` (or `./build.py render`); "
              f"`./build.py render --check` reports drift.")
    return template.render(header=header, **context)
