"""Container runtimes (pure): how a profile runs a container step and what the step sees.

One object per `containers.runtime` of a cluster profile; everything that differs between
them is decided here, so the renderer, the planner and the dry-run text only ask `of(cluster)`:

- `none`: no container; the recipe's image is an environment folder put first on PATH.
- `pyxis`: Slurm's SPANK plugin with enroot; the step sees the image and the mounts only
  (docs/containers.md: what real pyxis and enroot do with each of our options).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from launcher.errors import UserError

if TYPE_CHECKING:
    from launcher.planning.plan import Plan
    from launcher.schema.cluster import Cluster
    from launcher.schema.recipe import Recipe

COMPUTE_ENV_IMAGE = "{compute_env}"
LAUNCHER_MOUNT = "/opt/pd-launcher"  # where container steps see the launcher (read-only)
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def mounts(plan: Plan) -> list[tuple[str, str, bool]]:
    """(source, destination, read-only) of every container step: the profile's mounts (the
    run directory by default), the recipe's, the shared model cache, the engine's
    environment folder, the launcher."""
    run_dir = plan.mount_dir or plan.run_dir
    out = []
    for m in [*plan.cluster.containers.mounts, *plan.recipe.container.mounts]:
        parts = m.replace("{run_dir}", run_dir).split(":")
        out.append((parts[0], parts[1], len(parts) > 2 and parts[2] == "ro"))
    hf = plan.cluster.models.hf_home
    if hf and not any(dst == hf for _, dst, _ in out):
        out.append((hf, hf, False))
    env_dir = environment_dir(plan) if plan.recipe.container.environment else None
    if env_dir:
        out.append((env_dir, env_dir, True))
    out.append((plan.runtime.src + "/launcher", LAUNCHER_MOUNT + "/launcher", True))
    taken = {dst for _, dst, _ in out}
    return out + [m for m in srt_slurm_mounts(plan) if m[1] not in taken]


def srt_slurm_mounts(plan: Plan) -> list[tuple[str, str, bool]]:
    """srt-slurm's own mounts, for a custom benchmark (benchmark.custom): the run directory
    at /logs (its log directory, where published scripts write results) and a model folder
    at /model (their tokenizer). In every container step of the run, not the benchmark's
    alone: pyxis attaches a later step to the node's running named container and ignores
    that step's mounts. Not in a study's one allocation, whose containers outlive a run."""
    b = plan.recipe.benchmark
    if not b.enabled or b.custom is None or plan.mount_dir:
        return []
    out = [(plan.run_dir, "/logs", False)]
    if plan.recipe.model.path.startswith("/"):
        out.append((plan.recipe.model.path, "/model", True))
    return out


# A registry reference as users write it (Docker's form) and as enroot 4.1 parses it:
# [REGISTRY/]REPO[:TAG][@sha256:HEX]; REGISTRY has a '.' or a ':' (else it is a Docker Hub
# namespace), REPO is lower case.
_REF = re.compile(
    r"^(?:(?P<registry>[A-Za-z0-9.-]+(?::[0-9]+)?|localhost)[/#])?"
    r"(?P<repo>[a-z0-9]+(?:[._/-][a-z0-9]+)*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9._-]{0,127}))?"
    r"(?:@(?P<digest>[^@]+))?$"
)
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def parse_image(ref: str) -> dict[str, str | None]:
    """registry, repo, tag and digest of a registry reference; a UserError naming the form
    when it is not one (enroot would fail the step on every node with "Invalid image
    reference")."""
    form = ("write REGISTRY/REPO:TAG or REGISTRY/REPO@sha256:<64 hex digits> (e.g. "
            "vllm/vllm-openai@sha256:..., nvcr.io/nvidia/vllm:25.10-py3)")
    m = _REF.match(ref)
    if not m:
        raise UserError(f"container.image {ref!r} is not an image reference: {form}")
    parts = m.groupdict()
    head = ref.split("/", 1)[0].split("#", 1)[0]
    if "#" not in ref and parts["registry"] and not ("." in head or ":" in head
                                                      or head == "localhost"):
        # docker.io namespace (vllm/vllm-openai), not a registry host
        parts["repo"], parts["registry"] = f"{parts['registry']}/{parts['repo']}", None
    if parts["digest"] is not None and not DIGEST.match(parts["digest"]):
        raise UserError(
            f"container.image {ref!r}: the digest {parts['digest']!r} is not sha256:<64 "
            f"lower-case hex digits> (copy it from `docker buildx imagetools inspect` or "
            f"`skopeo inspect`): {form}")
    return parts


def enroot_uri(ref: str) -> str:
    """The reference as pyxis passes it to enroot: REGISTRY#REPO[:TAG][@DIGEST], the form
    pyxis documents (enroot 4.1 also reads Docker's REGISTRY/REPO, older enroot does not)."""
    p = parse_image(ref)
    out = f"{p['registry']}#{p['repo']}" if p["registry"] else p["repo"]
    return out + (f":{p['tag']}" if p["tag"] else "") + (f"@{p['digest']}" if p["digest"] else "")


def container_name(image: str) -> str:
    """One named container per image and job: the first step on a node imports it, every
    later step reuses it (pyxis skips the import when the name exists)."""
    slug = re.sub(r"[^a-z0-9]+", "-", image.lower().rsplit("/", 1)[-1]).strip("-")[:24]
    return f"pd-{slug}-{hashlib.sha256(image.encode()).hexdigest()[:8]}"


def _folder(plan: Plan, path: str) -> str:
    """`{compute_env}` is the job's own environment (a venv); any other path is itself."""
    if path == COMPUTE_ENV_IMAGE:
        rt = plan.runtime
        return f"{rt.env}/venv" if rt.env else str(Path(rt.python).parent.parent)
    return path


def environment_dir(plan: Plan) -> str | None:
    """The software environment whose bin/ goes first on PATH: the recipe's
    container.environment (mounted into the container), or without a container runtime a
    directory image. None when the image's own PATH is the engine's."""
    c = plan.recipe.container
    if c is None:
        return None
    if c.environment:
        return _folder(plan, c.environment)
    if is_directory_image(c.image) and not c.image.endswith(".sqsh"):
        return _folder(plan, c.image)
    return None


def is_directory_image(image: str) -> bool:
    return image == COMPUTE_ENV_IMAGE or image.startswith("/")


def registry_image(plan: Plan) -> str | None:
    """The recipe's image when it is pulled from a registry (not a folder or a .sqsh)."""
    c = plan.recipe.container
    if c is None or is_directory_image(c.image) or c.image.endswith(".sqsh"):
        return None
    return c.image


def cached_image(plan: Plan) -> str | None:
    """The .sqsh the image step imports a registry image into, once for every job of the
    cluster, when the profile keeps an image cache (None without one)."""
    image, cache = registry_image(plan), plan.cluster.containers.image_cache
    if image is None or not cache:
        return None
    return f"{cache}/{container_name(image)}.sqsh"


class ContainerRuntime:
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

    def launcher_path(self, plan: Plan) -> str:
        """The launcher's source as a container step sees it (its PYTHONPATH)."""
        return LAUNCHER_MOUNT if self.isolated else plan.runtime.src

    def env(self, plan: Plan) -> dict[str, str]:
        """A container process's environment from the runtime: the launcher on PYTHONPATH,
        a directory image's bin/ first on PATH, as an image's own PATH would be."""
        if plan.recipe.container is None:
            return {}
        env = {"PYTHONPATH": self.launcher_path(plan)}
        d = environment_dir(plan)
        if d:
            env["PATH"] = f"{d}/bin:{SYSTEM_PATH}"
        return env

    def describe(self, plan: Plan) -> str:
        """One dry-run line: what engines and clients run in, and what they see."""
        return (f"Engines and clients use the environment {plan.recipe.container.image} (its "
                "bin/ first on PATH; no container runtime on this profile: they see the "
                "whole host)")


class Pyxis(ContainerRuntime):
    """Slurm's pyxis with enroot: a step sees only the image and the declared mounts."""

    name = "pyxis"
    isolated = True

    def describe(self, plan: Plan) -> str:
        c = plan.recipe.container
        pin = "" if "@sha256:" in c.image or c.image.startswith("/") else (
            " (not pinned by digest: a moved tag changes what runs; use repo@sha256:...)")
        how = (f"imported once into {cached_image(plan)}" if cached_image(plan)
               else "imported by each node's first step")
        env = (f"; the environment {environment_dir(plan)} mounted, its bin/ first on PATH"
               if c.environment else "")
        return (f"Engines and clients run in {c.image}{pin} under pyxis ({how}, one named "
                f"container per node reused by every later step{env}), seeing only the "
                "image and " + ", ".join(d for _, d, _ in mounts(plan)))

    def check_image(self, recipe: Recipe, cluster: Cluster) -> None:
        c = recipe.container
        if c is None and recipe.engine_kind.needs_image:
            raise UserError(
                f"{cluster.name} runs engines in containers (pyxis): set container.image to a "
                "vLLM image, pinned by digest (e.g. vllm/vllm-openai@sha256:...)"
            )
        if c is None:
            return
        if c.image.endswith(".sqsh"):
            if not c.image.startswith("/"):
                raise UserError(f"container.image {c.image!r}: a squashfs image is a path "
                                "on the nodes: give it from / (pyxis reads a relative "
                                "name as a registry image)")
            return
        if is_directory_image(c.image):
            raise UserError(
                f"container.image {c.image!r} is a folder; pyxis runs images (a registry "
                "reference such as vllm/vllm-openai@sha256:..., or a .sqsh file): name "
                "the image, and put a software environment folder in container.environment")
        parse_image(c.image)

    def image(self, plan: Plan) -> str:
        """The image as pyxis takes it: the shared squashfs the image step imports once when
        the profile keeps an image cache, a .sqsh path as is, else enroot's URI."""
        ref = plan.recipe.container.image
        if ref.endswith(".sqsh"):
            return ref
        return cached_image(plan) or enroot_uri(ref)

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


RUNTIMES: dict[str, ContainerRuntime] = {r.name: r for r in (ContainerRuntime(), Pyxis())}


def of(cluster: Cluster) -> ContainerRuntime:
    return RUNTIMES[cluster.containers.runtime]
