"""Options and helpers the commands share: --matrix, --site, --set and the plan they load, the flavour filters,
--published, --reports, `say` for progress lines, `figure` for table cells, and SIGTERM as Ctrl-C."""
from __future__ import annotations

import contextlib
import functools
import os
import signal
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from .. import settings
from ..errors import ConfigError
from ..generate.plan import Plan, load_plan
from ..model.flavour import Abi, Accelerator, Variant
from ..model.target import Target
from ..names import PUBLISHED_NAME, REPORTS
from ..userfiles import resolve_path

DEFAULT_SITE = "site.yaml"
ALL_VARIANTS = "all"
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def say(line: str) -> None:
    """A progress line, on stderr: stdout stays for what a script reads (tables, JSON, references)."""
    click.echo(line, err=True)


def published_option(what: str = "The record of verified pushes") -> Decorator:
    """--published PATH (parameter `published_path`)."""
    return click.option("--published", "published_path", type=click.Path(path_type=Path), default=None,
                        help=f"{what} (default: {PUBLISHED_NAME} next to the matrix).")


def reports_option(what: str = "reports/<tag>/") -> Decorator:
    """--reports DIR (parameter `reports_dir`): a folder; an existing file there is a usage error."""
    return click.option("--reports", "reports_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                        help=f"Where {what} go (default: {REPORTS}/ next to the matrix).")


def plan_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --matrix/--site/--set and pass a loaded Plan as the `plan` argument."""

    @click.option("--matrix", "matrix_path", type=click.Path(path_type=Path), default=Path("matrix.yaml"),
                  show_default=True, help="The matrix of flavours.")
    @click.option("--site", "site_path", type=click.Path(path_type=Path), default=None,
                  help=f"Site settings file (default: {DEFAULT_SITE} next to the matrix, if present).")
    @click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                  help="Override a site setting, e.g. --set registry=127.0.0.1:5000/xla-images. Repeatable. KEY: "
                       + ", ".join(setting.set_key or setting.name for setting in settings.SITE_SETTINGS) + ".")
    @functools.wraps(command)
    def wrapper(*args: Any, matrix_path: Path, site_path: Path | None, overrides: tuple[str, ...],
                **kwargs: Any) -> Any:
        if site_path is None:
            candidate = resolve_path(matrix_path).parent / DEFAULT_SITE
            # Anything there (a directory, fifo, broken link) is read, so the reader names what is wrong with it:
            # a site.yaml silently skipped would build with other settings than the user wrote.
            site_path = candidate if os.path.lexists(candidate) else None
        plan = load_plan(matrix_path, site_path, overrides)
        return command(*args, plan=plan, **kwargs)

    return wrapper


def flavour_filters(command: Callable[..., Any]) -> Callable[..., Any]:
    """--abi/--python/--torch-xla/--accelerator, passed on as a `filters` dict."""

    @click.option("--abi", type=click.Choice([abi.value for abi in Abi]), help="Only this C++ ABI.")
    @click.option("--python", "python", metavar="X.Y", help="Only this python, e.g. 3.11.")
    @click.option("--torch-xla", "torch_xla", metavar="VERSION", help="Only this torch_xla (2.9 or 2.9.0).")
    @click.option("--accelerator", type=click.Choice([accelerator.value for accelerator in Accelerator]),
                  help="Only this accelerator.")
    @click.option("--variant", type=click.Choice([*(variant.value for variant in Variant), ALL_VARIANTS]),
                  help="runtime images, devel images (`<tag>_devel`: the runtime image plus a C++ toolchain), or "
                       "all (default: runtime, or what the named tags are).")
    @functools.wraps(command)
    def wrapper(*args: Any, abi: str | None, python: str | None, torch_xla: str | None, accelerator: str | None,
                variant: str | None, **kwargs: Any) -> Any:
        filters = {"abi": abi, "python": python, "torch_xla": torch_xla, "accelerator": accelerator}
        if variant is not None:  # absent: the plan's default (runtime images unless tags are named)
            filters["variant"] = None if variant == ALL_VARIANTS else variant
        return command(*args, filters=filters, **kwargs)

    return wrapper


def figure(value: Any, pattern: str) -> str:
    """A measured value for a table cell, or "-" when it was not measured."""
    return "-" if value is None else pattern.format(value)


def in_ci() -> bool:
    """CI logs want plain lines, not live displays."""
    return settings.read_ci()


def select(plan: Plan, names: tuple[str, ...], filters: dict[str, str | None]) -> list[Target]:
    chosen = plan.select(names, **filters)
    if not chosen:
        raise ConfigError("no flavour matches", rule="flavour-exists",
                          hint="`build.py list` shows what the matrix declares; loosen the filters")
    return chosen


@contextlib.contextmanager
def interrupts_on_sigterm() -> Iterator[None]:
    """SIGTERM (CI cancelling a job, `docker stop`, kill) cleans up like Ctrl-C does."""

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt()

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
