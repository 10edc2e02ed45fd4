"""The `build.py` / `xla-images` command line: parse options, call one function, print.

Errors users can cause are XlaImagesError: printed with file, line, rule and hint, exit code 2 for
configuration or usage, 1 for a failed build, check or push. Never a traceback.
"""
from __future__ import annotations

import errno
import importlib
import signal
import sys

import click

from .. import diskio
from ..errors import XlaImagesError
from ..extras import missing_dependency_message

DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)

# (module under xla_images.cli, attribute): each is a click command or group registered on the main group.
COMMANDS = (
    ("matrix", "list_flavours"),
    ("matrix", "validate"),
    ("render", "render"),
    ("render", "lint"),
    ("lock", "lock"),
    ("wheels", "wheels"),
    ("update", "update"),
    ("base", "base"),
    ("build", "build"),
    ("doctor", "doctor"),
    ("test", "test"),
    ("bench", "bench"),
    ("publish", "push"),
    ("ship", "ship"),
    ("publish", "resolve"),
    ("publish", "pull"),
    ("publish", "published"),
    ("sbom", "sbom"),
    ("sign", "sign"),
    ("sign", "verify"),
    ("lifecycle", "promote"),
    ("lifecycle", "prune"),
    ("abi", "abi"),
    ("ci", "ci"),
    ("explain", "explain"),
    ("run_spec", "run_spec"),
)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def cli() -> None:
    """xla-images: build, test and ship PyTorch/XLA images in both C++ ABI flavours.

    \b
    The flow: matrix.yaml -> validate -> render Dockerfiles/<tag>/ -> lock wheels -> build images
    -> test (image checks + smoke suite) -> push to a registry -> resolve a flavour to ref@digest.
    Start with `build.py list`, then `build.py doctor`.
    """


def _register() -> None:
    for module_name, attribute in COMMANDS:
        try:
            module = importlib.import_module(f"{__name__}.{module_name}")
        except ModuleNotFoundError as error:
            # Only tolerate the command module itself being absent (a partial checkout), never a broken import.
            if error.name != f"{__name__}.{module_name}":
                raise
            continue
        cli.add_command(getattr(module, attribute))


_register()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt()


def main(argv: list[str] | None = None) -> None:
    # SIGTERM (CI cancelling a job, `kill`) cleans up like Ctrl-C: a push's temporary tag, a test's container.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        cli.main(args=argv, standalone_mode=False)
    except XlaImagesError as error:
        click.echo(error.render(), err=True)
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as error:
        error.show()
        sys.exit(2 if isinstance(error, click.UsageError) else error.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except ModuleNotFoundError as error:
        # A dependency a command imports when it runs (pytest for the image checks, say) is missing.
        message = missing_dependency_message(error)
        if message is None:
            raise
        click.echo(message, err=True)
        sys.exit(2)
    except OSError as error:
        # A full or read-only disk under a writer that did not say where: still one clear line, no traceback.
        if error.errno not in DISK_ERRNOS:
            raise
        click.echo(diskio.failure(error).render(), err=True)
        sys.exit(1)
