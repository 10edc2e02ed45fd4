"""xla_images.abi on shared libraries compiled here with g++ under both values of _GLIBCXX_USE_CXX11_ABI.

Nothing is mocked except the engine in the image error-path tests: the libraries are real compiler output, and
the predictions of `check` are confirmed by loading the extensions with ctypes (RTLD_NOW, as python does).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from xla_images import abi
from xla_images.abi import inspection
from xla_images.abi import standalone as abi_standalone
from xla_images.run.checking import abi_images
from xla_images.cli.abi import abi as abi_group
from xla_images.errors import ConfigError, Failure

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "abi"
REPO = Path(__file__).resolve().parents[2]
EXTENSION = "_XLAC.cpython-311-x86_64-linux-gnu.so"

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++ to compile the test libraries")


def compile_library(source: str, output: Path, *, cxx11: bool, flags: tuple[str, ...] = ()) -> Path:
    output.parent.mkdir(parents=True, exist_ok=True)
    command = ["g++", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11)}",
               f"-I{FIXTURES}", str(FIXTURES / source), "-o", str(output), *flags]
    subprocess.run(command, check=True, capture_output=True, text=True)
    return output


def link_mixed_units(output: Path, units: dict[str, bool], *flags: str) -> Path:
    """One library from several units, each compiled with its own ABI (source[:variant] -> cxx11?)."""
    objects = []
    for number, (unit, cxx11) in enumerate(units.items()):
        obj = output.with_name(f"{output.stem}.{number}.o")
        variant = [f"-D{unit.split(':')[1]}"] if ":" in unit else []
        subprocess.run(["g++", "-std=c++17", "-c", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={int(cxx11)}", *variant,
                        *flags, str(FIXTURES / unit.split(":")[0]), "-o", str(obj)], check=True,
                       capture_output=True, text=True)
        objects.append(str(obj))
    subprocess.run(["g++", "-shared", *objects, "-o", str(output)], check=True, capture_output=True, text=True)
    return output


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("abi-libs")
    for cxx11 in (False, True):
        compile_library("fake_torch.cpp", directory / f"torch{int(cxx11)}" / "libtorch.so", cxx11=cxx11)

    def linked(cxx11: bool, rpath: str, *extra: str) -> tuple[str, ...]:
        # DT_NEEDED records only the name libtorch.so; the site layout's rpath finds whichever torch is there.
        return ("-L", str(directory / f"torch{int(cxx11)}"), "-ltorch", f"-Wl,-rpath,{rpath}", *extra)

    jobs = [
        ("strings.cpp", "libstrings_pre.so", False, ()),
        ("strings.cpp", "libstrings_cxx11.so", True, ()),
        ("plain.cpp", "libplain.so", True, ()),
        ("tricky_names.cpp", "libtricky.so", False, ()),
        ("needs_new_glibc.cpp", "libnewglibc.so", True, ()),
        ("extension.cpp", "extension0.so", False, linked(False, "$ORIGIN/torch/lib")),
        ("extension.cpp", "extension1.so", True, linked(True, "$ORIGIN/torch/lib")),
        ("extension.cpp", "extension_newer.so", True, linked(True, "$ORIGIN/torch/lib", "-DFAKE_TORCH_NEWER_API")),
        ("extension.cpp", "plugin/_ops.so", True, linked(True, "$ORIGIN/../torch/lib")),
        ("extension.cpp", "plugin_pre/_ops.so", False, linked(False, "$ORIGIN/../torch/lib")),
        ("cuda_stub.cpp", "cuda_stub.so", True, ()),
    ]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda job: compile_library(job[0], directory / job[1], cxx11=job[2], flags=job[3]), jobs))
    return directory


@dataclass
class Site:
    path: Path
    extension: Path


def make_site(root: Path, built: Path, *, torch_cxx11: bool, extension_cxx11: bool, newer_api: bool = False,
              plugin: bool = False) -> Site:
    """A site-packages: torch/lib/libtorch.so, _XLAC*.so linking it, optionally a plugin and a bystander."""
    library = root / "torch" / "lib"
    library.mkdir(parents=True)
    shutil.copy(built / f"torch{int(torch_cxx11)}" / "libtorch.so", library / "libtorch.so")
    assert not (newer_api and not extension_cxx11), "the newer-API extension is built with the C++11 ABI"
    extension = root / EXTENSION
    shutil.copy(built / ("extension_newer.so" if newer_api else f"extension{int(extension_cxx11)}.so"), extension)
    if plugin:  # built like torch
        (root / "plugin").mkdir()
        shutil.copy(built / ("plugin" if torch_cxx11 else "plugin_pre") / "_ops.so", root / "plugin" / "_ops.so")
        shutil.copy(built / "libplain.so", root / "plugin" / "libbystander.so")
    return Site(root, extension)


def run_standalone(*arguments: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xla_images.abi", *arguments], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def load_error(path: Path) -> str | None:
    """None when the dynamic linker loads path with every symbol bound (RTLD_NOW, as python imports), else its
    error. In a fresh process: a libtorch.so loaded by an earlier test would satisfy DT_NEEDED by name."""
    code = "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW | os.RTLD_LOCAL)"
    completed = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    return None if completed.returncode == 0 else completed.stderr.strip().splitlines()[-1]


# --- classification -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "expected"), [("libstrings_pre.so", abi.PRE_CXX11),
                                                ("libstrings_cxx11.so", abi.CXX11)])
def test_string_library_takes_the_abi_it_was_compiled_with(built: Path, name: str, expected: str) -> None:
    report = abi.classify_shared_object(built / name)
    assert report.abi == expected
    assert report.abi_basis == "interface"
    if expected == abi.CXX11:
        assert report.cxx11_symbols > 0 and report.pre_cxx11_symbols == 0
    else:
        assert report.pre_cxx11_symbols > 0 and report.cxx11_symbols == 0


@pytest.mark.parametrize("name", ["libplain.so", "libtricky.so"])
def test_library_without_strings_is_none(built: Path, name: str) -> None:
    report = abi.classify_shared_object(built / name)
    assert (report.abi, report.cxx11_symbols, report.pre_cxx11_symbols) == (abi.NO_STRINGS, 0, 0)


def test_identifiers_spelling_ss_are_not_read_as_std_string(built: Path) -> None:
    with open(built / "libtricky.so", "rb") as handle:
        names = handle_names(abi.read_elf_dynamic(handle))
    tricky = [name for name in names if "Ss" in name or "Sb" in name or "St4list" in name]
    assert len(tricky) >= 3, names  # the fixture really exercises the scanner
    assert [abi.symbol_abi(name) for name in tricky] == [(False, False)] * len(tricky)


def handle_names(info: abi.ElfDynamic) -> list[str]:
    return sorted(info.defined) + [symbol.name for symbol in info.undefined]


def test_old_abi_code_inside_a_cxx11_library_does_not_make_it_mixed(built: Path) -> None:
    """Like gcc-toolset's static libstdc++_nonshared.a inside torch 2.9's cxx11 libtorch.so: old-ABI string
    references that libstdc++ satisfies, while everything another library binds to is cxx11."""
    library = link_mixed_units(built / "libinside.so", {"strings.cpp": True, "internal_string.cpp": False})
    report = abi.classify_shared_object(library)
    assert report.pre_cxx11_symbols > 0 and report.cxx11_symbols > 0  # both really are in there
    assert (report.abi, report.abi_basis) == (abi.CXX11, "interface")


@pytest.mark.parametrize(("cxx11", "expected"), [(False, abi.PRE_CXX11), (True, abi.CXX11)])
def test_strings_used_only_inside_are_classified_from_std_symbols(built: Path, cxx11: bool, expected: str) -> None:
    library = compile_library("internal_string.cpp", built / f"libinternal{int(cxx11)}.so", cxx11=cxx11)
    report = abi.classify_shared_object(library)
    assert report.abi == expected
    assert report.abi_basis in (abi.STD_DEFINITIONS_BASIS, abi.STD_REFERENCES_BASIS)


def test_std_instantiations_outweigh_old_abi_references(built: Path) -> None:
    """torch 2.9's libtorch.so: it exports only std instantiations (cxx11) and references two old-ABI
    libstdc++ symbols pulled in by gcc-toolset's static archive. Rebuilt here from two units."""
    library = link_mixed_units(built / "libwrapper.so", {"internal_string.cpp": True, "internal_other.cpp": False})
    with open(library, "rb") as handle:
        info = abi.read_elf_dynamic(handle)
    if not any(abi.symbol_abi(name)[0] and inspection._STD_NAME.match(name) for name in info.defined):
        pytest.skip("this g++ instantiates no std::string member in the library itself")
    assert any(abi.symbol_abi(symbol.name)[1] for symbol in info.undefined)
    report = abi.classify_shared_object(library)
    assert (report.abi, report.abi_basis) == (abi.CXX11, abi.STD_DEFINITIONS_BASIS)


