"""Prometheus file-based service discovery for running jobs, and the scrape config that uses it.

While a job runs, every scrapeable process that is healthy (each vLLM API server's /metrics,
the router's metrics port, each node's telemetry exporter) is listed as a file-SD target group
with labels naming the run, recipe, cluster, engine kind, process kind, node, role and
endpoint. The list is written twice, each file replaced whole (write-then-rename), as processes
become healthy, and both files are removed at teardown:

    <run>/prometheus/<run-id>.json      the run directory's own copy
    <shared>/<run-id>.json              what a site's Prometheus reads: the cluster profile's
                                        `prometheus_sd_dir` (shared by all jobs; the file name
                                        then carries a hash of the run path too), else
                                        `<runs-dir>/prometheus/`

Prometheus accepts a `*` only in the last path segment of a file-SD pattern, so one pattern
(`<runs-dir>/prometheus/*.json`, or `<prometheus_sd_dir>/*.json`) must cover every job: that is
why the shared copy exists.

    python -m launcher.telemetry.promsd RUNS_DIR            # print the scrape-config snippet
    python -m launcher.telemetry.promsd --cluster PROFILE   # ... for the profile's shared dir
    python -m launcher.telemetry.promsd --prune RUNS_DIR    # drop targets of runs that ended
                                                            # without their teardown (kill -9)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from launcher.run.plandoc import PlanDoc, Process
from launcher.run.rundir import STUDY, RunDir, read_json, write_json
from launcher.run.vocab import Kind
from launcher.telemetry.promconfig import JOB_NAME, add_arguments

SD_DIRNAME = "prometheus"  # in a run directory and in a runs directory
# Labels only Prometheus's relabeling sees (dropped before storage): the run directory, so
# `prune` can tell whose targets a file in a shared directory lists.
RUN_DIR_LABEL = "__pd_run_dir"
# Every target label, in the order docs/prometheus.md lists them.
TARGET_LABELS = ("run_id", "recipe", "cluster", "engine_kind", "kind", "node", "role",
                 "endpoint")


# --- where the files go ---------------------------------------------------------------------


def runs_root(run: RunDir) -> Path:
    """The runs directory a run belongs to (a study's runs sit one level further down)."""
    parent = run.path.parent
    if (parent / STUDY).is_file() or run.read_submission().study:
        return parent.parent
    return parent


def shared_dir(run: RunDir, sd_dir: str | None) -> Path:
    return Path(sd_dir) if sd_dir else runs_root(run) / SD_DIRNAME


def run_file(run: RunDir) -> Path:
    return run.path / SD_DIRNAME / f"{run.run_id}.json"


def shared_file(run: RunDir, sd_dir: str | None) -> Path:
    """`<run-id>.json` under the runs directory (run ids are unique there); in a profile's
    directory, shared by every user and runs directory, a hash of the run path is added."""
    if not sd_dir:
        return shared_dir(run, None) / f"{run.run_id}.json"
    digest = hashlib.sha1(str(run.path.resolve()).encode()).hexdigest()[:10]  # noqa: S324
    return Path(sd_dir) / f"{run.run_id}.{digest}.json"


# --- what they hold -------------------------------------------------------------------------


def target_labels(plan: PlanDoc, p: Process) -> dict[str, str]:
    """The labels every series scraped from `p` carries (empty ones left out)."""
    labels = {
        "run_id": plan.run_id,
        "recipe": plan.recipe,
        "cluster": plan.cluster,
        "engine_kind": plan.engine,  # sim | vllm: a simulated run is labelled as one
        "kind": str(p.kind),  # engine | router | agent | store
        "node": p.node,
        "role": str(p.role) if p.role else "",
        "endpoint": p.endpoint or "",
    }
    return {k: v for k, v in labels.items() if v}


def _group(plan: PlanDoc, p: Process, run_dir: str) -> dict | None:
    if not p.metrics_url or p.kind not in (Kind.ENGINE, Kind.ROUTER, Kind.AGENT, Kind.STORE):
        return None
    u = urlsplit(p.metrics_url)
    if not u.netloc:
        return None
    labels = target_labels(plan, p)
    if u.path and u.path != "/metrics":
        labels["__metrics_path__"] = u.path
    if u.scheme and u.scheme != "http":
        labels["__scheme__"] = u.scheme
    labels[RUN_DIR_LABEL] = run_dir
    return {"targets": [u.netloc], "labels": labels}


def target_groups(plan: PlanDoc, healthy: Iterable[str], run_dir: str = "") -> list[dict]:
    """One file-SD target group per healthy process that serves /metrics, in plan order."""
    names = set(healthy)
    groups = [_group(plan, p, run_dir) for p in plan.processes if p.name in names]
    return [g for g in groups if g]


def publish(run: RunDir, plan: PlanDoc, healthy: Iterable[str], sd_dir: str | None) -> Path:
    """Write the healthy processes' targets (run directory copy first, then the shared one
    Prometheus reads, which is returned). OSError is the caller's to report."""
    groups = target_groups(plan, healthy, str(run.path.resolve()))
    write_json(run_file(run), groups)
    path = shared_file(run, sd_dir)
    write_json(path, groups)
    return path


def withdraw(run: RunDir, sd_dir: str | None) -> None:
    """Remove both copies: Prometheus drops the targets at its next file-SD update."""
    errors = []
    for path in (shared_file(run, sd_dir), run_file(run)):
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            errors.append(e)
    if errors:
        raise errors[0]


def prune(sd_dir: Path) -> list[Path]:
    """Remove target files whose run directory is gone or whose run has ended (an orchestrator
    killed before its teardown leaves its targets behind); returns what was removed."""
    removed = []
    for path in sorted(Path(sd_dir).glob("*.json")):
        groups = read_json(path)
        if not isinstance(groups, list):
            continue
        dirs = {g.get("labels", {}).get(RUN_DIR_LABEL) for g in groups if isinstance(g, dict)}
        dirs.discard(None)
        if not dirs:
            continue
        if all(not RunDir(Path(d)).exists() or RunDir(Path(d)).status().final for d in dirs):
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                continue
    return removed


# --- the scrape config ------------------------------------------------------------------------


def sd_dir_of(path: Path, *, is_sd_dir: bool = False) -> Path:
    """The directory of target files for `path`: a run directory -> its prometheus/; a runs
    directory (or one that does not exist yet) -> its prometheus/; a directory that already
    holds target files and no runs (a profile's prometheus_sd_dir) -> itself."""
    path = Path(path).absolute()
    if is_sd_dir or path.name == SD_DIRNAME:
        return path
    if RunDir(path).exists() or (path / SD_DIRNAME).is_dir() or not path.is_dir():
        return path / SD_DIRNAME
    if any(path.glob("*.json")) and not any(RunDir(p).exists() for p in path.iterdir()
                                             if p.is_dir()):
        return path
    return path / SD_DIRNAME


def _yaml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid YAML double-quoted scalar


def scrape_config(runs_dir_or_sd_dir: str | Path, *, job_name: str = JOB_NAME,
                  scrape_interval: str = "5s", scrape_timeout: str | None = None,
                  refresh_interval: str = "10s", is_sd_dir: bool = False) -> str:
    """A complete `scrape_configs:` document with one job that scrapes every target the
    launcher lists under `runs_dir_or_sd_dir` (promtool check config accepts it as is; merge
    its `- job_name` entry into a site's own scrape_configs)."""
    pattern = sd_dir_of(Path(runs_dir_or_sd_dir), is_sd_dir=is_sd_dir) / "*.json"
    timeout = scrape_timeout or scrape_interval
    return "\n".join([
        f"# pd-launcher jobs under {runs_dir_or_sd_dir}: every vLLM API server, the router and",
        "# each node's telemetry exporter, found through the files running jobs write",
        "# (labels: " + ", ".join(TARGET_LABELS) + ").",
        "# refresh_interval: file changes made on other hosts (NFS, Lustre) raise no inotify",
        "# event here, so the directory is also re-read this often.",
        "scrape_configs:",
        f"  - job_name: {_yaml_str(job_name)}",
        f"    scrape_interval: {scrape_interval}",
        f"    scrape_timeout: {timeout}",
        "    file_sd_configs:",
        "      - files:",
        f"          - {_yaml_str(str(pattern))}",
        f"        refresh_interval: {refresh_interval}",
        "",
    ])


def run(a: argparse.Namespace) -> int:
    """The command; a problem is one line on stderr and exit status 2."""
    path, is_sd = a.path, a.sd_dir
    if a.cluster:
        from launcher.errors import UserError
        from launcher.schema import cluster as cluster_mod

        if path is not None:
            return _refuse(f"give a runs directory ({path}) or --cluster {a.cluster}, not both")
        try:
            profile = cluster_mod.load(a.cluster)
        except UserError as e:
            return _refuse(str(e))
        if not profile.prometheus_sd_dir:
            return _refuse(
                f"cluster profile {profile.name!r} sets no prometheus_sd_dir, so its jobs list "
                "their targets under their runs directory: give that directory instead "
                "(python -m launcher prometheus-config RUNS_DIR), or set prometheus_sd_dir"
            )
        path, is_sd = Path(profile.prometheus_sd_dir), True
    else:
        # a mistyped directory would give a config that silently finds nothing
        shown = path if path is not None else "./runs"
        path = Path("runs") if path is None else path
        if not path.exists():
            return _refuse(f"runs directory {shown} does not exist: give the directory your "
                           "jobs were submitted with (submit --runs-dir), or --cluster PROFILE")
        if not path.is_dir():
            return _refuse(f"{shown} is not a directory: give a runs directory")
    if a.prune:
        for p in prune(sd_dir_of(path, is_sd_dir=is_sd)):
            print(f"removed {p}")
        return 0
    sys.stdout.write(scrape_config(path, job_name=a.job_name, scrape_interval=a.scrape_interval,
                                   refresh_interval=a.refresh_interval, is_sd_dir=is_sd))
    return 0


def _refuse(why: str) -> int:
    print(f"error: {' '.join(why.split())}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m launcher prometheus-config",
        description="print a Prometheus scrape config that finds every job's /metrics "
        "through the file-SD targets running jobs write",
    )
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
