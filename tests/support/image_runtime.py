"""Run a container image's root filesystem the way a Pod runs it, without a container runtime.

    image = UnpackedImage.from_archive(archive, tmp_dir)      # umoci unpack
    pod = PodSandbox(image, service_account_dir, log_path)
    pod.start(["--metrics-bind-address=..."], env={"KUBERNETES_SERVICE_HOST": ...})
    pod.host_pid, pod.status_field("NoNewPrivs"), pod.signal(SIGTERM), pod.wait(35)

`podman run` is refused by this sandbox (rlimits, cgroups), so the pieces a
runtime puts together are put together here, from the image's own config
(`umoci unpack` writes the runtime-spec config.json: entrypoint, user, env):

- new mount, PID and UTS namespaces (`unshare --mount --pid --uts --fork`):
  the entrypoint is PID 1 of its namespace, as in a container, so SIGTERM
  reaches it only through the handler it installs; the hostname is the Pod's
  name;
- the root filesystem bind-mounted on itself and remounted read-only
  (readOnlyRootFilesystem), with /proc, a /dev holding only null, zero,
  random and urandom, and the ServiceAccount directory (read-only) at
  /var/run/secrets/kubernetes.io/serviceaccount;
- no_new_privs (allowPrivilegeEscalation: false), the image's numeric user
  (chroot --userspec: every capability goes with the switch from root), and
  only the image's environment plus what the test passes (a kubelet's
  KUBERNETES_SERVICE_* variables).

The host's network is shared (the apiserver and the probes are on 127.0.0.1).
The unpacked root filesystem belongs to the test: mount points are created in
it before it turns read-only, as a runtime does in its own copy.
"""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import shutil
import signal
import subprocess
from dataclasses import dataclass

SERVICE_ACCOUNT_MOUNT = "var/run/secrets/kubernetes.io/serviceaccount"
_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)

# Runs as root in the new namespaces, on the host's tools, then becomes the
# image's entrypoint (exec keeps the PID: the entrypoint is PID 1).
_SANDBOX_SCRIPT = r"""
set -eu
root=$1 sa=$2 name=$3; shift 3
hostname "$name"
mount --bind "$root" "$root"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t tmpfs -o nosuid,noexec,mode=0755,size=64k dev "$root/dev"
for node in null zero random urandom; do
    : > "$root/dev/$node"
    mount --bind "/dev/$node" "$root/dev/$node"
done
mount --bind -o ro "$sa" "$root/SA_MOUNT"
mount -o remount,bind,ro,nosuid,nodev "$root"
exec setpriv --no-new-privs -- env -i "$@"
""".replace("SA_MOUNT", SERVICE_ACCOUNT_MOUNT)


@dataclass(frozen=True)
class UnpackedImage:
    rootfs: pathlib.Path
    entrypoint: list[str]          # process.args of the runtime config: ENTRYPOINT + CMD
    env: dict[str, str]
    uid: int
    gid: int

    @classmethod
    def from_archive(cls, archive: pathlib.Path, workdir: pathlib.Path,
                     platform: str = "linux/amd64") -> "UnpackedImage":
        """`umoci unpack` of the image for `platform` in an OCI archive: a single
        image (podman save --format oci-archive) or an image index (make image)."""
        umoci = shutil.which("umoci")
        assert umoci, "umoci is missing: `make image-tools` installs it"
        layout, bundle = workdir / "oci", workdir / "bundle"
        layout.mkdir(parents=True)
        subprocess.run(["tar", "-C", str(layout), "-xf", str(archive)], check=True)
        (descriptor,) = select_platform(layout, platform)
        ref = descriptor["annotations"]["org.opencontainers.image.ref.name"]
        proc = subprocess.run([umoci, "unpack", "--image", f"{layout}:{ref}", str(bundle)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"umoci unpack failed: {proc.stderr}"
        process = json.loads((bundle / "config.json").read_text())["process"]
        env = dict(item.split("=", 1) for item in process.get("env", []))
        return cls(rootfs=bundle / "rootfs", entrypoint=list(process["args"]), env=env,
                   uid=int(process["user"]["uid"]), gid=int(process["user"]["gid"]))

    def emulated(self, emulator: str) -> list[str]:
        """The entrypoint run by a user-mode emulator copied into the root (/.qemu):
        inside the chroot nothing of the host can stand in for a file the image
        lacks, as qemu's -L would let it. An emulator runs ELF files only, so the
        entrypoint's #! line is spelled out: its interpreter, then the script."""
        shutil.copy(emulator, self.rootfs / ".qemu")
        (shebang,) = (self.rootfs / self.entrypoint[0].lstrip("/")).read_text().splitlines()[:1]
        return ["/.qemu", shebang.removeprefix("#!"), *self.entrypoint]

    def make_mount_point(self, relative: str) -> pathlib.Path:
        """mkdir -p inside the root, refusing any symlink on the way (it could lead out)."""
        path = self.rootfs
        for part in pathlib.PurePosixPath(relative).parts:
            path = path / part
            assert not path.is_symlink(), f"{path} is a symlink in the image"
            path.mkdir(mode=0o755, exist_ok=True)
        return path


def blob(layout: pathlib.Path, digest: str) -> dict:
    return json.loads((layout / "blobs" / digest.replace(":", "/")).read_text())


def select_platform(layout: pathlib.Path, platform: str) -> list[dict]:
    """Point the layout's index.json at the image for `platform` (os/arch) alone,
    named by its platform, when it names an image index; return its descriptors."""
    index_json = layout / "index.json"
    (top,) = json.loads(index_json.read_text())["manifests"]
    if top["mediaType"] == "application/vnd.oci.image.index.v1+json":
        found = [m for m in blob(layout, top["digest"])["manifests"]
                 if f"{m['platform']['os']}/{m['platform']['architecture']}" == platform]
        assert len(found) == 1, f"{len(found)} images for {platform} in the index"
        top = {**found[0], "annotations": {"org.opencontainers.image.ref.name": platform}}
        index_json.write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))
    return [top]


