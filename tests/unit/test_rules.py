"""The rule catalogue (xla_images/rules.py) and the code agree, and `build.py explain` answers for every rule.

The code's rules are read from the source (ast), not from a run: every string that reaches a `rule` — a
`rule=` keyword, the `rule` parameter of any function or class that takes one (its default too), a `RULE…`
constant passed there, a local assigned before — and every rule an `error.rule` is compared with. abi/ is read
the same way: it runs standalone (abi.pyz holds only errors.py of xla_images), so it keeps its rule names in
abi/words.py and never imports the catalogue, but its rules are catalogued and explained like every other.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from xla_images import rules
from xla_images.cli import cli
from xla_images.errors import ConfigError, Failure

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "xla_images"
DOCS = ROOT / "docs"
RULE_ID = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")


def _strings(node: ast.AST) -> set[str]:
    return {found.value for found in ast.walk(node)
            if isinstance(found, ast.Constant) and isinstance(found.value, str) and RULE_ID.fullmatch(found.value)}


def _callable_name(func: ast.expr) -> str | None:
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _rule_parameters(trees: dict[Path, ast.Module]) -> tuple[dict[str, int], list[ast.expr]]:
    """Name -> position of its `rule` parameter (self dropped; a class by its __init__), and their defaults."""
    positions: dict[str, int] = {}
    defaults: list[ast.expr] = []
    for tree in trees.values():
        for node in ast.walk(tree):
            functions = [(node.name, item) for item in node.body if isinstance(item, ast.FunctionDef)
                         and item.name == "__init__"] if isinstance(node, ast.ClassDef) else (
                [(node.name, node)] if isinstance(node, ast.FunctionDef) else [])
            for name, function in functions:
                arguments = function.args
                names = [argument.arg for argument in arguments.args]
                if names[:1] in (["self"], ["cls"]):
                    names = names[1:]
                names_kw = [argument.arg for argument in arguments.kwonlyargs]
                if "rule" in names:
                    positions.setdefault(name, names.index("rule"))
                    index = [argument.arg for argument in arguments.args].index("rule")
                    offset = index - (len(arguments.args) - len(arguments.defaults))
                    if offset >= 0:
                        defaults.append(arguments.defaults[offset])
                elif "rule" in names_kw:
                    default = arguments.kw_defaults[names_kw.index("rule")]
                    if default is not None:
                        defaults.append(default)
    return positions, defaults


def scan(package: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(rules raised, rules compared with), each -> the places (path:line) that name it."""
    trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in sorted(package.rglob("*.py"))}
    assigned: dict[Path, dict[str, set[str]]] = {}
    everywhere: dict[str, set[str]] = {}
    for path, tree in trees.items():
        table = assigned.setdefault(path, {})
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                    if isinstance(target, ast.Name):
                        table.setdefault(target.id, set()).update(_strings(node.value))
                        everywhere.setdefault(target.id, set()).update(_strings(node.value))

    def values(path: Path, expr: ast.expr) -> set[str]:
        if isinstance(expr, ast.Name):  # a local or module constant, else one imported (RULE_PATH from words)
            return assigned[path].get(expr.id, everywhere.get(expr.id, set()))
        if isinstance(expr, ast.Attribute):
            return set()  # error.rule, self.rule: a rule already raised elsewhere, passed on
        return _strings(expr)

    positions, defaults = _rule_parameters(trees)
    raised: dict[str, set[str]] = {}
    compared: dict[str, set[str]] = {}
    for path, tree in trees.items():
        where = path.relative_to(package.parent)
        for default in defaults:
            if any(default is node for node in ast.walk(tree)):
                for rule in values(path, default):
                    raised.setdefault(rule, set()).add(f"{where}:{default.lineno}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                exprs = [keyword.value for keyword in node.keywords if keyword.arg == "rule"]
                name = _callable_name(node.func)
                if not exprs and name in positions and len(node.args) > positions[name]:
                    exprs = [node.args[positions[name]]]
                for expr in exprs:
                    for rule in values(path, expr):
                        raised.setdefault(rule, set()).add(f"{where}:{node.lineno}")
            elif isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                if any(isinstance(side, ast.Attribute) and side.attr == "rule" for side in sides):
                    for side in sides:
                        for rule in values(path, side):
                            compared.setdefault(rule, set()).add(f"{where}:{node.lineno}")
    return raised, compared


def uncatalogued(package: Path) -> list[str]:
    raised, compared = scan(package)
    return sorted(f"{rule} ({sorted(places)[0]})" for rule, places in {**compared, **raised}.items()
                  if rule not in rules.RULES)


RAISED, COMPARED = scan(PACKAGE)


def test_the_scan_finds_the_rules_of_every_form() -> None:
    # a keyword literal, a positional rule parameter (matrix._Collector.error), a constant from abi/words, a
    # parameter default (abi usage_error's abi-input), a class's __init__ (registry.upload.BlobUpload "push").
    for rule in ("disk-outside", "schema-type", "abi-path-readable", "abi-input", "push", "update-edit"):
        assert rule in RAISED, rule
    assert len(RAISED) >= 170


def test_every_rule_raised_or_compared_anywhere_is_in_the_catalogue() -> None:
    missing = uncatalogued(PACKAGE)
    assert not missing, ("rules the code raises that xla_images/rules.py does not list (add a Rule(...) line, then "
                         f"`./build.py render`): {', '.join(missing)}")


def test_a_made_up_rule_fails_the_catalogue_check(tmp_path: Path) -> None:
    package = tmp_path / "xla_images"
    package.mkdir()
    (package / "new.py").write_text(
        'from .errors import ConfigError\nRULE_SLOW = "made-up-slow"\n\n'
        'def check(value):\n    if value:\n        raise ConfigError("x", rule="made-up-rule")\n'
        '    raise Failure("y", rule=RULE_SLOW)\n\n'
        'def fail(message, rule="made-up-default"):\n    return message\n', encoding="utf-8")
    assert [entry.split(" ")[0] for entry in uncatalogued(package)] == ["made-up-default", "made-up-rule",
                                                                         "made-up-slow"]


def test_every_catalogued_rule_is_raised_somewhere() -> None:
    unused = sorted(set(rules.RULES) - set(RAISED))
    assert not unused, f"catalogued rules no module raises (remove them from xla_images/rules.py): {unused}"


def test_catalogue_ids_are_unique_and_well_formed() -> None:
    ids = [rule.id for rule in rules.CATALOGUE]
    assert len(ids) == len(set(ids)), sorted({rule for rule in ids if ids.count(rule) > 1})
    assert all(RULE_ID.fullmatch(rule) for rule in ids)
    for rule in rules.CATALOGUE:
        assert rule.meaning and rule.fix and "\n" not in rule.meaning + rule.fix, rule.id


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings (as tests/unit/test_docs.py makes them)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
            for heading in re.findall(r"^#{1,6} (.+)$", text, re.M)}


