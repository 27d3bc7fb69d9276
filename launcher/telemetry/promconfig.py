"""The arguments of `python -m launcher prometheus-config` (and of `python -m
launcher.telemetry.promsd`): here, apart from promsd, so the CLI builds its parser without
importing it."""

from __future__ import annotations

import argparse
from pathlib import Path

JOB_NAME = "pd-launcher"


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The command's arguments (shared by `python -m launcher prometheus-config`)."""
    ap.add_argument("path", nargs="?", type=Path, default=None,
                    help="a runs directory (default ./runs), one run directory, or a "
                    "directory of target files (a profile's prometheus_sd_dir)")
    ap.add_argument("--cluster", metavar="PROFILE",
                    help="instead of PATH: the prometheus_sd_dir of this cluster profile "
                    "(a name or a YAML path), where all its jobs list their targets")
    ap.add_argument("--sd-dir", action="store_true", help="PATH is a directory of target files")
    ap.add_argument("--job-name", default=JOB_NAME,
                    help="the scrape job's name (default: %(default)s)")
    ap.add_argument("--scrape-interval", default="5s",
                    help="how often Prometheus scrapes each target (default: %(default)s)")
    ap.add_argument("--refresh-interval", default="10s",
                    help="how often Prometheus re-reads the files (what inotify misses on NFS)")
    ap.add_argument("--prune", action="store_true",
                    help="instead: remove target files of runs that ended without teardown")
