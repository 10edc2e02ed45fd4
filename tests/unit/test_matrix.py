"""matrix.yaml validation: one broken matrix per rule, the committed matrix binds, and a fuzz."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from golden import two_releases
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xla_images import yamlsrc
from xla_images.errors import ConfigError, ErrorList, XlaImagesError
from xla_images.model.flavour import Abi, Accelerator
from xla_images.model.matrix import expand, load_flavours, select
from xla_images.model.site import load_site
from xla_images.model.target import bind

ROOT = Path(__file__).resolve().parents[2]

GOOD = two_releases(('pythons: ["3.10", "3.11", "3.12"]', 'pythons: ["3.10", "3.11"]'))


def flavours_of(text: str, path: str = "m.yaml"):
    return bind(expand(yamlsrc.loads(textwrap.dedent(text), path)), load_site(None))


def errors_of(text: str) -> list[XlaImagesError]:
    with pytest.raises(ConfigError) as caught:
        flavours_of(text)
    error = caught.value
    return error.errors if isinstance(error, ErrorList) else [error]


def only_error(text: str, rule: str) -> XlaImagesError:
    errors = errors_of(text)
    matching = [error for error in errors if error.rule == rule]
    assert matching, f"no {rule} error among {[e.render() for e in errors]}"
    return matching[0]


def line_of(text: str, needle: str) -> int:
    return next(number for number, line in enumerate(text.splitlines(), 1) if needle in line)


def test_good_matrix_expands_axes() -> None:
    flavours = flavours_of(GOOD)
    tags = [flavour.tag for flavour in flavours]
    assert tags == [
        "r2.6.0_3.10_tpuvm", "r2.6.0_3.10_tpuvm_cxx11", "r2.6.0_3.10_cpu", "r2.6.0_3.10_cpu_cxx11",
        "r2.6.0_3.11_tpuvm", "r2.6.0_3.11_tpuvm_cxx11", "r2.6.0_3.11_cpu", "r2.6.0_3.11_cpu_cxx11",
        "r2.9.0_3.10_tpuvm", "r2.9.0_3.10_cpu", "r2.9.0_3.11_tpuvm", "r2.9.0_3.11_cpu",
    ]
    latest = [flavour for flavour in flavours if "latest" in flavour.aliases]
    assert [flavour.tag for flavour in latest] == ["r2.9.0_3.11_tpuvm"]


def test_unquoted_python_versions_keep_their_text() -> None:
    flavours = flavours_of(GOOD.replace('pythons: ["3.10", "3.11"]', "pythons: [3.10, 3.11]"))
    assert {flavour.python for flavour in flavours} == {"3.10", "3.11"}


@pytest.mark.parametrize(
    ("old", "new", "rule", "needle"),
    [
        ("schema: 1", "schema: 2", "schema-version", "schema: 2"),
        ("schema: 1\n", "", "schema-missing", None),
        ("  accelerators: [tpu, cpu]", "  acelerators: [tpu, cpu]", "schema-unknown-key", "acelerators"),
        ('    torch: "2.9.0"', '    torch: "2.8.0"', "torch-pin", 'torch: "2.8.0"'),
        ('    torch: "2.9.0"', "    torch: [2]", "schema-type", "torch: [2]"),
        ('    torch: "2.9.0"\n', "", "schema-missing", '"2.9.0":'),
        ('  "2.9.0":', '  "2.9":', "version-format", '"2.9":'),
        ('    libtpu: "0.0.21"', '    libtpu: "latest"', "version-format", 'libtpu: "latest"'),
        ('    libtpu: "0.0.21"\n', "", "libtpu-pin", '"2.9.0":'),
        ("    abis: [pre-cxx11, cxx11]", "    abis: [pre-cxx11, cxx12]", "schema-type", "cxx12"),
        ('    python_support: ">=3.9,<3.12"', '    python_support: "3.9+"', "schema-type", "3.9+"),
        ('    python_support: ">=3.10,<3.14"', '    python_support: ">=3.12"', "python-supported", '"2.9.0":'),
        ('    libtpu: "0.0.21"', '    libtpu: "0.0.21"\n    abis: [pre-cxx11]', "abi-wheel-source",
         "abis: [pre-cxx11]"),
        ('    libtpu: "0.0.21"', '    libtpu: "0.0.21"\n    torchvision: "0.24.0"\n    companions: [torchvison]',
         "companion-name", "companions:"),
        ('    libtpu: "0.0.21"', '    libtpu: "0.0.21"\n    torchvision: "0.24.0"\n    companions:\n'
         '      - torchvision\n      - pillow', "companion-name", "- pillow"),
        ('    libtpu: "0.0.21"', '    libtpu: "0.0.21"\n    torchvision: "0.24.0"\n    companions: [torchaudio]',
         "companion-version", "companions:"),
        ('    libtpu: "0.0.21"', '    libtpu: "0.0.21"\n    companions: torchvision', "schema-type", "companions:"),
        ('    libtpu: "0.0.7.1"', '    libtpu: "0.0.7.1"\n    torchvision: "0.21.0"\n    companions: [torchvision]',
         "companion-abi", "companions:"),
        ('    libtpu: "0.0.21"', '    libtpu: "0.0.21"\n    torchvision: "latest"', "version-format", "torchvision:"),
    ],
)
def test_each_rule_names_file_line_and_fix(old: str, new: str, rule: str, needle: str | None) -> None:
    assert old in GOOD
    text = GOOD.replace(old, new, 1)
    error = only_error(text, rule)
    rendered = error.render()
    assert rendered.startswith("m.yaml"), rendered
    assert f"[{rule}]" in rendered
    assert error.hint, "every error says how to fix it"
    if needle is not None:
        assert error.location.line == line_of(text, needle), rendered


def test_an_unknown_companion_says_which_exist() -> None:
    text = GOOD.replace('    libtpu: "0.0.21"', '    libtpu: "0.0.21"\n    torchvision: "0.24.0"\n'
                        '    companions: [torchvison, torchvision, torchvision]')
    errors = errors_of(text)
    assert [error.rule for error in errors] == ["companion-name", "schema-duplicate"]
    assert "did you mean 'torchvision'" in errors[0].hint and "torchvision, torchaudio" in errors[0].hint
    assert errors[0].render().startswith(f"m.yaml:{line_of(text, 'companions:')}: error [companion-name]")


def test_companions_are_release_facts_and_installed_ones_are_requirements() -> None:
    text = GOOD.replace('    libtpu: "0.0.21"', '    libtpu: "0.0.21"\n    torchvision: "0.24.0"\n'
                        '    torchaudio: "2.9.0"\n    companions: [torchaudio, torchvision]')
    flavours = {flavour.tag: flavour for flavour in flavours_of(text)}
    cpu, tpu, old = flavours["r2.9.0_3.11_cpu"], flavours["r2.9.0_3.11_tpuvm"], flavours["r2.6.0_3.11_cpu"]
    assert cpu.companion_versions == (("torchvision", "0.24.0"), ("torchaudio", "2.9.0"))
    assert cpu.requirements == ("torch==2.9.0", "torch_xla==2.9.0", "torchvision==0.24.0", "torchaudio==2.9.0")
    assert tpu.layer_requirements == ("torch==2.9.0", "torch_xla==2.9.0", "libtpu==0.0.21")  # never layer roots
    assert cpu.pinned_versions["torchvision"] == "0.24.0"
    assert cpu.env["XLA_IMAGES_COMPANIONS"] == "torchvision==0.24.0 torchaudio==2.9.0"
    assert cpu.labels["io.xla-images.companions"] == "torchvision==0.24.0 torchaudio==2.9.0"
    assert old.companions == () and "XLA_IMAGES_COMPANIONS" not in old.env and len(old.requirements) == 2
    recorded_only = {flavour.tag: flavour for flavour in flavours_of(text.replace(
        "    companions: [torchaudio, torchvision]\n", ""))}["r2.9.0_3.11_cpu"]
    assert recorded_only.requirements == ("torch==2.9.0", "torch_xla==2.9.0")
    assert recorded_only.env == {key: value for key, value in cpu.env.items() if key != "XLA_IMAGES_COMPANIONS"}


def test_python_outside_release_support_is_rejected() -> None:
    text = GOOD.replace('    libtpu: "0.0.21"', '    libtpu: "0.0.21"\n    pythons: ["3.9"]')
    error = only_error(text, "python-supported")
    assert "3.9" in error.message and error.location.line == line_of(text, 'pythons: ["3.9"]')


def test_pre_cxx11_after_2_7_is_allowed_when_a_source_serves_it() -> None:
    text = GOOD.replace('    libtpu: "0.0.21"', '    libtpu: "0.0.21"\n    abis: [cxx11, pre-cxx11]')
    site = load_site(None, ("wheel_sources=[{name: precxx11-mirror, match: {abi: pre-cxx11},"
                            " find_links: /srv/wheels}, {name: index, match: {}}]",))
    flavours = bind(expand(yamlsrc.loads(text, "m.yaml")), site)
    pre = [f for f in flavours if f.torch_xla == "2.9.0" and f.abi is Abi.PRE_CXX11]
    assert pre and all(f.tag.endswith("_precxx11") for f in pre)
    assert all(f.wheel_local_version == "+precxx11" for f in pre)
    assert pre[0].wheel_source.name == "precxx11-mirror"


def test_exclude_that_matches_nothing_is_an_error() -> None:
    text = GOOD + 'exclude:\n  - {torch_xla: "2.9", python: "3.11"}\n'
    error = only_error(text, "exclude-matches")
    assert error.location.line == line_of(text, '{torch_xla: "2.9"')


def test_exclude_removes_flavours() -> None:
    text = GOOD + 'exclude:\n  - {python: "3.10", accelerator: cpu}\n'
    flavours = flavours_of(text)
    assert not [f for f in flavours if f.python == "3.10" and f.accelerator is Accelerator.CPU]
    assert len(flavours) == 9


def test_duplicate_python_is_an_error() -> None:
    # Two releases of one minor with the same patch cannot exist as YAML keys, but a python listed twice can;
    # it is refused where it is written (schema-duplicate), before it could expand to two equal tags.
    text = GOOD.replace('    libtpu: "0.0.21"', '    libtpu: "0.0.21"\n    pythons: ["3.11", "3.11"]')
    error = only_error(text, "schema-duplicate")
    assert "3.11" in error.message
    assert error.location.line == line_of(text, 'pythons: ["3.11", "3.11"]')


def test_yaml_syntax_error_has_a_line() -> None:
    error = only_error('schema: 1\nreleases:\n  "2.9.0": [\n    torch: 1\n', "yaml-syntax")
    assert error.location.line is not None


def test_duplicate_key_is_an_error() -> None:
    text = GOOD.replace('    pytorch_git_rev: v2.9.1', '    pytorch_git_rev: v2.9.1\n    pytorch_git_rev: v2.9.0')
    error = only_error(text, "yaml-duplicate-key")
    assert error.location.line == line_of(text, "pytorch_git_rev: v2.9.0")


def test_all_errors_reported_in_one_pass() -> None:
    text = GOOD.replace('    torch: "2.9.0"', '    torch: "2.8.0"').replace("schema: 1", "schema: 1\nextra: 1")
    rules = {error.rule for error in errors_of(text)}
    assert {"torch-pin", "schema-unknown-key"} <= rules


# --- the committed matrix -----------------------------------------------------------------------------------

def test_select_by_alias_and_filters() -> None:
    # The committed matrix's tags and aliases are pinned in one place: tests/golden/committed-matrix.json.
    flavours = flavours_of(GOOD)
    assert [f.tag for f in select(flavours, ("latest",))] == ["r2.9.0_3.11_tpuvm"]
    chosen = select(flavours, (), abi="cxx11", python="3.11", torch_xla="2.9")
    assert [f.tag for f in chosen] == ["r2.9.0_3.11_tpuvm", "r2.9.0_3.11_cpu"]
    with pytest.raises(ConfigError, match="unknown flavour"):
        select(flavours, ("r9.9.9_3.11_tpuvm",))


def test_committed_matrix_validates_and_binds() -> None:
    """Whatever the committed matrix holds, it expands, binds to the default site and has one `latest`."""
    flavours = bind(load_flavours(ROOT / "matrix.yaml"), load_site(None))
    assert flavours and len({f.tag for f in flavours}) == len(flavours)
    assert sum("latest" in f.aliases for f in flavours) <= 1


# --- fuzz: whatever the input, an error and never a traceback ------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                         st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                      max_leaves=10)
known_keys = st.sampled_from(["schema", "defaults", "releases", "exclude", "torch", "pythons", "abis", "libtpu",
                              "python_support", "accelerators", "default_abi", "2.9.0", "3.11"])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.one_of(known_keys, st.text(max_size=5)), values, max_size=5))
def test_fuzz_structures_give_errors_not_tracebacks(data) -> None:
    import yaml

    text = yaml.safe_dump(data)
    try:
        flavours_of(text)
    except ConfigError as error:
        assert error.render()


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_fuzz_text_gives_errors_not_tracebacks(text: str) -> None:
    try:
        flavours_of(text)
    except ConfigError as error:
        assert error.render()


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=len(GOOD) - 1), st.text(max_size=6))
def test_fuzz_mutations_of_a_good_matrix(position: int, insertion: str) -> None:
    text = GOOD[:position] + insertion + GOOD[position:]
    try:
        flavours_of(text)
    except ConfigError as error:
        assert error.render()


def test_latest_python_none_gives_no_latest_tags(tmp_path: Path) -> None:
    text = (ROOT / "matrix.yaml").read_text().replace('latest_python: "3.11"', "latest_python: none")
    assert "latest_python: none" in text
    path = tmp_path / "matrix.yaml"
    path.write_text(text)
    flavours = bind(load_flavours(path), load_site(None))
    assert flavours and not any(alias.startswith("latest") for f in flavours for alias in f.aliases)
