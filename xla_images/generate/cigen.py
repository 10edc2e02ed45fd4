"""CI generated from the matrix: GitHub Actions workflows and a `docker buildx bake` file.

Builds of 30+ flavours outgrow one machine, so they fan out on engines that already exist: GitHub Actions runners
(one job per flavour) or BuildKit through `docker buildx bake`. Both are rendered from templates/ci/ and committed;
`render --check` (generate.sync) compares the committed files with `generated_files(plan)`.

Committed files must be the same on every site (like the rendered Dockerfiles), so nothing site-specific goes into
them: the workflows ask `./build.py list --json` for the matrix at run time, and the bake file names the built-in
default registry (`REGISTRY` variable) and a contexts directory. `ci bake --contexts DIR` assembles the build
contexts (run.building.bake) and writes a second, uncommitted bake file (`bake_override`) with what depends on the site and
the files on disk: the site's registry, each flavour's base image and content-addressed id.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jinja2

from .. import names, resources
from ..errors import ConfigError, Failure
from ..model.site import build_cache_refs, build_cache_to, load_site
from ..model.target import Target
from ..names import GENERATED_MARK
from .plan import Plan

GITHUB_DIR = Path("ci") / "github"
BUILD_WORKFLOW = GITHUB_DIR / "xla-images-build.yml"
RESOLVE_WORKFLOW = GITHUB_DIR / "xla-images-resolve.yml"
EXAMPLE_WORKFLOW = GITHUB_DIR / "example-downstream.yml"
UPDATE_WORKFLOW = GITHUB_DIR / "xla-images-update.yml"
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
            for path in (BUILD_WORKFLOW, RESOLVE_WORKFLOW, EXAMPLE_WORKFLOW, UPDATE_WORKFLOW)}


def bake_files(plan: Plan) -> dict[Path, str]:
    return {BAKE_FILE: _render(BAKE_FILE.name + ".j2", BAKE_FILE, {"bake": bake_config(plan)})}


def bake_config(plan: Plan) -> dict[str, Any]:
    """The committed bake definition: one target per image (each flavour's runtime and devel image), groups per
    release, ABI, accelerator and variant."""
    flavours = list(plan.every_image)
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
    """`default` = all; `r2_9` per release (`docker buildx bake r2.9` works); `cxx11`/`pre-cxx11`; `tpu`/`cpu`;
    `runtime`/`devel`."""
    members: dict[str, list[str]] = {"default": [bake_target_name(flavour) for flavour in flavours]}
    facets = (
        lambda flavour: f"r{flavour.release_minor}",
        lambda flavour: flavour.abi.value,
        lambda flavour: flavour.accelerator.value,
        lambda flavour: flavour.variant.value,
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
                **_bake_cache(plan, flavour),
            }
            for flavour in flavours
        },
    }
    return json.dumps(override, indent=2) + "\n"


def _bake_cache(plan: Plan, flavour: Target) -> dict[str, list[str]]:
    """The site's registry build cache (build_cache) for one target, with the refs and options `build` uses: bake
    and `build` on any engine then share what each exported. Nothing when the site has none."""
    if not plan.site.build_cache:
        return {}
    refs = build_cache_refs(plan.site.build_cache, flavour.tag, [
        other.tag for other in plan.every_image if (other.torch_xla, other.python) == (flavour.torch_xla,
                                                                                        flavour.python)])
    return {"cache-from": [_bake_literal(f"type=registry,ref={ref}") for ref in refs],
            "cache-to": [_bake_literal(build_cache_to(refs[0], plan.site.compression))]}


def _bake_target(flavour: Target) -> dict[str, Any]:
    return {
        "description": _bake_literal(flavour.labels["org.opencontainers.image.description"]),
        # A devel image builds the devel stage of its runtime flavour's context (the same Dockerfile and lock).
        "context": f"${{CONTEXTS}}/{flavour.runtime_tag}",
        "dockerfile": "Dockerfile",
        "target": flavour.variant.stage,
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
