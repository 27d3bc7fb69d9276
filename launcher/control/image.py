"""Import a registry image once into the profile's shared image cache, as a .sqsh.

    python3 -m launcher.control.image REGISTRY#REPO[:TAG][@DIGEST] --to CACHE/NAME.sqsh

Runs on one node of the job (the cache is on the shared filesystem), before any container
step: with the file there, pyxis only unpacks it on each node (`enroot create`) instead of
every node pulling the image from the registry. Standard library only. Jobs that start
together wait for one import (a lock beside the file); a file is only ever complete (made
under a temporary name, then renamed). Prints one JSON line: imported (false: it was there),
seconds, bytes. enroot's own output goes to this step's log, where the preflight reads its
errors (docs/containers.md lists them).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

# pyxis runs enroot with slurmstepd's PATH, not the job's: look where sites install it too
ENROOT_DIRS = "/usr/local/bin:/usr/bin:/bin"


def enroot() -> str | None:
    """enroot's path on this node (the job's PATH, then the usual places), or None."""
    return shutil.which("enroot") or shutil.which("enroot", path=ENROOT_DIRS)


def import_once(uri: str, dest: Path) -> dict:
    t0 = time.monotonic()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(dest.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another job importing the same image: wait
        if dest.is_file():
            return {"imported": False, "path": str(dest), "bytes": dest.stat().st_size,
                    "seconds": round(time.monotonic() - t0, 2)}
        exe = enroot()
        if exe is None:
            raise SystemExit(f"enroot: command not found (looked on PATH and in {ENROOT_DIRS})")
        part = dest.with_name(f".{dest.stem}.{os.getpid()}.sqsh")
        part.unlink(missing_ok=True)
        print(f"importing docker://{uri} into {dest}", flush=True)
        try:
            rc = subprocess.run([exe, "import", "--output", str(part), f"docker://{uri}"],
                                stdin=subprocess.DEVNULL).returncode
            if rc != 0 or not part.is_file():
                raise SystemExit(f"enroot import of {uri} failed (exit status {rc})")
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
    return {"imported": True, "path": str(dest), "bytes": dest.stat().st_size,
            "seconds": round(time.monotonic() - t0, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m launcher.control.image")
    ap.add_argument("uri", help="the image as enroot takes it: REGISTRY#REPO[:TAG][@DIGEST]")
    ap.add_argument("--to", required=True, type=Path, help="the .sqsh in the image cache")
    a = ap.parse_args(argv)
    print(json.dumps(import_once(a.uri, a.to)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
