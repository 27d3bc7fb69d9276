"""Container runtimes (pure): how a profile runs a container step and what the step sees.

One object per `containers.runtime` of a cluster profile; everything that differs between
them is decided here, so the renderer, the planner and the dry-run text only ask `of(cluster)`:

- `none`: no container; the recipe's image is an environment folder put first on PATH.
- `pyxis`: Slurm's SPANK plugin with enroot; the step sees the image and the mounts only.
- `sandbox`: the dev cluster's stand-in for pyxis (bubblewrap): host folders stand for the
  image's operating system, and the step sees those, the image folder and the mounts.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import UserError

if TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.spec.cluster import Cluster
    from launcher.spec.recipe import Recipe

COMPUTE_ENV_IMAGE = "{compute_env}"
LAUNCHER_MOUNT = "/opt/pd-launcher"  # where container steps see the launcher (read-only)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def mounts(plan: Plan) -> list[tuple[str, str, bool]]:
    """(source, destination, read-only) of every container step: the profile's mounts (the
    run directory by default), the recipe's, the shared model cache, the launcher."""
    run_dir = plan.run_dir
    out = []
    for m in [*plan.cluster.containers.mounts, *plan.recipe.container.mounts]:
        parts = m.replace("{run_dir}", run_dir).split(":")
        out.append((parts[0], parts[1], len(parts) > 2 and parts[2] == "ro"))
    hf = plan.cluster.models.hf_home
    if hf and not any(dst == hf for _, dst, _ in out):
        out.append((hf, hf, False))
    out.append((plan.runtime.src + "/launcher", LAUNCHER_MOUNT + "/launcher", True))
    return out


def container_name(image: str) -> str:
    """One named container per image and job: the first step on a node imports it, every
    later step reuses it (pyxis skips the import when the name exists)."""
    slug = re.sub(r"[^a-z0-9]+", "-", image.lower().rsplit("/", 1)[-1]).strip("-")[:24]
    return f"pd-{slug}-{hashlib.sha256(image.encode()).hexdigest()[:8]}"


def image_dir(plan: Plan) -> str | None:
    """A directory image (sandbox, or no runtime): the job's compute environment for
    `{compute_env}`, else the path the recipe names. None for a registry image."""
    c = plan.recipe.container
    if c is None:
        return None
    if c.image == COMPUTE_ENV_IMAGE:
        rt = plan.runtime
        return f"{rt.env}/venv" if rt.env else str(Path(rt.python).parent.parent)
    return c.image if c.image.startswith("/") and not c.image.endswith(".sqsh") else None


def is_directory_image(image: str) -> bool:
    return image == COMPUTE_ENV_IMAGE or image.startswith("/")


class Containers:
    """No container runtime: the image is an environment folder, the step sees the host."""

    name = "none"
    what = "no containers"  # what the profile runs, as a refusal names it
    isolated = False  # True: a step sees only the image and the mounts

    def check_image(self, recipe: Recipe, cluster: Cluster) -> None:
        """The recipe's image must be something this runtime can run."""
        c = recipe.container
        if c is not None and not is_directory_image(c.image):
            raise UserError(
                f"container.image {c.image!r}: the cluster profile {cluster.name} runs "
                f"{self.what}, so the image must be a directory (an environment folder, "
                "or {compute_env})"
            )

    def step_flags(self, plan: Plan) -> list[str]:
        """Options of the srun step a container process runs in."""
        return []

    def wrap(self, plan: Plan) -> list[str]:
        """The argv prefix a container process runs behind."""
        return []

    def launcher_path(self, plan: Plan) -> str:
        """The launcher's source as a container step sees it (its PYTHONPATH)."""
        return LAUNCHER_MOUNT if self.isolated else plan.runtime.src

    def env(self, plan: Plan) -> dict[str, str]:
        """A container process's environment from the runtime: the launcher on PYTHONPATH,
        a directory image's bin/ first on PATH, as an image's own PATH would be."""
        if plan.recipe.container is None:
            return {}
        env = {"PYTHONPATH": self.launcher_path(plan)}
        d = image_dir(plan)
        if d:
            env["PATH"] = f"{d}/bin:{SYSTEM_PATH}"
        return env

    def describe(self, plan: Plan) -> str:
        """One dry-run line: what engines and clients run in, and what they see."""
        return (f"Engines and clients use the environment {plan.recipe.container.image} (its "
                "bin/ first on PATH; no container runtime on this profile: they see the "
                "whole host)")


