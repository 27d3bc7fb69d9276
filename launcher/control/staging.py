"""Model staging: weights are fetched once into a shared Hugging Face cache, never by every
engine into its own container, and never by a compute node that cannot reach the hub.

    python -m launcher stage-model ORG/NAME --cluster PROFILE [--revision REV]

- A hub id (`org/name`) with the profile's `models.hf_home`: `submit` checks the snapshot is
  there; when it is not and compute nodes have no internet, it refuses with the command
  above; with internet, the job stages it in one step before any engine starts.
- A path: preflight checks it on every node inside the allocation.
- Stale hub lock files (a download killed mid-way) are removed before staging, so a job
  does not hang on a lock nobody holds.

Standard library only, plus `huggingface_hub` where a download really happens (vLLM's
images ship it; on a login node `pip install huggingface_hub`).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

STALE_LOCK_S = 3600


def repo_dir(hf_home: str, model: str) -> Path:
    return Path(hf_home) / "hub" / f"models--{model.replace('/', '--')}"


def staged(hf_home: str, model: str, revision: str | None = None) -> bool:
    """A complete snapshot (its config.json) of `model` is in the cache."""
    snaps = repo_dir(hf_home, model) / "snapshots"
    if revision:
        ref = repo_dir(hf_home, model) / "refs" / revision
        rev = ref.read_text().strip() if ref.is_file() else revision
        return (snaps / rev / "config.json").is_file()
    return snaps.is_dir() and any(snaps.glob("*/config.json"))


def clean_stale_locks(hf_home: str, model: str, older_than_s: float = STALE_LOCK_S) -> list[Path]:
    """Remove lock files a killed download left behind (nobody holds them any more)."""
    locks = Path(hf_home) / "hub" / ".locks" / f"models--{model.replace('/', '--')}"
    removed = []
    now = time.time()
    for f in locks.glob("*.lock") if locks.is_dir() else []:
        try:
            if now - f.stat().st_mtime > older_than_s:
                f.unlink()
                removed.append(f)
        except OSError:
            continue
    return removed


def stage(model: str, hf_home: str, revision: str | None = None) -> Path:
    """Download `model` into `hf_home` (once: a staged snapshot is reused)."""
    if staged(hf_home, model, revision):
        return repo_dir(hf_home, model)
    for f in clean_stale_locks(hf_home, model):
        print(f"removed a stale lock {f}", flush=True)
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise SystemExit(
            "error: staging needs huggingface_hub here: pip install huggingface_hub "
            "(or run this inside the vLLM image, which ships it)"
        ) from None
    path = snapshot_download(repo_id=model, revision=revision, cache_dir=str(Path(hf_home) / "hub"))
    return Path(path)


def check(recipe, cluster) -> tuple[str | None, str | None]:
    """(a reason to refuse the submission, a note for the plan text) about the model."""
    m, path = cluster.models, recipe.model.path
    rev = recipe.model.revision
    hint = f"python -m launcher stage-model {path}" + (f" --revision {rev}" if rev else "")
    at = f" at revision {rev}" if rev else ""
    if not recipe.engine_kind.loads_weights:
        return None, None
    if not recipe.model.hub_id:
        return None, f"model folder {path}: checked on every node by preflight"
    if not m.hf_home:
        if m.internet:
            return None, (f"model {path} is a hub id and {cluster.name} has no models.hf_home: "
                          f"every engine downloads it into its own cache")
        return (f"model {path} is a hub id, {cluster.name}'s compute nodes have no internet "
                f"and the profile names no shared cache: set models.hf_home and run "
                f"{hint} --cluster {cluster.name}, or set "
                f"model.path to a folder on the shared filesystem"), None
    if staged(m.hf_home, path, rev):
        return None, f"model {path}{at}: staged in {m.hf_home}"
    if not Path(m.hf_home).is_dir() or m.internet:
        how = "staged by the job before any engine starts" if m.internet else "not visible here"
        return None, f"model {path}: {how} ({m.hf_home})"
    return (f"model {path}{at} is not staged in {m.hf_home} and {cluster.name}'s compute "
            f"nodes have no internet: run {hint} --cluster {cluster.name} first"), None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m launcher.control.staging")
    ap.add_argument("model")
    ap.add_argument("--hf-home", required=True)
    ap.add_argument("--revision", default=None)
    a = ap.parse_args(argv)
    t = time.monotonic()
    path = stage(a.model, a.hf_home, a.revision)
    print(f"{a.model} staged in {path} ({time.monotonic() - t:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
