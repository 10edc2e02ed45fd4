"""model.running: the run profiles, their docker arguments and Kubernetes Jobs.

Every Job is validated against the Kubernetes API schema (kubernetes-validate, offline: it ships the schemas), and
the restricted one against the restricted Pod Security Standard (pod_security.py, control by control).
"""
from __future__ import annotations

from typing import Any, Callable

import kubernetes_validate
import pytest

from pod_security import K8S_VERSION, RESTRICTED_POLICY, violations
from xla_images.model import running
from xla_images.model.flavour import Accelerator

def restricted_job(**kwargs: Any) -> dict[str, Any]:
    return running.kubernetes_job(running.restricted_profile(**kwargs), "127.0.0.1:5000/xla-images@sha256:" + "a" * 64,
                                  name="xla-r2-9-0-3-11-cpu", tag="r2.9.0_3.11_cpu",
                                  command=list(running.SMOKE_COMMAND))


def tpu_job(tpu: running.TpuSlice | None = None) -> dict[str, Any]:
    return running.kubernetes_job(running.tpu_profile(), "127.0.0.1:5000/xla-images:r2.9.0_3.11_tpuvm",
                                  name="xla-r2-9-0-3-11-tpuvm", tag="r2.9.0_3.11_tpuvm", tpu=tpu)


# --- the profiles ---------------------------------------------------------------------------------------------

def test_profile_for_each_accelerator() -> None:
    assert running.profile_for(Accelerator.TPU) == running.tpu_profile()
    restricted = running.profile_for(Accelerator.CPU)
    assert restricted.name == running.Profile.RESTRICTED
    assert (restricted.uid, restricted.gid) == (running.ARBITRARY_UID, 0)
    assert restricted.read_only and restricted.no_new_privileges and restricted.cap_drop == ("ALL",)
    assert restricted.network == "none" and restricted.tmpfs == ("/tmp",)


def test_docker_args_restricted() -> None:
    args = running.docker_args(running.restricted_profile(uid=4242))
    assert args == ["--user", "4242:0", "--read-only", "--tmpfs", "/tmp:rw,exec,nosuid,nodev", "--cap-drop", "ALL",
                    "--security-opt", "no-new-privileges", "--network", "none", "-e", "PJRT_DEVICE=CPU"]


def test_docker_args_tpu() -> None:
    args = running.docker_args(running.tpu_profile())
    assert args == ["--privileged", "--network", "host", "--shm-size", "16G", "-e", "PJRT_DEVICE=TPU"]


def test_home_env_is_under_the_hooks_home() -> None:
    """The template's HOME and caches live under the home the startup hook knows how to move."""
    from xla_images import runhome
    assert running.HOME_ENV["HOME"] == runhome.IMAGE_HOME
    assert all(value.startswith(runhome.IMAGE_HOME) for value in running.HOME_ENV.values())
    assert set(running.HOME_ENV) <= set(runhome.VARIABLES)


# --- Kubernetes: the API schema and the restricted standard -----------------------------------------------------

@pytest.mark.parametrize("make", [restricted_job, tpu_job], ids=["restricted", "tpu"])
def test_job_is_valid_kubernetes(make: Callable[[], dict[str, Any]]) -> None:
    kubernetes_validate.validate(make(), K8S_VERSION, strict=True)


def test_restricted_job_meets_the_restricted_standard() -> None:
    job = restricted_job()
    assert violations(job) == []
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    assert pod["securityContext"]["runAsUser"] == running.ARBITRARY_UID


def test_the_policy_check_catches_each_rule() -> None:
    """Each control fails on a pod that breaks it (the check is not vacuous)."""
    breakers: dict[str, Callable[[dict[str, Any]], None]] = {
        "Host Namespaces": lambda pod: pod.update(hostNetwork=True),
        "Privileged Containers": lambda pod: pod["containers"][0]["securityContext"].update(privileged=True),
        "HostPath Volumes": lambda pod: pod["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
        "Host Ports": lambda pod: pod["containers"][0].update(ports=[{"containerPort": 1, "hostPort": 1}]),
        "Volume Types": lambda pod: pod["volumes"].append({"name": "g", "gitRepo": {"repository": "x"}}),
        "Privilege Escalation (v1.8+)": lambda pod: pod["containers"][0]["securityContext"].pop(
            "allowPrivilegeEscalation"),
        "Running as Non-root": lambda pod: pod["securityContext"].pop("runAsNonRoot"),
        "Running as Non-root user (v1.23+)": lambda pod: pod["securityContext"].update(runAsUser=0),
        "Seccomp (v1.19+)": lambda pod: pod["securityContext"].update(seccompProfile={"type": "Unconfined"}),
        "Capabilities (v1.22+)": lambda pod: pod["containers"][0]["securityContext"]["capabilities"].update(
            add=["SYS_ADMIN"]),
    }
    assert set(breakers) == {control for control, _, _ in RESTRICTED_POLICY}
    for control, brake in breakers.items():
        job = restricted_job()
        brake(job["spec"]["template"]["spec"])
        assert [v for v in violations(job) if v.startswith(control + " ")], control


def test_tpu_job_asks_for_a_tpu_node() -> None:
    pod = tpu_job(running.TpuSlice("tpu-v6e-slice", "2x4", 8))["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {running.GKE_TPU_ACCELERATOR: "tpu-v6e-slice", running.GKE_TPU_TOPOLOGY: "2x4"}
    resources = pod["containers"][0]["resources"]
    assert resources["requests"][running.TPU_RESOURCE] == resources["limits"][running.TPU_RESOURCE] == "8"
    assert pod["hostNetwork"] is True
    assert pod["containers"][0]["env"] == [{"name": "PJRT_DEVICE", "value": "TPU"}]


@pytest.mark.parametrize(("topology", "chips"), [("1x1", 1), ("2x2", 4), ("2x2x1", 4), ("4x4", 4)])
def test_tpu_chips_default_to_the_slice_at_most_four(topology: str, chips: int) -> None:
    assert running.TpuSlice(topology=topology).chips == chips
