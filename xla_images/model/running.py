"""How a flavour's image is run: its user, home and caches, and the run profiles (docs/running.md).

One description read by everything that runs an image or tells others how to: the template's user and ENV
(generate.render), the smoke runner's and the image checks' containers (run.checking), and `run-spec`'s docker
arguments and Kubernetes Job (cli.run_spec through `docker_args` and `kubernetes_job` here). Pure data.

Two profiles:
- `restricted` (cpu flavours): what a hardened cluster or CI runner imposes. An arbitrary UID with GID 0 (no
  passwd entry: OpenShift's way), a read-only root filesystem with a tmpfs /tmp, every capability dropped,
  no-new-privileges, no network. It is what Kubernetes' "restricted" Pod Security Standard asks of a pod, plus
  a read-only root and no network. The image's startup hook (xla_images/runhome.py) makes HOME and the caches
  /tmp/xla-home-<uid> there.
- `tpu` (tpuvm flavours): what a TPU VM needs: the TPU devices (privileged), the host network (the TPU runtime's
  ports), a 16G /dev/shm, PJRT_DEVICE=TPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..names import LABEL_PREFIX
from ..runhome import FALLBACK_ROOT, IMAGE_HOME
from .flavour import Accelerator

# The image's own non-root user: `USER 1000` in a derived image, `--user 1000`, runAsUser: 1000.
IMAGE_USER = "xla"
IMAGE_UID = 1000
IMAGE_GID = 0
# The ENV the template sets (HOME first: the caches live under it). pip's cache follows XDG_CACHE_HOME.
HOME_ENV = {
    "HOME": IMAGE_HOME,
    "XDG_CACHE_HOME": f"{IMAGE_HOME}/.cache",
    "TORCHINDUCTOR_CACHE_DIR": f"{IMAGE_HOME}/.cache/torchinductor",
}
# The UID the restricted profile runs as: one the image has no passwd entry for.
ARBITRARY_UID = 12345
# The startup hook as the image holds it: a module in site-packages and the .pth line that imports it.
HOME_HOOK_MODULE = "xla_images_home"
# Kubernetes: the container's name in a Job, the TPU resource, GKE's TPU node labels.
K8S_CONTAINER = "xla"
TPU_RESOURCE = "google.com/tpu"
GKE_TPU_ACCELERATOR = "cloud.google.com/gke-tpu-accelerator"
GKE_TPU_TOPOLOGY = "cloud.google.com/gke-tpu-topology"
TMP_SIZE_LIMIT = "8Gi"
# What a run spec runs unless told otherwise: the smoke suite's quick checks (versions and device; scan compiles,
# runs and differentiates on XLA), reports under /tmp: proof that the image works where it was put.
SMOKE_COMMAND = ("python", "-m", "xla_smoke", "--only", "environment,scan", "--report-dir",
                 f"{FALLBACK_ROOT}/xla-smoke-reports")


class Profile:
    RESTRICTED = "restricted"
    TPU = "tpu"
    DEFAULT = "default"


@dataclass(frozen=True)
class RunProfile:
    """Everything about the container but its image and command."""

    name: str
    environment: dict[str, str] = field(default_factory=dict)
    user: str | None = None  # "UID[:GID]"; None: the image's (root)
    read_only: bool = False
    tmpfs: tuple[str, ...] = ()  # mount points of a writable, exec-able tmpfs
    cap_drop: tuple[str, ...] = ()
    no_new_privileges: bool = False
    network: str | None = None  # "none", "host"; None: the engine's default bridge
    privileged: bool = False
    shm_size: str | None = None

    @property
    def uid(self) -> int | None:
        return int(self.user.split(":")[0]) if self.user else None

    @property
    def gid(self) -> int | None:
        return int(self.user.split(":")[1]) if self.user and ":" in self.user else None


def default_profile(accelerator: Accelerator) -> RunProfile:
    """The plain container the smoke suite has always run in (as root, the engine's network)."""
    return RunProfile(Profile.DEFAULT, environment={"PJRT_DEVICE": accelerator.pjrt_device})


def restricted_profile(uid: int = ARBITRARY_UID, gid: int = IMAGE_GID) -> RunProfile:
    return RunProfile(Profile.RESTRICTED, environment={"PJRT_DEVICE": Accelerator.CPU.pjrt_device},
                      user=f"{uid}:{gid}", read_only=True, tmpfs=(FALLBACK_ROOT,), cap_drop=("ALL",),
                      no_new_privileges=True, network="none")


def tpu_profile() -> RunProfile:
    return RunProfile(Profile.TPU, environment={"PJRT_DEVICE": Accelerator.TPU.pjrt_device}, privileged=True,
                      network="host", shm_size="16G")


def profile_for(accelerator: Accelerator) -> RunProfile:
    """How a flavour is meant to be run: a TPU flavour on a TPU VM, a CPU flavour restricted."""
    return tpu_profile() if accelerator is Accelerator.TPU else restricted_profile()


# --- docker ------------------------------------------------------------------------------------------------

TMPFS_OPTIONS = "rw,exec,nosuid,nodev"  # exec: torch's inductor cache loads the libraries it compiles there


def docker_args(profile: RunProfile) -> list[str]:
    """`docker run` options for the profile, in a stable order (image and command not included)."""
    args: list[str] = []
    if profile.user:
        args += ["--user", profile.user]
    if profile.read_only:
        args.append("--read-only")
    for mount in profile.tmpfs:
        args += ["--tmpfs", f"{mount}:{TMPFS_OPTIONS}"]
    for cap in profile.cap_drop:
        args += ["--cap-drop", cap]
    if profile.no_new_privileges:
        args += ["--security-opt", "no-new-privileges"]
    if profile.privileged:
        args.append("--privileged")
    if profile.network:
        args += ["--network", profile.network]
    if profile.shm_size:
        args += ["--shm-size", profile.shm_size]
    for name, value in profile.environment.items():
        args += ["-e", f"{name}={value}"]
    return args


# --- kubernetes ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TpuSlice:
    """The GKE TPU slice a tpuvm Job asks for (node selectors and the chips it requests)."""

    accelerator: str = "tpu-v5-lite-podslice"
    topology: str = "2x2"
    chips_per_host: int | None = None  # None: the slice's chips, at most 4 (v4/v5e/v6e hosts carry 4, or 8)

    @property
    def chips(self) -> int:
        """The google.com/tpu the one pod requests: every chip of a one-host slice."""
        if self.chips_per_host:
            return self.chips_per_host
        chips = 1
        for part in self.topology.split("x"):
            chips *= int(part)
        return min(chips, 4)


def kubernetes_job(profile: RunProfile, image: str, *, name: str, tag: str, command: list[str] | None = None,
                   tpu: TpuSlice | None = None) -> dict[str, Any]:
    """A batch/v1 Job running `command` (the image's CMD when None) in the profile's pod."""
    container: dict[str, Any] = {"name": K8S_CONTAINER, "image": image,
                                 "env": [{"name": key, "value": value} for key, value in profile.environment.items()]}
    if command:
        container["command"] = command
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if profile.name == Profile.TPU:
        _tpu_pod(pod, container, tpu or TpuSlice())
    else:
        _restricted_pod(profile, pod, container)
    labels = {"app.kubernetes.io/name": "xla-images", f"{LABEL_PREFIX}/tag": tag}
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": labels},
            "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": dict(labels)}, "spec": pod}}}


