"""The compute nodes' environment made on the login node (launcher.control.compute_env):
what a GB200 site's jobs import from, checked here without the dev cluster (the jobs that
run from it: tests/test_gb200_path.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def test_the_wheelhouse_for_aarch64_trays_is_fetched_here(tmp_path):
    """A GB200 profile's environment from an x86_64 login node: aarch64 wheels of every
    compute package, vllm-router's binary wheel included."""
    if os.uname().machine == "aarch64":
        pytest.skip("this machine is aarch64: the cross-arch fetch is what is tested")
    from launcher.control import compute_env
    from launcher.schema import cluster

    c = cluster.load("gb200-nvl72")
    c = c.model_copy(update={"compute_env": c.compute_env.model_copy(update={"dir": str(tmp_path)})})
    rt = compute_env.prepare(c, tmp_path, quiet=True)
    wheels = [p.name for p in (Path(rt.env) / "wheels").glob("*.whl")]
    for name in ("vllm_router", "pyarrow", "psutil", "pydantic_core", "aiohttp"):
        (w,) = [x for x in wheels if x.lower().startswith(name)]
        assert "aarch64" in w and ("cp312" in w or "abi3" in w), w
    assert compute_env.check_ready(rt) is None
    script = (Path(rt.env) / "bootstrap.sh").read_text()
    assert "--no-index" in script and "flock" in script and "aarch64" in script


def test_the_launchers_copy_for_the_compute_nodes_is_byte_compiled_under_its_own_path(tmp_path):
    """Every module of the copied source has its bytecode beside it, for this Python, naming
    the copy's final path (not the temporary one it was written under): a job's processes
    import without compiling even where they may not write there."""
    import importlib.util
    import marshal

    from launcher.control import compute_env

    dest = tmp_path / "src-x"
    compute_env._copy_source(dest)
    sources = sorted((dest / "launcher").rglob("*.py"))
    assert len(sources) > 50
    for src in sources:
        pyc = Path(importlib.util.cache_from_source(str(src)))
        assert pyc.is_file(), src
        code = marshal.loads(pyc.read_bytes()[16:])
        assert code.co_filename == str(src), (code.co_filename, src)
    assert not list(tmp_path.glob(".src-x.*"))