def _die_with_parent() -> None:
    _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class PodSandbox:
    """The image's entrypoint in its own namespaces; see the module docstring."""

    def __init__(self, image: UnpackedImage, service_account_dir: pathlib.Path,
                 log_path: pathlib.Path, *, name: str, emulator: str | None = None):
        self.image, self.service_account_dir, self.log_path = image, service_account_dir, log_path
        self.name = name            # the Pod's name: hostname and $HOSTNAME
        # Another architecture's image: its entrypoint under this user-mode emulator.
        self.emulator = emulator
        self.proc: subprocess.Popen | None = None

    def start(self, args: list[str], env: dict[str, str]) -> None:
        for tool in ("unshare", "setpriv", "chroot", "mount"):
            assert shutil.which(tool), f"{tool} is missing (util-linux / coreutils)"
        self.image.make_mount_point(SERVICE_ACCOUNT_MOUNT)
        for directory in ("proc", "dev"):
            assert (self.image.rootfs / directory).is_dir(), f"the image has no /{directory}"
        full_env = {**self.image.env, "HOSTNAME": self.name, **env}
        user = f"{self.image.uid}:{self.image.gid}"
        argv = ["unshare", "--mount", "--pid", "--uts", "--fork", "--kill-child", "--propagation", "private",
                "sh", "-c", _SANDBOX_SCRIPT, "sandbox",
                str(self.image.rootfs), str(self.service_account_dir), self.name,
                *[f"{k}={v}" for k, v in full_env.items()],
                "chroot", f"--userspec={user}", f"--groups={self.image.gid}",
                str(self.image.rootfs),
                *(self.image.emulated(self.emulator) if self.emulator else self.image.entrypoint),
                *args]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)

    @property
    def host_pid(self) -> int | None:
        """The entrypoint's PID as the host sees it: unshare's only child."""
        assert self.proc is not None
        try:
            children = pathlib.Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
            pids = children.read_text().split()
        except OSError:
            return None
        return int(pids[0]) if len(pids) == 1 else None

    def is_entrypoint_running(self) -> bool:
        """The child has exec'd the image's interpreter (the setup script is done)."""
        pid = self.host_pid
        if pid is None:
            return False
        try:
            return os.readlink(f"/proc/{pid}/root") == str(self.image.rootfs)
        except OSError:
            return False

    def status_field(self, name: str) -> str:
        """A line of /proc/PID/status of the entrypoint ("Uid", "CapEff", "NoNewPrivs"...)."""
        for line in pathlib.Path(f"/proc/{self.host_pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key == name:
                return value.strip()
        raise KeyError(name)

    def root_mount_options(self) -> set[str]:
        """Mount options of / as the entrypoint sees it."""
        for line in pathlib.Path(f"/proc/{self.host_pid}/mountinfo").read_text().splitlines():
            fields = line.split()
            if fields[4] == "/":
                return set(fields[5].split(","))
        raise AssertionError("no / in the entrypoint's mountinfo")

    def signal(self, signum: int) -> None:
        """To the entrypoint itself, as a runtime signals a container's PID 1."""
        pid = self.host_pid
        assert pid is not None, "the entrypoint is not running"
        os.kill(pid, signum)

    def wait(self, timeout: float) -> int:
        """The entrypoint's exit code (unshare --fork passes it on)."""
        assert self.proc is not None
        return self.proc.wait(timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL unshare; --kill-child takes the entrypoint with it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
