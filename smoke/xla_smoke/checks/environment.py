"""environment: the image is what its XLA_IMAGES_* variables say it is.

Versions compare on the public version (a `+cxx11` local label is ignored). A missing expectation fails the
check: an image that does not say what it should contain cannot be verified, and passing it silently would
hide a broken build.
"""
from __future__ import annotations

from typing import Any, Optional

from xla_smoke import expectations, hostinfo
from xla_smoke.context import Context
from xla_smoke.expectations import Expectations, abi_word, version_matches
from xla_smoke.report import Outcome, verdict


def probe() -> dict[str, Any]:
    """Describe what is installed and which device torch_xla drives. Never raises: an import that fails
    (the classic ABI mismatch is an undefined `...B5cxx11...` symbol) is recorded for the check to report."""
    env: dict[str, Any] = {
        "python": hostinfo.python_version(),
        "torch": hostinfo.distribution_version("torch"),
        "torch_xla": hostinfo.distribution_version("torch_xla"),
        "libtpu": hostinfo.libtpu_version(),
        "cxx11_abi": None,
        "device": None,
        "pjrt_device": hostinfo.pjrt_device(),
        "tpu_hardware": hostinfo.tpu_hardware_present(),
    }
    errors: list[str] = []
    try:
        import torch
        env["torch"] = torch.__version__
        env["cxx11_abi"] = bool(torch._C._GLIBCXX_USE_CXX11_ABI)
    except Exception as exc:  # noqa: BLE001 - reported by the check
        errors.append(f"import torch failed: {type(exc).__name__}: {exc}")
    if not errors:
        errors += _probe_torch_xla(env)
    if errors:
        env["errors"] = errors
    return env


def _probe_torch_xla(env: dict[str, Any]) -> list[str]:
    try:
        from xla_smoke import compat
        env["torch_xla"] = compat.version()
    except Exception as exc:  # noqa: BLE001
        return [f"import torch_xla failed: {type(exc).__name__}: {exc}"]
    try:
        env["device"] = compat.device_kind()
    except Exception as exc:  # noqa: BLE001 - e.g. PJRT_DEVICE=TPU on a host without one
        return [f"torch_xla could not open its device (PJRT_DEVICE={env['pjrt_device']}): "
                f"{type(exc).__name__}: {exc}"]
    return []


def run(context: Context) -> Outcome:
    expected = context.expectations
    env = context.environment
    problems: list[str] = list(env.get("errors", []))
    problems += _missing(expected)
    problems += _versions(expected, env)
    problems += _abi(expected, env)
    problems += _device(expected, env)
    device = _expected_device(expected, env)
    summary = (f"python {env['python']}, torch {env['torch']}, torch_xla {env['torch_xla']}, "
               f"libtpu {env['libtpu'] or 'none'}, ABI {_abi_text(env['cxx11_abi'])}, device {env['device']}")
    return verdict(problems, f"{summary}: as the image {expected.tag} expects",
                   missing_expectations=expected.missing(), expected_device=device, **_actuals(env))


def _missing(expected: Expectations) -> list[str]:
    return [f"no expectation for {field} (set ${expectations.env_var(field)} or {expectations.flag_name(field)})"
            for field in expected.missing()]


def _versions(expected: Expectations, env: dict[str, Any]) -> list[str]:
    problems = []
    for field in ("python", "torch", "torch_xla"):
        want, have = getattr(expected, field), env.get(field)
        if want is None:
            continue
        if have is None:
            problems.append(f"{field}: expected {want}, but it is not installed")
        elif not version_matches(want, have):
            problems.append(f"{field} version mismatch: expected {want}, found {have}")
    problems += _libtpu(expected.libtpu, env.get("libtpu"))
    return problems


def _libtpu(want: Optional[str], have: Optional[str]) -> list[str]:
    if want is None:
        return []
    if want == "":
        return [] if have is None else [f"libtpu: expected none, found {have}"]
    if have is None:
        return [f"libtpu: expected {want}, but it is not installed"]
    return [] if version_matches(want, have) else [f"libtpu version mismatch: expected {want}, found {have}"]


def _abi(expected: Expectations, env: dict[str, Any]) -> list[str]:
    want, have = expected.expects_cxx11_abi, env.get("cxx11_abi")
    if want is None or have is None or want == have:
        return []
    return [f"C++ ABI mismatch: the image expects {abi_word(want)} but torch is built {abi_word(have)} "
            f"(torch._C._GLIBCXX_USE_CXX11_ABI={have})"]


def _expected_device(expected: Expectations, env: dict[str, Any]) -> str:
    """A TPU image uses the TPU where the host has one; anywhere else (and in a CPU image) torch_xla must
    drive the CPU. A TPU image on a CPU-only host is legitimate: that is how CI smoke-tests it."""
    wants_tpu = expected.accelerator in (None, "tpu")
    return "TPU" if wants_tpu and env.get("tpu_hardware") else "CPU"


def _device(expected: Expectations, env: dict[str, Any]) -> list[str]:
    have = env.get("device")
    if have is None:
        return []  # the import error already says why
    want = _expected_device(expected, env)
    if have == want:
        return []
    hardware = "TPU hardware is present" if env.get("tpu_hardware") else "no TPU hardware is visible"
    return [f"device mismatch: expected {want} ({hardware}, accelerator {expected.accelerator}), "
            f"torch_xla uses {have} (PJRT_DEVICE={env.get('pjrt_device')})"]


def _abi_text(cxx11: Optional[bool]) -> str:
    return "unknown" if cxx11 is None else abi_word(cxx11)


def _actuals(env: dict[str, Any]) -> dict[str, Any]:
    return {key: env.get(key) for key in ("python", "torch", "torch_xla", "libtpu", "cxx11_abi", "device")}
