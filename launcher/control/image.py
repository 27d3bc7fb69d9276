"""Import a registry image once into the profile's shared image cache, as a .sqsh.

    python3 -m launcher.control.image REGISTRY#REPO[:TAG][@DIGEST] --to CACHE/NAME.sqsh

Runs on one node of the job (the cache is on the shared filesystem), before any container
step: with the file there, pyxis only unpacks it on each node (`enroot create`) instead of
every node pulling the image from the registry. Standard library only. Jobs that start
together wait for one import (a lock beside the file); a file is only ever complete (made
under a temporary name, then renamed). Prints one JSON line: imported (false: it was there),
seconds, bytes, and the digest the registry served for it (kept beside the file; None when
the registry could not be asked). enroot's own output goes to this step's log, where the
preflight reads its errors (docs/containers.md lists them).
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


MANIFEST_TYPES = ", ".join((  # an index first: its digest is what `docker pull` pins
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json"))


def registry_digest(uri: str, timeout: float = 10.0) -> str | None:
    """The digest the registry serves now for an enroot reference REGISTRY#REPO[:TAG]
    (Docker Hub when there is no REGISTRY#): its Docker-Content-Digest, asked anonymously
    (a bearer token when the registry asks for one, as for public images). None when it
    cannot be told: the run then records no digest, and says so."""
    import re
    import urllib.error
    import urllib.parse
    import urllib.request

    if "@sha256:" in uri:
        return uri.rsplit("@", 1)[1]
    registry, _, ref = uri.rpartition("#")
    if not registry:
        registry = "registry-1.docker.io"
        ref = ref if "/" in ref else f"library/{ref}"
    repo, _, tag = ref.partition(":")
    tag = tag or "latest"

    def head(url: str, token: str | None = None):
        req = urllib.request.Request(url, method="HEAD", headers={"Accept": MANIFEST_TYPES})
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        return urllib.request.urlopen(req, timeout=timeout)

    for scheme in ("https", "http"):
        url = f"{scheme}://{registry}/v2/{repo}/manifests/{tag}"
        try:
            try:
                with head(url) as r:
                    return r.headers.get("Docker-Content-Digest")
            except urllib.error.HTTPError as e:
                challenge = e.headers.get("WWW-Authenticate") or ""
                if e.code != 401 or not challenge.lower().startswith("bearer "):
                    return None
                params = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
                realm = params.pop("realm", None)
                if not realm:
                    return None
                with urllib.request.urlopen(
                        f"{realm}?{urllib.parse.urlencode(params)}", timeout=timeout) as t:
                    doc = json.loads(t.read() or b"{}")
                token = doc.get("token") or doc.get("access_token")
                with head(url, token) as r:
                    return r.headers.get("Docker-Content-Digest")
        except (urllib.error.URLError, OSError, ValueError):
            continue  # https refused (a plain-HTTP registry, as enroot's ENROOT_ALLOW_HTTP)
    return None


def digest_file(dest: Path) -> Path:
    """Beside a cached .sqsh: the digest its bytes were imported from."""
    return dest.with_name(dest.name + ".digest")


def import_once(uri: str, dest: Path) -> dict:
    t0 = time.monotonic()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(dest.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another job importing the same image: wait
        if dest.is_file():
            try:  # the digest of these bytes, not of what the tag names now
                digest = digest_file(dest).read_text().strip() or None
            except OSError:
                digest = None
            return {"imported": False, "path": str(dest), "bytes": dest.stat().st_size,
                    "seconds": round(time.monotonic() - t0, 2), "digest": digest}
        exe = enroot()
        if exe is None:
            raise SystemExit(f"enroot: command not found (looked on PATH and in {ENROOT_DIRS})")
        part = dest.with_name(f".{dest.stem}.{os.getpid()}.sqsh")
        part.unlink(missing_ok=True)
        print(f"importing docker://{uri} into {dest}", flush=True)
        # asked before the import: a tag moved during it would give newer bytes than this
        # says, never older ones silently named by an older digest
        digest = registry_digest(uri)
        try:
            rc = subprocess.run([exe, "import", "--output", str(part), f"docker://{uri}"],
                                stdin=subprocess.DEVNULL).returncode
            if rc != 0 or not part.is_file():
                raise SystemExit(f"enroot import of {uri} failed (exit status {rc})")
            if digest:
                digest_file(dest).write_text(digest + "\n")
            else:
                digest_file(dest).unlink(missing_ok=True)
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
    return {"imported": True, "path": str(dest), "bytes": dest.stat().st_size,
            "seconds": round(time.monotonic() - t0, 2), "digest": digest}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m launcher.control.image")
    ap.add_argument("uri", help="the image as enroot takes it: REGISTRY#REPO[:TAG][@DIGEST]")
    ap.add_argument("--to", required=True, type=Path, help="the .sqsh in the image cache")
    a = ap.parse_args(argv)
    print(json.dumps(import_once(a.uri, a.to)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