def test_libstdcxx_exports_both_abis(tmp_path: Path) -> None:
    libstdcxx = _system_libstdcxx()
    report = abi.classify_shared_object(libstdcxx)
    assert report.abi == abi.MIXED
    assert report.bundled_runtime


def _system_libstdcxx() -> Path:
    output = subprocess.run(["g++", "-print-file-name=libstdc++.so.6"], capture_output=True, text=True).stdout
    path = Path(output.strip()).resolve()
    if not path.is_file():
        pytest.skip("g++ does not know where libstdc++.so.6 is")
    return path


def test_glibc_and_glibcxx_needs_match_readelf(built: Path) -> None:
    if shutil.which("readelf") is None:
        pytest.skip("needs readelf (binutils) as the reference")
    path = built / "libnewglibc.so"
    listing = subprocess.run(["readelf", "--version-info", "--wide", str(path)], capture_output=True,
                             text=True, check=True).stdout
    report = abi.classify_shared_object(path)
    assert report.glibc == _newest(re.findall(r"Name: GLIBC_([0-9.]+)", listing))
    assert report.glibcxx == _newest(re.findall(r"Name: GLIBCXX_([0-9.]+)", listing))
    assert tuple(map(int, report.glibc.split("."))) >= (2, 25)  # getrandom() came with glibc 2.25


def _newest(versions: list[str]) -> str:
    return max(versions, key=lambda version: tuple(map(int, version.split("."))))


def test_non_elf_file_is_a_usage_error(tmp_path: Path) -> None:
    text = tmp_path / "notes.so"
    text.write_text("not a library")
    with pytest.raises(ConfigError):
        abi.classify_shared_object(text)


# --- wheels and directories ----------------------------------------------------------------------------------