class Isolated(Containers):
    """A runtime whose steps see only the image and the declared mounts."""

    isolated = True

    def describe(self, plan: Plan) -> str:
        image = plan.recipe.container.image
        pin = "" if "@sha256:" in image or image.startswith(("/", "{")) else (
            " (not pinned by digest: a moved tag changes what runs; use repo@sha256:...)")
        shown = ("the job's own environment ({compute_env})" if image == COMPUTE_ENV_IMAGE
                 else image)
        return (f"Engines and clients run in {shown}{pin} under the {self.name} runtime, "
                "seeing only the image and " + ", ".join(d for _, d, _ in mounts(plan)))


class Pyxis(Isolated):
    name = "pyxis"

    def check_image(self, recipe: Recipe, cluster: Cluster) -> None:
        c = recipe.container
        if c is None and recipe.engine == "vllm":
            raise UserError(
                f"{cluster.name} runs engines in containers (pyxis): set container.image to a "
                "vLLM image, pinned by digest (e.g. vllm/vllm-openai@sha256:...)"
            )
        if c is not None and c.image == COMPUTE_ENV_IMAGE:
            raise UserError(
                "container.image {compute_env} is the sandbox's stand-in; on pyxis give a "
                "vLLM image"
            )

    def image(self, plan: Plan) -> str:
        """The image as pyxis imports it: the shared pre-imported squashfs when the profile
        keeps an image cache, else the reference itself."""
        c, cache = plan.recipe.container, plan.cluster.containers.image_cache
        if cache and not c.image.endswith(".sqsh"):
            return f"{cache}/{container_name(c.image)}.sqsh"
        return c.image

    def step_flags(self, plan: Plan) -> list[str]:
        c, k = plan.recipe.container, plan.cluster.containers
        out = [
            f"--container-image={self.image(plan)}",
            f"--container-name={container_name(c.image)}",
            "--container-mounts="
            + ",".join(f"{s}:{d}" + (":ro" if ro else "") for s, d, ro in mounts(plan)),
            "--no-container-mount-home",
            "--no-container-entrypoint",
        ]
        if k.writable:
            out.append("--container-writable")
        if k.remap_root:
            out.append("--container-remap-root")
        if c.workdir:
            out.append(f"--container-workdir={c.workdir}")
        return out


class Sandbox(Isolated):
    """The dev cluster's stand-in for pyxis (bubblewrap): the step sees the image (its
    operating-system layers and its own folder) and the declared mounts, nothing else of
    the host, so a missing mount fails here as it would on a real cluster."""

    name = "sandbox"
    what = "containers in a sandbox"

    def wrap(self, plan: Plan) -> list[str]:
        k, c = plan.cluster.containers, plan.recipe.container
        argv = ["bwrap", "--die-with-parent"]
        for layer in k.sandbox_layers:
            argv += ["--ro-bind-try", layer, layer]
        argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp"]
        argv += ["--tmpfs", "/root", "--tmpfs", "/home"]  # the image's own writable home
        image = image_dir(plan)  # mounted after the tmpfs layers, which would hide it
        if image:
            argv += ["--ro-bind", image, image]
        for src, dst, ro in mounts(plan):
            argv += ["--ro-bind" if ro else "--bind", src, dst]
        argv += ["--chdir", c.workdir or "/"]
        return [*argv, "--"]


RUNTIMES: dict[str, Containers] = {r.name: r for r in (Containers(), Pyxis(), Sandbox())}


def of(cluster: Cluster) -> Containers:
    return RUNTIMES[cluster.containers.runtime]