def _tpu_pod(pod: dict[str, Any], container: dict[str, Any], tpu: TpuSlice) -> None:
    # GKE schedules TPU pods by these node labels and the google.com/tpu resource; the TPU runtime wants the
    # host network, and the device plugin hands the chips in without `privileged`.
    pod["nodeSelector"] = {GKE_TPU_ACCELERATOR: tpu.accelerator, GKE_TPU_TOPOLOGY: tpu.topology}
    pod["hostNetwork"] = True
    pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    chips = str(tpu.chips)  # one pod, one TPU VM host: a multi-host slice needs one pod per host (a JobSet)
    container["resources"] = {"requests": {TPU_RESOURCE: chips}, "limits": {TPU_RESOURCE: chips}}
    container["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    pod["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Gi"}}]


def _restricted_pod(profile: RunProfile, pod: dict[str, Any], container: dict[str, Any]) -> None:
    # The restricted Pod Security Standard's rules, each set explicitly (docs/running.md cites them), plus a
    # read-only root with an emptyDir for /tmp: HOME and the caches go there (xla_images/runhome.py).
    pod["securityContext"] = {"runAsNonRoot": True, "runAsUser": profile.uid or ARBITRARY_UID,
                              "runAsGroup": profile.gid if profile.gid is not None else IMAGE_GID,
                              "seccompProfile": {"type": "RuntimeDefault"}}
    pod["automountServiceAccountToken"] = False
    container["securityContext"] = {"allowPrivilegeEscalation": False, "privileged": False,
                                    "readOnlyRootFilesystem": profile.read_only,
                                    "capabilities": {"drop": list(profile.cap_drop) or ["ALL"]}}
    container["volumeMounts"] = [{"name": f"tmp{index}", "mountPath": mount}
                                 for index, mount in enumerate(profile.tmpfs)]
    pod["volumes"] = [{"name": f"tmp{index}", "emptyDir": {"sizeLimit": TMP_SIZE_LIMIT}}
                      for index, _ in enumerate(profile.tmpfs)]