def make_wheel(path: Path, members: dict[str, Path], tag: str = "cp311-cp311-manylinux_2_28_x86_64") -> Path:
    name = path.name.split("-")[0]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for member, source in members.items():
            archive.write(source, member)
        archive.writestr(f"{name}-1.0.dist-info/WHEEL",
                         f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n")
        archive.writestr(f"{name}-1.0.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    return path


def test_wheel_is_classified_from_its_members(built: Path, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", {
        "demo/_strings.so": built / "libstrings_cxx11.so",
        "demo/_plain.so": built / "libplain.so",
        "demo.libs/libstdc++-0a1b2c3d.so.6.0.30": _system_libstdcxx(),
        "demo/__init__.py": FIXTURES / "strings.cpp",
    })
    report = abi.inspect_path(wheel)
    assert (report.kind, report.abi, report.platform_tag) == ("wheel", abi.CXX11, "manylinux_2_28_x86_64")
    by_path = {item.path: item for item in report.shared_objects}
    assert set(by_path) == {"demo/_strings.so", "demo/_plain.so", "demo.libs/libstdc++-0a1b2c3d.so.6.0.30"}
    assert by_path["demo/_plain.so"].abi == abi.NO_STRINGS
    bundled = by_path["demo.libs/libstdc++-0a1b2c3d.so.6.0.30"]
    assert bundled.abi == abi.MIXED and bundled.bundled_runtime  # reported, but the package stays cxx11
    assert "cxx11" in report.verdict


def test_wheel_with_both_abis_is_mixed(built: Path, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "both-1.0-cp311-cp311-linux_x86_64.whl", {
        "both/_new.so": built / "libstrings_cxx11.so", "both/_old.so": built / "libstrings_pre.so"})
    report = abi.inspect_path(wheel)
    assert report.abi == abi.MIXED
    assert "cxx11 in _new.so" in report.verdict and "pre-cxx11 in _old.so" in report.verdict


def test_platform_tag_comes_from_wheel_file_when_the_name_has_none(built: Path, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "odd.whl", {"odd/_x.so": built / "libstrings_pre.so"},
                       tag="cp311-cp311-manylinux_2_17_x86_64")
    report = abi.inspect_path(wheel)
    assert (report.abi, report.platform_tag) == (abi.PRE_CXX11, "manylinux_2_17_x86_64")


def test_verdict_checks_the_platform_tag_against_the_glibc_needed(built: Path, tmp_path: Path) -> None:
    library = {"g/_g.so": built / "libnewglibc.so"}
    needed = abi.classify_shared_object(built / "libnewglibc.so").glibc
    old = abi.inspect_path(make_wheel(tmp_path / "g-1.0-cp311-cp311-manylinux_2_17_x86_64.whl", library))
    assert f"promises glibc 2.17 but needs {needed}" in old.verdict
    host = os.confstr("CS_GNU_LIBC_VERSION").split()[-1].replace(".", "_")
    fits = abi.inspect_path(make_wheel(tmp_path / f"g-1.0-cp311-cp311-manylinux_{host}_x86_64.whl", library))
    assert "fits manylinux" in fits.verdict and "WRONG" not in fits.verdict


def test_verdict_flags_a_local_version_label_that_contradicts_the_symbols(built: Path, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "lbl-1.0+cxx11-cp311-cp311-linux_x86_64.whl", {"lbl/_x.so": built /
                                                                                 "libstrings_pre.so"})
    assert "CLAIMS cxx11 but the symbols are pre-cxx11" in abi.inspect_path(wheel).verdict


def test_library_embedding_both_abis_std_code_does_not_decide_the_package(built: Path, tmp_path: Path) -> None:
    embedded = link_mixed_units(built / "libembed.so", {"internal_vector.cpp:VECTOR_FUNCTION=new_items": True,
                                                        "internal_vector.cpp:VECTOR_FUNCTION=old_items": False})
    alone = abi.classify_shared_object(embedded)
    assert (alone.abi, alone.abi_basis) == (abi.MIXED, abi.STD_DEFINITIONS_BASIS)
    wheel = make_wheel(tmp_path / "emb-1.0-cp311-cp311-linux_x86_64.whl", {
        "emb/_core.so": built / "libstrings_cxx11.so", "emb/libembed.so": embedded})
    report = abi.inspect_path(wheel)
    assert report.abi == abi.CXX11  # the interface decides
    assert "not counted: libembed.so (mixed, from std definitions)" in report.verdict
    only = make_wheel(tmp_path / "only-1.0-cp311-cp311-linux_x86_64.whl", {"only/libembed.so": embedded})
    assert abi.inspect_path(only).abi == abi.MIXED  # nothing better to judge by


def test_directory_is_walked(built: Path, tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    shutil.copy(built / "libstrings_pre.so", tmp_path / "pkg" / "_a.cpython-311-x86_64-linux-gnu.so")
    shutil.copy(built / "libplain.so", tmp_path / "pkg" / "libb.so.1")
    (tmp_path / "pkg" / "readme.so").write_text("not ELF")
    report = abi.inspect_path(tmp_path)
    assert report.kind == "directory" and report.abi == abi.PRE_CXX11
    assert [item.path for item in report.shared_objects] == ["pkg/_a.cpython-311-x86_64-linux-gnu.so",
                                                            "pkg/libb.so.1"]


def test_inspect_json_has_the_documented_fields(built: Path, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "demo-1.0-cp311-cp311-manylinux_2_28_x86_64.whl",
                       {"demo/_s.so": built / "libstrings_pre.so"})
    result = CliRunner().invoke(abi_group, ["inspect", str(wheel), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert {"path", "kind", "abi", "platform_tag", "verdict", "shared_objects"} <= set(document)
    assert document["abi"] == "pre-cxx11" and document["kind"] == "wheel"
    (item,) = document["shared_objects"]
    assert {"path", "abi", "glibc", "glibcxx", "cxx11_symbols", "pre_cxx11_symbols"} <= set(item)
    assert item["pre_cxx11_symbols"] > 0 and item["cxx11_symbols"] == 0


# --- twins ---------------------------------------------------------------------------------------------------


def test_every_torch_symbol_has_a_twin_key_under_the_other_abi(built: Path) -> None:
    """Pair the fake torch's exports of both builds by their ABI-normalised demangled names (c++filt) and
    check abi_neutral_key gives each pair the same key."""
    if shutil.which("c++filt") is None:
        pytest.skip("needs c++filt to pair the symbols independently")
    exported = {}
    for cxx11 in (False, True):
        with open(built / f"torch{int(cxx11)}" / "libtorch.so", "rb") as handle:
            names = sorted(name for name in abi.read_elf_dynamic(handle).defined if re.match(r"_ZN?K?(5torch|"
                                                                                            r"3c10|2at)", name))
        readable = abi.demangle(names)
        exported[cxx11] = {_normalise(readable[name]): name for name in names}
    assert set(exported[False]) == set(exported[True])
    differing = [(exported[False][key], exported[True][key]) for key in exported[False]
                 if exported[False][key] != exported[True][key]]
    assert len(differing) >= 10
    for old, new in differing:
        assert abi.abi_neutral_key(old) == abi.abi_neutral_key(new), (old, new)


def _normalise(demangled: str) -> str:
    text = demangled.replace("std::__cxx11::", "std::").replace("[abi:cxx11]", "")
    return text.replace("std::basic_string<char, std::char_traits<char>, std::allocator<char> >", "std::string")


# --- check ---------------------------------------------------------------------------------------------------


def test_matching_abi_is_compatible_and_loads(built: Path, tmp_path: Path) -> None:
    site = make_site(tmp_path, built, torch_cxx11=True, extension_cxx11=True, plugin=True)
    report = abi.check_site_packages(site.path)
    assert report.verdict == abi.COMPATIBLE and report.compatible
    assert {extension.path for extension in report.extensions} == {EXTENSION, "plugin/_ops.so"}
    assert all(extension.torch_symbols >= 10 for extension in report.extensions)
    assert load_error(site.extension) is None
    completed = run_standalone("check", str(site.path))
    assert completed.returncode == 0, completed.stderr
    assert "compatible" in completed.stdout


@pytest.mark.parametrize(("torch_cxx11", "extension_cxx11"), [(True, False), (False, True)])
def test_opposite_abi_is_an_abi_mismatch_and_fails_to_load(built: Path, tmp_path: Path, torch_cxx11: bool,
                                                          extension_cxx11: bool) -> None:
    site = make_site(tmp_path, built, torch_cxx11=torch_cxx11, extension_cxx11=extension_cxx11, plugin=True)
    report = abi.check_site_packages(site.path)
    assert report.verdict == abi.ABI_MISMATCH
    assert report.torch_abi == (abi.CXX11 if torch_cxx11 else abi.PRE_CXX11)
    (broken,) = [extension for extension in report.extensions if extension.path == EXTENSION]
    assert broken.abi == (abi.CXX11 if extension_cxx11 else abi.PRE_CXX11)
    assert len(broken.missing) >= 10
    assert all(item.problem == abi.ABI_MISMATCH and item.twin for item in broken.missing)
    assert f"{EXTENSION} ({broken.abi} ABI)" in report.summary and f"torch ({report.torch_abi} ABI)" in report.summary
    plugin = [extension for extension in report.extensions if extension.path == "plugin/_ops.so"]
    assert plugin[0].verdict == abi.COMPATIBLE  # built like torch: not blamed

    error = load_error(site.extension)
    assert error is not None and "undefined symbol" in error
    assert error.split("undefined symbol: ")[1].strip() in {item.symbol for item in broken.missing}
    completed = run_standalone("check", str(site.path), "--json")
    assert completed.returncode == 1
    assert json.loads(completed.stdout)["verdict"] == "abi mismatch"


def test_extension_without_dt_needed_on_torch_is_still_checked(built: Path, tmp_path: Path) -> None:
    site = make_site(tmp_path, built, torch_cxx11=True, extension_cxx11=True)
    library = site.path / "torch" / "lib"
    extension = compile_library("extension_strings_only.cpp", site.path / "strings_only" / "_ext.so", cxx11=False,
                                flags=("-Wl,--as-needed", "-L", str(library), "-ltorch"))
    with open(extension, "rb") as handle:
        assert "libtorch.so" not in abi.read_elf_dynamic(handle).needed  # what makes this case hard
    report = abi.check_site_packages(site.path)
    (checked,) = [item for item in report.extensions if item.path == "strings_only/_ext.so"]
    assert checked.verdict == abi.ABI_MISMATCH and len(checked.missing) == 2
    assert report.verdict == abi.ABI_MISMATCH


def test_symbol_absent_under_both_abis_is_a_version_mismatch(built: Path, tmp_path: Path) -> None:
    site = make_site(tmp_path, built, torch_cxx11=True, extension_cxx11=True, newer_api=True)
    report = abi.check_site_packages(site.path)
    assert report.verdict == abi.VERSION_MISMATCH
    (extension,) = report.extensions
    assert [(item.symbol, item.problem, item.twin) for item in extension.missing] == [
        ("_ZN5torch11added_laterEi", abi.VERSION_MISMATCH, None)]
    assert "undefined symbol: _ZN5torch11added_laterEi" in load_error(site.extension)
    assert run_standalone("check", str(site.path)).returncode == 1


CUDA_STUB = "_XLAC_cuda_functions.cpython-311-x86_64-linux-gnu.so"


def test_symbol_from_torch_xlas_cuda_stub_is_compatible_only_without_cuda(built: Path, tmp_path: Path) -> None:
    """torch_xla 2.8's _XLAC needs c10::cuda::set_device(signed char), which torch 2.8 lacks; _XLAC_cuda_functions
    defines it and torch_xla loads that RTLD_GLOBAL first when CUDA is unavailable (pytorch/xla#9656)."""
    site = make_site(tmp_path, built, torch_cxx11=True, extension_cxx11=True, newer_api=True)
    shutil.copy(built / "cuda_stub.so", site.path / CUDA_STUB)
    report = abi.check_site_packages(site.path)
    assert report.verdict == abi.COMPATIBLE and report.needs_cuda_unavailable
    (xlac,) = [extension for extension in report.extensions if extension.path == EXTENSION]
    assert xlac.missing == ()
    assert [(item.symbol, item.problem) for item in xlac.from_cuda_stub] == [
        ("_ZN5torch11added_laterEi", abi.FROM_CUDA_STUB)]
    assert "only while CUDA is unavailable" in report.summary and "pytorch/xla#9656" in report.summary
    document = json.loads(run_standalone("check", str(site.path), "--json").stdout)
    assert document["needs_cuda_unavailable"] is True
    result = CliRunner().invoke(abi_group, ["check", str(site.path)])
    assert result.exit_code == 0 and abi.FROM_CUDA_STUB in result.output, result.output
    # The loader agrees: with the stub loaded globally first the extension binds; without it, it does not.
    code = ("import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW | os.RTLD_GLOBAL); "
            "ctypes.CDLL(sys.argv[2], mode=os.RTLD_NOW)")
    loaded = subprocess.run([sys.executable, "-c", code, str(site.path / CUDA_STUB), str(site.extension)],
                            capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert "undefined symbol" in load_error(site.extension)


def test_cuda_stub_does_not_excuse_other_extensions(built: Path, tmp_path: Path) -> None:
    site = make_site(tmp_path, built, torch_cxx11=True, extension_cxx11=True)
    shutil.copy(built / "cuda_stub.so", site.path / CUDA_STUB)
    (site.path / "other").mkdir()
    shutil.copy(built / "extension_newer.so", site.path / "other" / "_ops.so")
    report = abi.check_site_packages(site.path)
    assert report.verdict == abi.VERSION_MISMATCH and not report.needs_cuda_unavailable
    (other,) = [extension for extension in report.extensions if extension.path == "other/_ops.so"]
    assert [item.symbol for item in other.missing] == ["_ZN5torch11added_laterEi"]


def test_missing_symbols_are_demangled_with_cxxfilt(built: Path, tmp_path: Path) -> None:
    if shutil.which("c++filt") is None:
        pytest.skip("needs c++filt")
    site = make_site(tmp_path, built, torch_cxx11=True, extension_cxx11=False)
    report = abi.check_site_packages(site.path)
    readable = {item.demangled: item.twin_demangled for item in report.extensions[0].missing}
    assert readable["torch::lazy::MetricFnValue(double)"] == "torch::lazy::MetricFnValue[abi:cxx11](double)"


def test_cli_check_raises_failure_on_mismatch(built: Path, tmp_path: Path) -> None:
    site = make_site(tmp_path, built, torch_cxx11=False, extension_cxx11=True)
    result = CliRunner().invoke(abi_group, ["check", str(site.path)])
    assert isinstance(result.exception, Failure) and result.exception.exit_code == 1
    assert "abi mismatch" in result.output and "MetricFnValue" in result.output


def test_venv_root_is_accepted(built: Path, tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    make_site(site, built, torch_cxx11=True, extension_cxx11=True)
    assert abi.check_site_packages(tmp_path / "venv").verdict == abi.COMPATIBLE


# --- usage errors --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "inspect"])
def test_missing_path_exits_2(command: str, tmp_path: Path) -> None:
    completed = run_standalone(command, str(tmp_path / "nowhere" / "site-packages"))
    assert completed.returncode == 2
    assert "does not exist" in completed.stderr


def test_check_without_torch_exits_2(built: Path, tmp_path: Path) -> None:
    shutil.copy(built / "libplain.so", tmp_path / "libplain.so")
    completed = run_standalone("check", str(tmp_path))
    assert completed.returncode == 2 and "no torch found" in completed.stderr
    result = CliRunner().invoke(abi_group, ["check", str(tmp_path)])
    assert isinstance(result.exception, ConfigError) and result.exception.exit_code == 2


def test_check_of_a_wheel_exits_2(built: Path, tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "demo-1.0-cp311-cp311-linux_x86_64.whl", {"demo/_s.so": built / "libplain.so"})
    completed = run_standalone("check", str(wheel))
    assert completed.returncode == 2 and "not a directory" in completed.stderr


@pytest.mark.parametrize("form", ["zipapp", "directory"])
def test_standalone_copy_works_without_xla_images(built: Path, tmp_path: Path, form: str) -> None:
    """Wheel builds and the in-image check run the tool where xla_images is not installed: the one-file zipapp
    (copied alone, no pyelftools either) or the package directory run as a script."""
    if form == "zipapp":
        tool = abi_standalone.write_zipapp(tmp_path / "abi.pyz")
        assert abi_standalone.write_zipapp(tmp_path / "again.pyz").read_bytes() == tool.read_bytes()
    else:
        tool = REPO / "xla_images" / "abi"
    site = make_site(tmp_path / "site", built, torch_cxx11=True, extension_cxx11=False)
    # -I -S: no PYTHONPATH, no site-packages (no pyelftools, no installed xla_images): the standard library only.
    mismatch = subprocess.run([sys.executable, "-I", "-S", str(tool), "check", str(site.path)], capture_output=True,
                              text=True, cwd=tmp_path)
    assert mismatch.returncode == 1, mismatch.stderr
    assert "abi mismatch" in mismatch.stdout
    usage = subprocess.run([sys.executable, "-I", "-S", str(tool), "check", str(tmp_path / "nowhere")],
                           capture_output=True, text=True, cwd=tmp_path)
    assert usage.returncode == 2 and "does not exist" in usage.stderr and "Traceback" not in usage.stderr
    image = subprocess.run([sys.executable, "-I", "-S", str(tool), "inspect", "some/image:tag"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert image.returncode == 2 and "reads paths only" in image.stderr and "[abi-image-reference]" in image.stderr


def test_standalone_zipapp_imports_nothing_outside_itself(tmp_path: Path) -> None:
    """The zipapp is the whole tool: run in an isolated interpreter, it imports no module from outside the archive
    other than the standard library's."""
    tool = abi_standalone.write_zipapp(tmp_path / "abi.pyz")
    code = ("import sys, runpy; sys.argv = ['abi', '--help']\n"
            "try:\n    runpy.run_path(%r, run_name='__main__')\n"
            "except SystemExit:\n    pass\n"
            "outside = sorted(name for name, module in sys.modules.items() if getattr(module, '__file__', None)"
            " and name.split('.')[0] not in sys.stdlib_module_names and %r not in module.__file__)\n"
            "print(outside)") % (str(tool), str(tool))
    completed = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip().splitlines()[-1] == "[]"


# --- images: engine error paths (the engine is mocked: these are error paths only) -----------------------------


def test_unknown_image_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from xla_images.run import engine

    def no_image(image: str, container_path: str, dest: Path) -> Path:
        raise Failure(f"image {image} is not on this engine", rule="image-exists")

    monkeypatch.setattr(engine.containers, "extract_from_image", no_image)
    with pytest.raises(ConfigError, match="neither an existing path nor an image"):
        abi_images.inspect_target("no-such-image:1")


def test_image_without_site_packages_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from xla_images.run import engine

    asked: list[str] = []

    def nothing_there(image: str, container_path: str, dest: Path) -> Path:
        asked.append(container_path)
        raise Failure(f"{container_path} does not exist in image {image}", rule="image-path-exists")

    monkeypatch.setattr(engine.containers, "extract_from_image", nothing_there)
    with pytest.raises(ConfigError, match="no python site-packages"):
        abi_images.check_target("bare-image:1")
    assert asked == ["/opt/venv/lib", "/usr/local/lib", "/usr/lib/python3/dist-packages"]


def test_engine_failures_other_than_missing_paths_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    from xla_images.run import engine

    def engine_down(image: str, container_path: str, dest: Path) -> Path:
        raise Failure("no Docker engine answers", rule="engine-reachable")

    monkeypatch.setattr(engine.containers, "extract_from_image", engine_down)
    with pytest.raises(Failure, match="no Docker engine"):
        abi_images.inspect_image("any:1")


def test_an_images_ld_library_path_reaches_the_loader(built: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`abi check IMAGE`: a helper library found only through LD_LIBRARY_PATH of the image's config (Env) provides
    the extension's symbols; a directory outside the copied site-packages is not looked up on this host."""
    from xla_images.run import engine

    image = tmp_path / "image" / "usr" / "local" / "lib"
    site = make_site(image / "python3.11" / "site-packages", built, torch_cxx11=True, extension_cxx11=True).path
    (site / "extra" / "lib").mkdir(parents=True)
    (tmp_path / "helper.c").write_text("int helper_value(void) { return 5; }\n")
    (tmp_path / "ext.c").write_text("int helper_value(void);\nint ext_value(void) { return helper_value(); }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "helper.c"), "-o", str(site / "extra" / "lib" /
                    "libxhelper.so")], check=True)
    (site / "ext").mkdir()  # its search path names torch/lib only: LD_LIBRARY_PATH alone finds libxhelper.so
    subprocess.run(["gcc", "-shared", "-fPIC", str(tmp_path / "ext.c"), "-o", str(site / "ext" / "_ext.so"),
                    "-Wl,--no-as-needed", f"-L{site / 'torch' / 'lib'}", "-ltorch", "-Wl,-rpath,$ORIGIN/../torch/lib",
                    f"-L{site / 'extra' / 'lib'}", "-lxhelper"], check=True)

    def copy_out(reference: str, container_path: str, dest: Path) -> Path:
        source = tmp_path / "image" / container_path.lstrip("/")
        if not source.is_dir():
            raise Failure(f"{container_path} does not exist in image {reference}", rule="image-path-exists")
        shutil.copytree(source, dest)
        return dest

    inside = "/usr/local/lib/python3.11/site-packages"
    environment = [f"LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu::{inside}/extra/lib", "PATH=/usr/bin"]
    monkeypatch.setattr(engine.containers, "extract_from_image", copy_out)
    monkeypatch.setattr(engine.images, "image_inspect", lambda reference: {"Config": {"Env": environment}})
    [report] = abi_images.check_target("stand-in:1")
    [extension] = [item for item in report.extensions if item.path == "ext/_ext.so"]
    assert extension.unjudged == 0 and [name for name, _ in extension.providers] == ["extra/lib/libxhelper.so"]
    local = tmp_path / "copy"
    assert abi_images.library_path_in_copies(dict([environment[0].split("=", 1)]), [(inside, local)]) == \
        (str(local / "extra" / "lib"),)  # the system directory is not the host's; the empty entry is no directory


def test_runnable_as_module_help() -> None:
    completed = run_standalone("--help")
    assert completed.returncode == 0 and "inspect" in completed.stdout and "check" in completed.stdout


# --- what symbols cannot show: distributions pinned to another torch, and helper libraries --------------------


def add_distribution(site: Path, name: str, version: str, files: list[str], requires: str | None) -> None:
    info = site / f"{name}-{version}.dist-info"
    info.mkdir()
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    if requires:
        lines.append(f"Requires-Dist: {requires}")
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "RECORD").write_text("".join(f"{path},sha256=x,1\n" for path in files) + f"{info.name}/RECORD,,\n")


@pytest.mark.parametrize(("requires", "expected"), [
    # issue 42: pinned to another X.Y, every symbol binding, is measured to crash (torchvision 0.23.0 beside torch
    # 2.9.0) and to work (benchmarks/abi_corpus): uncertain, exit 3
    ("torch==2.8.0", abi.UNCERTAIN),
    ("torch (==2.8.0)", abi.UNCERTAIN),  # the older metadata spelling (torchaudio 2.8)
    ("torch==2.9.0", abi.COMPATIBLE),
    ("torch==2.9.1", abi.PIN_MISMATCH),  # another patch release of 2.9: loads (torchvision 0.22.1 beside 2.7.0)
    ("torch>=2.0", abi.COMPATIBLE),
    ('torch==2.8.0; extra == "legacy"', abi.COMPATIBLE),
    (None, abi.COMPATIBLE),
])
def test_extension_pinned_to_another_torch_is_uncertain_though_its_symbols_resolve(
        built: Path, tmp_path: Path, requires: str | None, expected: str) -> None:
    site = make_site(tmp_path, built, torch_cxx11=True, extension_cxx11=True, plugin=True).path
    add_distribution(site, "torch", "2.9.0+cpu", [], None)
    add_distribution(site, "plugin", "1.0", ["plugin/_ops.so", "plugin/libbystander.so"], requires)
    report = abi.check_site_packages(site)
    assert report.torch_version == "2.9.0+cpu"
    (plugin,) = [item for item in report.extensions if item.path == "plugin/_ops.so"]
    assert plugin.verdict == expected and not plugin.missing and plugin.distribution == "plugin 1.0"
    assert report.verdict == expected
    if expected == abi.UNCERTAIN:
        assert plugin.requires_torch == "2.8.0" and "requires torch==2.8.0" in report.summary
        assert "symbols resolve" in report.summary and "torch 2.9.0+cpu" in report.summary
        assert report.summary.startswith("uncertain: ") and plugin.pinned_elsewhere
        assert run_standalone("check", str(site)).returncode == abi.EXIT_UNCERTAIN == 3
    if expected == abi.PIN_MISMATCH:
        assert "pin mismatch" in report.summary and "pip would refuse" in report.summary
        assert run_standalone("check", str(site)).returncode == 0


def test_no_torch_metadata_means_no_pin_verdict(built: Path, tmp_path: Path) -> None:
    site = make_site(tmp_path, built, torch_cxx11=True, extension_cxx11=True, plugin=True).path
    add_distribution(site, "plugin", "1.0", ["plugin/_ops.so"], "torch==2.8.0")
    report = abi.check_site_packages(site)
    assert report.torch_version is None and report.verdict == abi.COMPATIBLE


def test_symbols_of_the_packages_own_helper_library_are_not_torch_version_mismatches(built: Path,
                                                                                     tmp_path: Path) -> None:
    """torchaudio 2.8's _torchaudio_sox.so needs torchaudio::sox::...(at::Tensor...) from libtorchaudio_sox.so,
    which torchaudio preloads by path; check once called them torch symbols missing from torch."""
    site = make_site(tmp_path, built, torch_cxx11=True, extension_cxx11=True).path
    package = site / "audio" / "lib"
    helper = compile_library("sibling_library.cpp", package / "libaudio_ops.so", cxx11=True,
                             flags=("-L", str(site / "torch" / "lib"), "-ltorch",
                                    "-Wl,-rpath,$ORIGIN/../../torch/lib", "-Wl,-soname,libaudio_ops.so"))
    extension = compile_library("sibling_extension.cpp", package / "_audio.so", cxx11=True,
                                flags=("-L", str(package), "-laudio_ops", "-L", str(site / "torch" / "lib"),
                                       "-ltorch", "-Wl,-rpath,$ORIGIN/../../torch/lib"))
    assert not abi.is_torch_entity("_ZN5audio7processERKN3c1014SourceLocationE")
    assert abi.is_torch_entity("_ZNK3c1010TensorImpl39sym_is_non_overlapping_and_dense_customEv")
    assert abi.is_torch_entity("_ZNR5torch7Library4_defEv") and abi.is_torch_entity("_ZTVN3c1011StorageImplE")
    # Without python code that preloads the helper, ld.so would not find it (no RPATH names its directory).
    (checked,) = [item for item in abi.check_site_packages(site).extensions if item.path == "audio/lib/_audio.so"]
    assert checked.verdict == abi.MISSING_LIBRARY and "libaudio_ops.so" in checked.libraries_not_found[0], checked
    (site / "audio" / "__init__.py").write_text(
        "import ctypes, os\nctypes.CDLL(os.path.join(os.path.dirname(__file__), 'lib', 'libaudio_ops.so'), "
        "mode=os.RTLD_GLOBAL)\n")
    report = abi.check_site_packages(site)
    (checked,) = [item for item in report.extensions if item.path == "audio/lib/_audio.so"]
    assert checked.verdict == abi.COMPATIBLE and not checked.missing, checked
    # What the package does at import, and what check assumes: the helper preloaded by path, then the module.
    code = ("import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_GLOBAL); "
            "print(ctypes.CDLL(sys.argv[2], mode=os.RTLD_NOW).sibling_entry())")
    loaded = subprocess.run([sys.executable, "-c", code, str(helper), str(extension)], capture_output=True,
                            text=True)
    assert loaded.returncode == 0, loaded.stderr


def test_operator_registration_is_reported_as_not_checkable(tmp_path: Path) -> None:
    extension = abi.ExtensionCheck("vision/_C.so", abi.CXX11, abi.COMPATIBLE, 10, registers_operators=True)
    pinned = abi.ExtensionCheck("audio/_C.so", abi.CXX11, abi.COMPATIBLE, 10, distribution="audio 2.9.0",
                                requires_torch="2.9.0", registers_operators=True)
    xla = abi.ExtensionCheck("_XLAC.so", abi.CXX11, abi.COMPATIBLE, 10, distribution="torch_xla 2.9.0",
                             registers_operators=True)
    _, summary = abi.site_verdict([extension, pinned, xla], abi.CXX11, "2.9.0")
    assert "runtime operator compatibility not checkable: vision/_C.so register" in summary
    assert "audio/_C.so" not in summary and "_XLAC" not in summary


def test_a_mixed_site_takes_the_most_severe_verdict_and_says_each_extension_in_its_own_words() -> None:
    """A pybind11 mismatch beside a version mismatch, a layout mismatch beside an ABI mismatch: every broken
    extension has its own line (none is dropped, none worded as another verdict's "needs 0 symbol(s)")."""
    missing = abi.MissingSymbol("_ZN3c104impl3fooEv", "c10::impl::foo()", abi.VERSION_MISMATCH)
    versioned = abi.ExtensionCheck("old/_C.so", abi.CXX11, abi.VERSION_MISMATCH, 10, missing=(missing,))
    bound = abi.ExtensionCheck("bind/_C.so", abi.CXX11, abi.PYBIND11_MISMATCH, 10,
                               pybind11_evidence="its pybind11 internals (v4) are not torch's (v5)")
    verdict, summary = abi.site_verdict([versioned, bound], abi.CXX11, "2.9.0")
    assert verdict == abi.PYBIND11_MISMATCH
    assert "bind/_C.so imports, but its pybind11 internals (v4)" in summary and "old/_C.so" in summary
    assert "needs 0 symbol" not in summary
    layout = abi.ExtensionCheck("lay/_C.so", abi.PRE_CXX11, abi.ABI_LAYOUT, 10,
                                layout_evidence="-D_GLIBCXX_USE_CXX11_ABI=0")
    other = abi.ExtensionCheck("oth/_C.so", abi.PRE_CXX11, abi.ABI_MISMATCH, 10)
    verdict, summary = abi.site_verdict([layout, other, versioned], abi.CXX11, "2.9.0")
    assert verdict == abi.ABI_MISMATCH
    assert all(path in summary for path in ("lay/_C.so", "oth/_C.so", "old/_C.so")), summary
    # issue 42: an uncertain extension never outranks a definite mismatch, and alone it is the site's verdict
    doubted = abi.ExtensionCheck("doubt/_C.so", abi.CXX11, abi.UNCERTAIN, 10,
                                 pybind11_evidence="its pybind11 internals (v4) are not torch's (v5)")
    verdict, summary = abi.site_verdict([doubted, versioned], abi.CXX11, "2.9.0")
    assert verdict == abi.VERSION_MISMATCH and "doubt/_C.so imports, but its pybind11 internals (v4)" in summary
    verdict, summary = abi.site_verdict([doubted], abi.CXX11, "2.9.0")
    assert verdict == abi.UNCERTAIN and summary.startswith("uncertain: doubt/_C.so") and "works where" in summary


# --- the loader model ---------------------------------------------------------------------------------------------


def test_std_symbol_linked_against_torch_binds_to_libstdcxx_beside_a_torch_without_it(tmp_path: Path) -> None:
    """Issue 20, class 2: an extension linked against a torch that exported a std::__cxx11 instantiation holds an
    unversioned reference to it; beside a torch that does not export it, the loader binds it to libstdc++ and the
    extension loads. check must not count it as a missing torch symbol (it did: its twin is in torch)."""
    old = tmp_path / "build" / "libtorch.so"
    old.parent.mkdir()
    (tmp_path / "with.cpp").write_text("#include <sstream>\ntemplate class std::basic_ostringstream<char>;\n"
                                       "int torch_marker() { return 1; }\n")
    (tmp_path / "without.cpp").write_text("#include <sstream>\ntemplate class std::basic_ostringstream<char>;\n"
                                          "int torch_marker() { return 1; }\n")
    subprocess.run(["g++", "-shared", "-fPIC", "-D_GLIBCXX_USE_CXX11_ABI=1", str(tmp_path / "with.cpp"), "-o",
                    str(old)], check=True)
    (tmp_path / "ext.cpp").write_text("#include <sstream>\nint torch_marker();\n"
                                      "extern \"C\" int entry() { std::ostringstream out; out << torch_marker();"
                                      " return out.str() == \"1\" ? 0 : 1; }\n")
    site = tmp_path / "site"
    (site / "torch" / "lib").mkdir(parents=True)
    extension = site / "demo" / "_ext.so"
    extension.parent.mkdir()
    subprocess.run(["g++", "-shared", "-fPIC", "-D_GLIBCXX_USE_CXX11_ABI=1", str(tmp_path / "ext.cpp"), "-o",
                    str(extension), "-L", str(old.parent), "-ltorch", "-Wl,-rpath,$ORIGIN/../torch/lib"], check=True)
    unversioned = [symbol for symbol in abi.read_elf_file(extension).undefined
                   if "basic_ostringstream" in symbol.name and symbol.name.startswith("_ZNSt7__cxx11")]
    assert unversioned and all(symbol.version is None for symbol in unversioned), "the shape of issue 20"
    # torch here exports the old-ABI instantiation only: the twin the old check took for a mismatch.
    subprocess.run(["g++", "-shared", "-fPIC", "-D_GLIBCXX_USE_CXX11_ABI=0", str(tmp_path / "without.cpp"), "-o",
                    str(site / "torch" / "lib" / "libtorch.so")], check=True)
    report = abi.check_site_packages(site)
    (checked,) = report.extensions
    assert checked.verdict == abi.COMPATIBLE, checked
    assert any(name.endswith("libstdc++.so.6") for name, _ in checked.providers), checked.providers
    assert load_error(extension) is None


def test_every_undefined_symbol_is_judged_and_its_provider_named(built: Path, tmp_path: Path) -> None:
    """Not only torch::/c10::/at:: names: a plain C symbol no library of the load order defines is missing."""
    site = make_site(tmp_path / "site", built, torch_cxx11=True, extension_cxx11=True).path
    (tmp_path / "c.cpp").write_text("extern \"C\" int thp_removed(void);\n"
                                    "extern \"C\" int entry() { return thp_removed(); }\n")
    subprocess.run(["g++", "-shared", "-fPIC", str(tmp_path / "c.cpp"), "-o", str(site / "_c_ext.so"), "-L",
                    str(site / "torch" / "lib"), "-Wl,--no-as-needed", "-ltorch", "-Wl,-rpath,$ORIGIN/torch/lib"],
                   check=True)
    report = abi.check_site_packages(site)
    (checked,) = [item for item in report.extensions if item.path == "_c_ext.so"]
    assert checked.verdict == abi.VERSION_MISMATCH and [item.symbol for item in checked.missing] == ["thp_removed"]
    assert "undefined symbol: thp_removed" in (load_error(site / "_c_ext.so") or "")
    (xlac,) = [item for item in report.extensions if item.path == EXTENSION]
    assert dict(xlac.providers).get("torch/lib/libtorch.so", 0) == xlac.torch_symbols > 0
