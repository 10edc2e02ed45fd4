"""How pushed layers are compressed: the site setting `compression` (`format`, `level`) and the OCI facts of each.

`gzip` is what every engine can pull. `zstd` layers pull faster and are smaller, but need Docker 23+ or containerd 1.5+
on the pulling side. Where they are compressed depends on the engine's image store: the containerd store's builds
store them in the chosen compression and the engine pushes them as they are; on the classic store the engine
compresses gzip at push (one core) and the toolkit compresses zstd (Debian's `zstd`, all cores) and pushes it through
the registry API (docs/pulls.md has the table and the measurements).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, Location

FORMATS = ("gzip", "zstd")
ZSTD_LEVELS = range(1, 20)  # 20-22 need `--ultra` and gigabytes of window memory on every puller
DEFAULT_ZSTD_LEVEL = 3  # zstd's own default: measured faster to push than the engine's gzip at a smaller size

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_MEDIA_TYPES = {
    "gzip": ("application/vnd.docker.image.rootfs.diff.tar.gzip", "application/vnd.oci.image.layer.v1.tar+gzip"),
    "zstd": ("application/vnd.oci.image.layer.v1.tar+zstd",),
}
# Which pullers read each format: what `doctor` and the docs tell users.
OLDEST_PULLERS = {
    "gzip": "every engine",
    "zstd": "Docker Engine 23.0+ or containerd 1.5+",
}
ZSTD_MIN_DOCKER = (23, 0)


@dataclass(frozen=True)
class Compression:
    """A layer compression: `gzip` (the engine's, no level) or `zstd` at a level."""

    format: str = "zstd"
    level: int | None = DEFAULT_ZSTD_LEVEL

    @property
    def by_engine(self) -> bool:
        """gzip is always the engine's own push. (zstd is, too, where the engine's image store keeps layers
        compressed: the containerd store, which the run layer asks the engine about.)"""
        return self.format == "gzip"

    @property
    def layer_media_type(self) -> str:
        return LAYER_MEDIA_TYPES[self.format][-1]

    def describe(self) -> str:
        return self.format if self.level is None else f"{self.format} level {self.level}"

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "level": self.level}


def parse_compression(value: Any, where: Location) -> Compression:
    """The `compression` setting: a mapping with `format` (gzip|zstd) and `level` (zstd's, 1-19)."""
    if not isinstance(value, dict) or set(value) - {"format", "level"}:
        raise ConfigError("compression is a mapping of `format` (gzip or zstd) and `level`", location=where,
                          rule="site-compression", hint="for example compression: {format: zstd, level: 3}")
    layer_format = value.get("format")
    if layer_format not in FORMATS:
        raise ConfigError(f"compression format must be gzip or zstd, not {str(layer_format)[:40]!r}", location=where,
                          rule="site-compression", hint="gzip: every engine pulls it; zstd: faster, Docker 23+")
    if layer_format == "gzip":
        # The engine compresses gzip layers at its own level. `level` stays zstd's: a site that switches to gzip
        # with `--set compression.format=gzip` keeps the built-in zstd level, which then does not apply.
        return Compression("gzip", None)
    level = value.get("level")
    if level is None:
        return Compression("zstd", DEFAULT_ZSTD_LEVEL)
    if isinstance(level, bool) or not isinstance(level, int) or level not in ZSTD_LEVELS:
        raise ConfigError(f"zstd level must be a whole number from {ZSTD_LEVELS.start} to {ZSTD_LEVELS.stop - 1}, "
                          f"not {str(level)[:40]!r}", location=where, rule="site-compression",
                          hint=f"{DEFAULT_ZSTD_LEVEL} is zstd's default; 19 is smallest and slowest to push")
    return Compression("zstd", level)
