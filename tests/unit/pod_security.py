"""The restricted Pod Security Standard as a policy check, and the Kubernetes version manifests are validated
against: shared by test_running.py and test_run_spec.py.

Read control by control from https://kubernetes.io/docs/concepts/security/pod-security-standards/ (each rule
cites its control and level). checkov was not used: `pip install --dry-run checkov` here resolves 96
distributions (boto3, aiohttp, networkx, numpy, pydantic ...) and its own pins of docker, cyclonedx and jinja2,
which would move the project's pinned ones, for a dozen fields of one pod spec.
"""
from __future__ import annotations

from typing import Any, Callable

K8S_VERSION = "1.33"
PSS = "https://kubernetes.io/docs/concepts/security/pod-security-standards/"
# Restricted "Volume Types": only these volume sources.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                      "secret"}


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod.get("initContainers", []), *pod["containers"], *pod.get("ephemeralContainers", [])]


def _effective(pod: dict[str, Any], container: dict[str, Any], key: str) -> Any:
    """A container's securityContext field, else the pod's (how the kubelet resolves runAsNonRoot, seccomp...)."""
    own = container.get("securityContext", {})
    return own[key] if key in own else pod.get("securityContext", {}).get(key)


# (control, its anchor on the PSS page, predicate(pod) -> list of violations)
def _baseline_host(pod: dict[str, Any]) -> list[str]:
    return [key for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]


def _baseline_privileged(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in _containers(pod) if c.get("securityContext", {}).get("privileged")]


def _baseline_host_path(pod: dict[str, Any]) -> list[str]:
    return [v["name"] for v in pod.get("volumes", []) if "hostPath" in v]


def _baseline_host_ports(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in _containers(pod) for port in c.get("ports", []) if port.get("hostPort")]


def _restricted_volumes(pod: dict[str, Any]) -> list[str]:
    return [v["name"] for v in pod.get("volumes", []) if not (set(v) - {"name"}) <= RESTRICTED_VOLUMES]


def _restricted_escalation(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in _containers(pod) if c.get("securityContext", {}).get("allowPrivilegeEscalation") is not False]


def _restricted_non_root(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in _containers(pod) if _effective(pod, c, "runAsNonRoot") is not True]


def _restricted_non_root_user(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in _containers(pod) if _effective(pod, c, "runAsUser") == 0]


def _restricted_seccomp(pod: dict[str, Any]) -> list[str]:
    return [c["name"] for c in _containers(pod)
            if (_effective(pod, c, "seccompProfile") or {}).get("type") not in ("RuntimeDefault", "Localhost")]


def _restricted_capabilities(pod: dict[str, Any]) -> list[str]:
    bad = []
    for container in _containers(pod):
        capabilities = container.get("securityContext", {}).get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []) or set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            bad.append(container["name"])
    return bad


RESTRICTED_POLICY: tuple[tuple[str, str, Callable[[dict[str, Any]], list[str]]], ...] = (
    ("Host Namespaces", "baseline", _baseline_host),
    ("Privileged Containers", "baseline", _baseline_privileged),
    ("HostPath Volumes", "baseline", _baseline_host_path),
    ("Host Ports", "baseline", _baseline_host_ports),
    ("Volume Types", "restricted", _restricted_volumes),
    ("Privilege Escalation (v1.8+)", "restricted", _restricted_escalation),
    ("Running as Non-root", "restricted", _restricted_non_root),
    ("Running as Non-root user (v1.23+)", "restricted", _restricted_non_root_user),
    ("Seccomp (v1.19+)", "restricted", _restricted_seccomp),
    ("Capabilities (v1.22+)", "restricted", _restricted_capabilities),
)


def violations(job: dict[str, Any]) -> list[str]:
    pod = job["spec"]["template"]["spec"]
    return [f"{control} ({level}, {PSS}#{level}): {found}" for control, level, check in RESTRICTED_POLICY
            if (found := check(pod))]
