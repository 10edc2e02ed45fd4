"""xla_images.abi.loader: the load order it models against what glibc's loader does with the same libraries.

Three tiny C libraries, a -> b -> c, with b and c in their own directories, found only through a's search path:
DT_RPATH is inherited by what a's dependencies need, DT_RUNPATH is not. Each is loaded for real in a fresh process
(an earlier load would satisfy the name), and the model must find what the loader finds.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xla_images.abi import loader
from xla_images.abi.check import host_system

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to build the libraries")

SOURCES = {
    "c/libc_dep.so": ("int c_value(void) { return 3; }\n", ()),
    "b/libb_dep.so": ("int c_value(void);\nint b_value(void) { return c_value() + 2; }\n", ("-Lc", "-lc_dep")),
}
TOP = "int b_value(void);\nint a_value(void) { return b_value() + 1; }\n"


def build(directory: Path) -> dict[str, Path]:
    for relative, (source, flags) in SOURCES.items():
        (directory / relative).parent.mkdir(parents=True, exist_ok=True)
        (directory / "src.c").write_text(source)
        subprocess.run(["gcc", "-shared", "-fPIC", "src.c", "-o", relative, *flags], cwd=directory, check=True)
    tops = {}
    for name, tags in (("rpath", "--disable-new-dtags"), ("runpath", "--enable-new-dtags")):
        (directory / "src.c").write_text(TOP)
        subprocess.run(["gcc", "-shared", "-fPIC", "src.c", "-o", f"liba_{name}.so", "-Lb", "-lb_dep",
                        f"-Wl,{tags},-rpath,$ORIGIN/b:$ORIGIN/c"], cwd=directory, check=True)
        tops[name] = directory / f"liba_{name}.so"
    return tops


def loads_for_real(path: Path) -> bool:
    code = "import ctypes, os, sys; print(ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW).a_value())"
    completed = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                               env={key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"})
    return completed.returncode == 0 and completed.stdout.strip() == "6"


@pytest.mark.parametrize("tag", ["rpath", "runpath"])
def test_search_paths_are_followed_as_the_loader_follows_them(tmp_path: Path, tag: str) -> None:
    top = build(tmp_path)[tag]
    model = loader.Loader(tmp_path, host_system())
    order, not_found = model.closure([model.library(top)])
    names = [library.path.name for library in order]
    assert names[:2] == [top.name, "libb_dep.so"]
    if tag == "rpath":  # DT_RPATH is searched for the dependencies' needs too
        assert "libc_dep.so" in names and not not_found
    else:  # DT_RUNPATH only for the object's own DT_NEEDED
        assert [(item.name, item.needed_by) for item in not_found] == [("libc_dep.so", "b/libb_dep.so")]
    assert loads_for_real(top) == (tag == "rpath")


def test_a_library_already_loaded_satisfies_its_name(tmp_path: Path) -> None:
    """As after `import torch`: a needed name that a loaded library carries (soname or file name) is that one."""
    top = build(tmp_path)["runpath"]
    model = loader.Loader(tmp_path, host_system())
    model.preload([model.library(tmp_path / "c" / "libc_dep.so")])
    _, not_found = model.closure([model.library(top)])
    assert not_found == []


def test_first_definition_in_load_order_provides_a_symbol(tmp_path: Path) -> None:
    top = build(tmp_path)["rpath"]
    model = loader.Loader(tmp_path, host_system())
    interpreter, _ = model.global_scope(tmp_path / "no-torch-here")
    order, _ = model.closure([model.library(top)])
    table = loader.SymbolTable([*interpreter, *order])
    assert table.provider("c_value").path.name == "libc_dep.so"
    assert table.provider("b_value").path.name == "libb_dep.so"
    assert table.provider("malloc").path.name == "libc.so.6"
    assert table.provider("no_such_symbol_anywhere") is None


def test_system_directories_come_from_ld_so_conf_and_its_includes(tmp_path: Path) -> None:
    (tmp_path / "etc" / "ld.so.conf.d").mkdir(parents=True)
    (tmp_path / "etc" / "ld.so.conf").write_text("# comment\ninclude /etc/ld.so.conf.d/*.conf\n/opt/first\n")
    (tmp_path / "etc" / "ld.so.conf.d" / "a.conf").write_text("/opt/included\n")
    (tmp_path / "etc" / "ld.so.conf.d" / "loop.conf").write_text("include /etc/ld.so.conf\n")  # a cycle: read once
    directories = loader.configured_directories(str(tmp_path))
    assert directories[:2] == (str(tmp_path / "opt" / "included"), str(tmp_path / "opt" / "first"))
    assert str(tmp_path / "lib" / "x86_64-linux-gnu") in directories
    assert not loader.SystemLibraries(None).known and loader.SystemLibraries(None).find("libc.so.6") is None


# --- issue 34: the search order of glibc's _dl_map_object, each case loaded for real ------------------------------

HELPER = "int helper_value(void) { return 5; }\n"
USES_HELPER = "int helper_value(void);\nint a_value(void) { return helper_value() + 1; }\n"


def gcc(directory: Path, source: str, output: str, *flags: str) -> Path:
    (directory / "src.c").write_text(source)
    (directory / output).parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "src.c", "-o", output, *flags], cwd=directory, check=True)
    return directory / output


def loads(path: Path, environment: dict[str, str] | None = None) -> bool:
    code = "import ctypes, os, sys; ctypes.CDLL(sys.argv[1], mode=os.RTLD_NOW)"
    base = {key: value for key, value in os.environ.items() if key != "LD_LIBRARY_PATH"}
    return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                          env={**base, **(environment or {})}).returncode == 0


def model_not_found(top: Path, site: Path, library_path: tuple[str, ...] = ()) -> list[loader.NotFound]:
    system = loader.SystemLibraries(host_system().directories, library_path)
    model = loader.Loader(site, system)
    return model.closure([model.library(top)])[1]


def test_a_library_beside_the_object_is_not_found_without_a_search_path(tmp_path: Path) -> None:
    """No implicit $ORIGIN: a helper in the extension's own directory, no RPATH/RUNPATH: "cannot open"."""
    gcc(tmp_path, HELPER, "libhelper.so")
    top = gcc(tmp_path, USES_HELPER, "liba.so", "-L.", "-lhelper")
    (missing,) = model_not_found(top, tmp_path)
    assert (missing.name, missing.needed_by) == ("libhelper.so", "liba.so")
    assert "/usr/lib/x86_64-linux-gnu" in missing.searched and str(tmp_path) not in missing.searched
    assert not loads(top)


