"""`build.py abi inspect|check` on images: each python site-packages of an image is copied out of a created,
never started container and read like a directory. The system libraries of the image are not copied, so `check`
judges symbols the extensions would take from them by their names only (`abi.SystemLibraries(None)`); the image
checks run the standalone tool inside the image, where they are read too. The image's LD_LIBRARY_PATH (its
config's Env, what every process started in it inherits) reaches the loader: its entries inside a copied
site-packages are searched in the copy, the others are system directories, not copied, left out.
"""
from __future__ import annotations

import re
import tempfile
from pathlib import Path

from ... import abi
from ...abi.words import RULE_IMAGE, SITE_PACKAGES_GLOBS, usage_error
from ...errors import XlaImagesError
from .. import engine

# The image reference grammar of the distribution project (reference.go), without IPv6 hosts: a reference the
# engine would refuse as "invalid reference format" is the user's typo, reported before asking the engine.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*(?::[0-9]+)?"
_IMAGE_REFERENCE = re.compile(
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[\w][\w.-]{{0,127}})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)


def check_image_reference(image: str) -> None:
    if len(image) > 512 or _IMAGE_REFERENCE.fullmatch(image) is None:
        shown = image if len(image) <= 80 else image[:80] + "..."
        raise usage_error(f"{shown!r} is neither an existing path nor a valid image reference", rule=RULE_IMAGE,
                          hint="pass a wheel, a directory, a .so file or an image such as "
                               "xla-images:r2.9.0_3.11_cpu (lowercase repository, optional :tag or @sha256:...)")


def extract_site_packages(image: str, scratch: Path) -> list[tuple[str, Path]]:
    """(path in the image, local copy) of each site-packages matching SITE_PACKAGES_GLOBS.

    Nothing runs in the image: for each glob the engine copies its fixed leading directory out of a created,
    never started container, and the wildcard is matched locally.
    """
    check_image_reference(image)
    found: list[tuple[str, Path]] = []
    for number, pattern in enumerate(SITE_PACKAGES_GLOBS):
        fixed, wildcard = _split_glob(pattern)
        try:
            local = engine.containers.extract_from_image(image, fixed, scratch / str(number))
        except XlaImagesError as error:  # sorted by the engine's rule, anything else propagates
            if error.rule == "image-path-exists":
                continue
            if error.rule == "image-exists":
                raise usage_error(f"{image} is neither an existing path nor an image on this engine",
                                  hint="check the path, or build/pull the image first") from None
            raise
        matches = sorted(local.glob(wildcard)) if wildcard else [local]
        found.extend((str(Path(fixed, match.relative_to(local))), match) for match in matches if match.is_dir())
    if not found:
        raise usage_error(f"no python site-packages found in image {image}",
                          hint=f"looked in {', '.join(SITE_PACKAGES_GLOBS)}")
    return found


def _split_glob(pattern: str) -> tuple[str, str]:
    """'/opt/venv/lib/python3.*/site-packages' -> ('/opt/venv/lib', 'python3.*/site-packages')."""
    parts = Path(pattern).parts
    for index, part in enumerate(parts):
        if any(char in part for char in "*?["):
            return str(Path(*parts[:index])), str(Path(*parts[index:]))
    return pattern, ""


def inspect_image(image: str) -> list[abi.PackageReport]:
    """Inspect every python site-packages of an image (see SITE_PACKAGES_GLOBS) without running the image."""
    with tempfile.TemporaryDirectory(prefix="xla-images-abi-") as scratch:
        return [abi.inspect_directory(local, kind="image", display=f"{image}:{inside}")
                for inside, local in extract_site_packages(image, Path(scratch))]


def check_image(image: str) -> list[abi.CheckReport]:
    """check_site_packages for each site-packages of an image that holds torch, without running the image."""
    with tempfile.TemporaryDirectory(prefix="xla-images-abi-") as scratch:
        sites = extract_site_packages(image, Path(scratch))
        system = abi.SystemLibraries(None, library_path_in_copies(image_environment(image), sites))
        reports = [abi.check_site_packages(local, system, display=f"{image}:{inside}")
                   for inside, local in sites if abi.has_torch_libraries(local)]
    if not reports:
        raise usage_error(f"no torch found in {image}",
                          hint=f"looked for torch/lib/libtorch*.so under {', '.join(SITE_PACKAGES_GLOBS)}")
    return reports


def image_environment(image: str) -> dict[str, str]:
    """The image config's Env as a mapping ({} when the engine has no such image: extraction has reported it)."""
    attrs = engine.images.image_inspect(image) or {}
    return dict(item.partition("=")[::2] for item in (attrs.get("Config") or {}).get("Env") or [])


def library_path_in_copies(environment: dict[str, str], sites: list[tuple[str, Path]]) -> tuple[str, ...]:
    """LD_LIBRARY_PATH's directories (abi.library_path_of), in order, each inside a copied site-packages mapped to
    its copy; a directory outside every copy is a system directory of the image, which is not copied (the host's
    directory of the same name must not stand in for it): left out."""
    mapped: list[str] = []
    for directory in abi.library_path_of(environment):
        for inside, local in sites:
            relative = _relative_to(directory, inside)
            if relative is not None:
                mapped.append(str(local / relative) if relative else str(local))
                break
    return tuple(mapped)


def _relative_to(directory: str, root: str) -> str | None:
    """directory below (or equal to) root, lexically ('..' is not resolved: such an entry is left out)."""
    parts, top = Path(directory).parts, Path(root).parts
    if ".." in parts or parts[:len(top)] != top:
        return None
    return str(Path(*parts[len(top):])) if len(parts) > len(top) else ""


def inspect_target(target: str) -> list[abi.PackageReport]:
    """The command line's argument: an existing path (one report), else an image reference."""
    if abi.is_path_target(target):
        return [abi.inspect_path_target(target)]
    return inspect_image(target)


def check_target(target: str) -> list[abi.CheckReport]:
    """The command line's argument: an existing path (one report), else an image reference."""
    if abi.is_path_target(target):
        return [abi.check_path_target(target)]
    return check_image(target)
