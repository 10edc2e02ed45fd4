"""xla_images.abi.headers: the torch headers an extension was compiled against, read from the assertion sites
TORCH_INTERNAL_ASSERT leaves in its binary. Real extensions compiled against torch 2.7, 2.8 and 2.9 are compared in
tests/xla/test_abi_ground_truth.py and benchmarks/abi_mixes.py; here the rules, on synthetic binaries."""
from __future__ import annotations

from pathlib import Path

from xla_images.abi.headers import OTHER, SAME, header_evidence


def test_headers_an_extension_was_compiled_against_are_read_from_its_assertion_sites(tmp_path: Path) -> None:
    """The `"header":line` strings TORCH_INTERNAL_ASSERT leaves in a binary, checked against torch/include."""
    include = tmp_path / "torch" / "include" / "c10" / "util"
    include.mkdir(parents=True)
    (include / "thing.h").write_text("// one\n  TORCH_INTERNAL_ASSERT(x);\n  int y;\n")
    message = b'INTERNAL ASSERT FAILED at "/venv/torch/include/c10/util/thing.h":%d, please report a bug to PyTorch.'
    same, other = tmp_path / "same.so", tmp_path / "other.so"
    same.write_bytes(b"\x7fELF" + b"\0" * 64 + message % 2 + b"\0")
    other.write_bytes(b"\x7fELF" + b"\0" * 64 + message % 3 + b"\0" + message % 2)
    assert header_evidence(same, tmp_path / "torch" / "include").verdict == SAME
    evidence = header_evidence(other, tmp_path / "torch" / "include")
    assert evidence.verdict == OTHER and evidence.differing == ("c10/util/thing.h:3",) and evidence.sites == 2
    assert evidence.registration_differing == 0  # thing.h shapes no operator registration
    assert header_evidence(same, tmp_path / "nowhere") is None  # a torch without headers: nothing can be said
    assert header_evidence(tmp_path / "torch" / "include" / "c10" / "util" / "thing.h", tmp_path) is None


def test_differences_in_the_headers_that_shape_registration_are_counted_apart(tmp_path: Path) -> None:
    include = tmp_path / "include"
    (include / "ATen" / "core").mkdir(parents=True)
    (include / "ATen" / "core" / "ivalue.h").write_text("int x;\n" * 10)
    (include / "c10").mkdir()
    (include / "c10" / "other.h").write_text("int y;\n")
    message = b'INTERNAL ASSERT FAILED at "/src/pytorch/aten/src/%s":%d, please report a bug to PyTorch.\0'
    binary = tmp_path / "ext.so"
    binary.write_bytes(message % (b"ATen/core/ivalue.h", 4) + message % (b"c10/other.h", 1)
                       + message % (b"ATen/core/../../../etc/passwd", 1))
    evidence = header_evidence(binary, include)
    assert evidence.sites == 3 and evidence.matching == 0 and evidence.registration_differing == 1
    assert evidence.differing[0] == "ATen/core/ivalue.h:4"  # registration headers are named first


def test_an_assertion_that_only_moved_is_the_same_code_one_moved_far_or_changed_is_not(tmp_path: Path) -> None:
    """Issue 34's false alarm: the condition TORCH_INTERNAL_ASSERT stringizes before the message finds the assertion
    a few lines away (torch 2.6's ivalue.h:1315 is 2.7's 1317); dozens of lines away (2.8's 1317 is 2.9's 1352,
    after IValue gained a tag) or with another condition, the site is another torch's."""
    include = tmp_path / "include"
    (include / "ATen" / "core").mkdir(parents=True)
    body = ["int filler;"] * 60
    body[6] = "    TORCH_INTERNAL_ASSERT(static_cast<uint32_t>(tag) < kNumTags);"  # line 7
    body[19] = "  TORCH_INTERNAL_ASSERT_DEBUG_ONLY(  // wrapped, with comments"  # line 20
    body[20] = "      // why"
    body[21] = "      refcount_.load() == 0 ||"
    body[22] = "          refcount_.load() >= kHuge,"
    body[23] = '      "message");'
    body[49] = "  TORCH_INTERNAL_ASSERT(isObject());"  # line 50
    (include / "ATen" / "core" / "ivalue.h").write_text("\n".join(body) + "\n")
    site = b'%s INTERNAL ASSERT FAILED at "/x/torch/include/ATen/core/ivalue.h":%d, please report a bug to PyTorch.\0'

    def evidence(*sites: tuple[bytes, int]):
        binary = tmp_path / "ext.so"
        binary.write_bytes(b"\x7fELF\0" + b"".join(site % item for item in sites))
        return header_evidence(binary, include)

    held = evidence((b"static_cast<uint32_t>(tag) < kNumTags", 7),
                    (b"refcount_.load() == 0 || refcount_.load() >= kHuge", 20))
    assert held.verdict == SAME and held.matching == 2
    moved = evidence((b"static_cast<uint32_t>(tag) < kNumTags", 5), (b"isObject()", 54))
    assert moved.registration_differing == 0 and moved.verdict == OTHER
    assert moved.moved == ("ATen/core/ivalue.h:5 (7 here)", "ATen/core/ivalue.h:54 (50 here)")
    far = evidence((b"static_cast<uint32_t>(tag) < kNumTags", 40), (b"isTuple()", 50))
    assert far.registration_differing == 2 and far.differing == ("ATen/core/ivalue.h:40", "ATen/core/ivalue.h:50")