def test_a_runpath_serves_only_its_own_object_and_a_runpath_hides_the_loaders_rpath(tmp_path: Path) -> None:
    """The helper's own dependency is found only through the top object's search path: with DT_RPATH (inherited)
    it loads; with DT_RUNPATH (not inherited) it does not; and when the helper has a DT_RUNPATH of its own, the
    top object's DT_RPATH is skipped for the helper's needs too."""
    gcc(tmp_path, "int c_value(void) { return 3; }\n", "deep/libdeep.so")
    helper_source = "int c_value(void);\nint helper_value(void) { return c_value(); }\n"
    gcc(tmp_path, helper_source, "helpers/libhelper.so", "-Ldeep", "-ldeep")
    gcc(tmp_path, helper_source, "own/libhelper.so", "-Ldeep", "-ldeep", "-Wl,--enable-new-dtags,-rpath,/nowhere")
    cases = {
        ("helpers", "--disable-new-dtags"): True, ("helpers", "--enable-new-dtags"): False,
        ("own", "--disable-new-dtags"): False,
    }
    for (folder, tags), expected in cases.items():
        top = gcc(tmp_path, USES_HELPER, f"top-{folder}{tags}/liba.so", f"-L{folder}", "-lhelper",
                  f"-Wl,{tags},-rpath,$ORIGIN/../{folder}:$ORIGIN/../deep")
        not_found = model_not_found(top, tmp_path)
        assert (not not_found) == expected == loads(top), (folder, tags, not_found)
        if not expected:
            assert [(item.name, item.needed_by) for item in not_found] == [("libdeep.so", f"{folder}/libhelper.so")]


def test_ld_library_path_is_searched_after_rpath_and_before_runpath(tmp_path: Path) -> None:
    gcc(tmp_path, HELPER, "elsewhere/libhelper.so")
    top = gcc(tmp_path, USES_HELPER, "liba.so", "-Lelsewhere", "-lhelper")
    environment = {"LD_LIBRARY_PATH": str(tmp_path / "elsewhere")}
    assert model_not_found(top, tmp_path, loader.library_path_of(environment)) == []
    assert loads(top, environment) and not loads(top)


def test_lib_and_platform_are_expanded_as_ld_so_expands_them(tmp_path: Path) -> None:
    system = host_system()
    for token, value in (("$LIB", system.lib), ("$PLATFORM", system.platform), ("${ORIGIN}/x", "x")):
        folder = tmp_path / token.strip("${}/")
        target = folder / value if token != "${ORIGIN}/x" else folder / "x"
        gcc(tmp_path, HELPER, str((target / "libhelper.so").relative_to(tmp_path)))
        path = "$ORIGIN/" + token if not token.startswith("${ORIGIN}") else token
        top = gcc(folder, USES_HELPER, "liba.so", f"-L{target}", "-lhelper", f"-Wl,-rpath,{path}")
        assert model_not_found(top, tmp_path) == [] and loads(top), token


def test_a_name_found_nowhere_names_every_directory_searched(tmp_path: Path) -> None:
    """As an extension needing libcudart.so.11.0 on a machine without it."""
    gcc(tmp_path, HELPER, "build/libxla_images_absent.so.11")
    top = gcc(tmp_path, USES_HELPER, "liba.so", "-Lbuild", "-l:libxla_images_absent.so.11",
              "-Wl,--enable-new-dtags,-rpath,$ORIGIN/lib")
    (missing,) = model_not_found(top, tmp_path, ("/opt/from-ld-library-path",))
    assert missing.name == "libxla_images_absent.so.11"
    assert missing.searched[:2] == ("/opt/from-ld-library-path", str(tmp_path / "lib"))
    assert "searched /opt/from-ld-library-path, " in str(missing)
    assert not loads(top)


def test_a_needed_path_relative_to_the_current_directory_is_not_found_not_a_traceback(tmp_path: Path) -> None:
    """A library without a soname linked by path records `build/libnosoname.so`: ld.so opens that from the
    importing process's current directory, so the model cannot find it beside the object (and the import, run
    from elsewhere, fails)."""
    gcc(tmp_path, HELPER, "build/libnosoname.so")
    top = gcc(tmp_path, USES_HELPER, "liba.so", "build/libnosoname.so")
    (missing,) = model_not_found(top, tmp_path)
    assert missing.name == "build/libnosoname.so" and missing.searched == (loader.RELATIVE_NEEDED,)
    assert not loads(top)