@pytest.mark.parametrize("rule", rules.CATALOGUE, ids=lambda rule: rule.id)
def test_every_rule_points_at_a_doc_section_that_exists_and_is_listed_in_rules_md(rule: rules.Rule) -> None:
    page, _, anchor = rule.doc.partition("#")
    assert (DOCS / page).is_file(), rule.doc
    assert anchor in _anchors(DOCS / page), f"{rule.id}: no heading #{anchor} in docs/{page}"
    assert f"| `{rule.id}` |" in (DOCS / "rules.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("rule", sorted(rules.RULES))
def test_explain_answers_for_every_rule(rule: str) -> None:
    result = CliRunner().invoke(cli, ["explain", rule])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"[{rule}] ") and rules.RULES[rule].fix in result.output
    assert f"docs/{rules.RULES[rule].doc}" in result.output


def test_explain_an_unknown_rule_exits_2_with_the_closest(tmp_path: Path) -> None:
    from xla_images.cli import main

    runner = CliRunner()
    with runner.isolation() as (_, err, _):
        with pytest.raises(SystemExit) as exit_:
            main(["explain", "yaml-syntx"])
    assert exit_.value.code == 2
    text = err.getvalue().decode()
    assert "error [rule-unknown]: no rule 'yaml-syntx'" in text and "did you mean yaml-syntax" in text


def test_explain_takes_the_rule_as_pasted_from_an_error() -> None:
    assert rules.explain("[disk-outside]").startswith("[disk-outside] ")


@pytest.mark.parametrize("error", [ConfigError("bad", location="m.yaml:3", rule="schema-type", hint="fix it"),
                                   Failure("down", rule="registry-reachable")])
def test_every_rendered_error_ends_with_its_rule_to_paste_into_explain(error: ConfigError) -> None:
    text = error.render()
    assert text.splitlines()[0].startswith(f"{error.location + ': ' if error.location else ''}error [{error.rule}]:")
    assert text.splitlines()[-1] == f"  explain: build.py explain {error.rule}"
    assert text.rsplit(" ", 1)[-1] in rules.RULES
