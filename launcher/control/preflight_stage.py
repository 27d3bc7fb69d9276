"""The preflight stage: the check steps inside the engine's container on every node, before
any model loads (argv, versions, model, mounts; each step's output judged by
launcher.control.preflight), and what they found as the run's identity in run.json.
The orchestrator runs each step (cancellable, with its timeout) and calls this at its stage.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from launcher.control import preflight
from launcher.control.record import Book, say
from launcher.errors import RunFailed
from launcher.planning import containers, render
from launcher.planning.plan import Plan
from launcher.run import rundir
from launcher.run.plandoc import PlanDoc
from launcher.run.rundir import tail


def run_preflight(run: rundir.RunDir, plan: Plan, doc: PlanDoc, book: Book,
                  step: Callable[[str, list[list[str]]], bool]) -> None:
    """Inside the engine's container on every node, before any model loads. `step`: runs
    one check step to its end, whether every command of it exited 0."""
    t0 = time.monotonic()
    unexplained = None  # the container check's log tail when it failed for no known cause
    image_digest = None  # the registry's, from the image step
    for name, commands in render.check_steps(plan)[1:]:
        if not step(name, commands):
            log = run.log(name)
            text = log.read_text(errors="replace") if log.is_file() else ""
            if problems := preflight.step_failures(name, text, plan):
                raise RunFailed("preflight: " + "; ".join(problems),
                                culprit=problems[0].culprit)
            if name.startswith("stage-"):
                raise RunFailed(f"preflight: {name} failed on {plan.nodes[0]}: "
                                + " | ".join(tail(log, 5)), culprit=plan.nodes[0])
            if name == "preflight-container":
                unexplained = " | ".join(tail(log, 3)) or "its log is empty"
        elif name == "stage-image":
            image_digest = note_image(book, run.log(name))
    image_digest = image_digest or tag_digest(plan)
    facts = preflight.read_facts(run.path, list(plan.nodes), "container")
    hosts = preflight.read_facts(run.path, list(plan.nodes), "host")
    problems = preflight.judge_container(
        plan, doc, facts, plan.recipe.engine_version, hosts, unexplained)
    if problems:
        raise RunFailed("preflight: " + "; ".join(problems), culprit=problems[0].culprit)
    took = time.monotonic() - t0
    book.record.identity = identity(plan, facts, hosts, image_digest)
    book.save()
    book.event("preflight_ok", seconds=round(took, 2))
    say(f"preflight passed on {len(plan.nodes)} node(s) in {took:.1f} s")


def tag_digest(plan: Plan) -> str | None:
    """Without an image cache pyxis pulls on each node and nobody reports a digest: ask
    the registry what the tag names now, just before the engines pull it."""
    ref = containers.registry_image(plan)
    if (ref is None or "@sha256:" in ref or not containers.of(plan.cluster).isolated
            or containers.cached_image(plan)):
        return None
    from launcher.control import image

    return image.registry_digest(containers.enroot_uri(ref), timeout=5.0)


def note_image(book: Book, log: Path) -> str | None:
    """The image step's one JSON line (imported, or found in the cache) as an event; the
    digest it names."""
    import json

    for line in reversed(tail(log, 20)):
        if line.startswith("{"):
            try:
                doc = json.loads(line)
            except ValueError:
                return None
            book.event("image", **doc)
            return doc.get("digest")
    return None


def identity(plan: Plan, facts: dict[str, dict | None],
             hosts: dict[str, dict | None] | None = None,
             image_digest: str | None = None) -> dict:
    """What exactly ran, for anyone comparing two runs: image, engine version as the
    engine's own environment reports it, model and revision, Slurm job and nodes, and the
    fingerprint taken where it ran: every package of the engine's environment (the first
    node's; nodes whose list differs are named), vLLM's commit, torch's CUDA, the nodes'
    driver, GPUs and IMEX channel."""
    found = [f for f in facts.values() if f]
    pkgs = next((f["packages"] for f in found if f.get("packages")), None)
    differ = sorted(n for n, f in facts.items() if f and f.get("packages") not in (None, pkgs))
    nvidia = [(h or {}).get("nvidia") for h in (hosts or {}).values()]
    nvidia = [x for x in nvidia if x]
    versions = sorted({f.get("engine_version") for f in found if f.get("engine_version")})
    commits = sorted({f.get("engine_commit") for f in found if f.get("engine_commit")})
    imex = {n: bool((h or {}).get("imex_channel")) for n, h in (hosts or {}).items() if h}
    revisions = sorted({(f.get("model") or {}).get("revision") for f in found} - {None})
    c = plan.recipe.container
    return {
        "image": c.image if c else None,
        "image_pinned": bool(c and "@sha256:" in c.image),
        # what the registry served for it when it was imported (None: not known)
        "image_digest": image_digest or (c.image.rsplit("@", 1)[1]
                                         if c and "@sha256:" in c.image else None),
        "engine": plan.recipe.engine,
        "engine_version": versions[0] if len(versions) == 1 else versions,
        "engine_commit": commits[0] if len(commits) == 1 else (commits or None),
        "model": plan.recipe.model.path,
        "model_revision": revisions[0] if len(revisions) == 1 else (revisions or None),
        "slurm_job_id": plan.job_id,
        "nodes": {n: plan.address(n) for n in plan.nodes},
        "launcher_python": plan.runtime.python,
        "launcher_source": plan.runtime.src,
        "packages": pkgs,
        "packages_differ_on": differ,
        "torch_cuda": next((f.get("torch_cuda") for f in found if f.get("torch_cuda")), None),
        "driver": sorted({d for x in nvidia for d in x.get("driver") or []}) or None,
        "gpu_models": sorted({m for x in nvidia for m in x.get("gpu_models") or []}) or None,
        # the NVLink fabric's IMEX channel (multi-node NVLink on GB200): every node, none,
        # or the nodes that have it
        "imex_channel": (all(imex.values()) if len(set(imex.values())) < 2
                         else sorted(n for n, v in imex.items() if v)) if imex else None,
    }
