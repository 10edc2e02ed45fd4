"""The documentation holds: every runnable example runs, every relative link and every repository path it names
exists, and every command's options are shown in some page.

Runnable examples are the fenced blocks whose info string is `console` (the convention docs/index.md states):
each line that starts with `$ ` is one `./build.py` command that needs no engine, registry or network. They run
in-process through the command line (`xla_images.cli`) with the repository as working directory and an empty
wheel cache, so `render --check --offline` checks the generated files' drift and reads no wheel.
"""
from __future__ import annotations

import glob
import re
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from xla_images.cli import COMMANDS, cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
CONSOLE_BLOCK = re.compile(r"^```console\n(.*?)^```", re.M | re.S)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+)$", re.M)
FENCED = re.compile(r"^```.*?^```", re.M | re.S)
# Paths into the repository a page names in a code span: the package, tests, benchmarks, scripts, templates.
# A placeholder (`<word>`, an upper-case word such as BUILD) stands for any name.
CODE_SPAN = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"(?<![\w./-])((?:xla_images|tests|benchmarks|ci|smoke|templates|wheel-builds|examples)"
                       r"/[\w.*/<>-]*)")
PLACEHOLDER = re.compile(r"<[^>/]*>|\b[A-Z][A-Z_]{2,}\b")
PROGRAMS = ("./build.py", "xla-images")


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def runnable_examples() -> list[tuple[str, str]]:
    """(page, command) of every `$ ` line in a console block, in page order."""
    examples = []
    for page in PAGES:
        for block in CONSOLE_BLOCK.findall(page.read_text(encoding="utf-8")):
            examples += [(_relative(page), line[2:].strip()) for line in block.splitlines() if line.startswith("$ ")]
    return examples


EXAMPLES = runnable_examples()


def test_there_are_runnable_examples() -> None:
    assert len(EXAMPLES) >= 10, EXAMPLES


@pytest.mark.parametrize(("page", "command"), EXAMPLES, ids=[f"{page}: {command}" for page, command in EXAMPLES])
def test_runnable_example_exits_0(page: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    argv = shlex.split(command)
    assert argv[0] in PROGRAMS, f"{page}: a console block runs only {' or '.join(PROGRAMS)}, not {command!r}"
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("XLA_IMAGES_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(cli, argv[1:])
    assert result.exit_code == 0, f"{page}: `{command}` exited {result.exit_code}:\n{result.output}"


def test_every_command_shows_its_options_in_a_page() -> None:
    """Each command's `--help` is a runnable example somewhere, so a new command cannot go undocumented."""
    shown = {tuple(shlex.split(command)[1:-1]) for _, command in EXAMPLES if command.endswith(" --help")}
    words = {getattr(__import__(f"xla_images.cli.{module}", fromlist=[attribute]), attribute).name
             for module, attribute in COMMANDS}
    missing = sorted(word for word in words if (word,) not in shown)
    assert not missing, f"no `./build.py WORD --help` console example for: {', '.join(missing)}"


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = FENCED.sub("", page.read_text(encoding="utf-8"))
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in HEADING.findall(text)}


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_relative_links_point_at_files_and_headings(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue  # https:, mailto:: not ours to check offline
        path_text, _, anchor = target.partition("#")
        linked = (page.parent / path_text).resolve() if path_text else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {_relative(linked)}")
    assert not broken, f"{_relative(page)}:\n  " + "\n  ".join(broken)


@pytest.mark.parametrize("page", PAGES, ids=_relative)
def test_repository_paths_named_exist(page: Path) -> None:
    named = {path.rstrip(".,;:") for span in CODE_SPAN.findall(page.read_text(encoding="utf-8"))
             for path in REPO_PATH.findall(span)}
    missing = sorted(path for path in named if not glob.glob(str(ROOT / PLACEHOLDER.sub("*", path))))
    assert not missing, f"{_relative(page)} names paths that do not exist: {', '.join(missing)}"


def test_index_lists_every_page() -> None:
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    listed = {Path(target.partition("#")[0]).name for target in LINK.findall(index)}
    unlisted = sorted(page.name for page in PAGES if page.parent.name == "docs" and page.name != "index.md"
                      and page.name not in listed)
    assert not unlisted, f"docs/index.md does not list: {', '.join(unlisted)}"
