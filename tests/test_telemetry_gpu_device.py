"""The NVML collector on a real GPU (the H200 through the device tool); skipped without one.
Where NVML is absent, the collector must say so in one notice and keep quiet otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import nvml_gpu_count

from launcher.telemetry.gpu import GpuCollector
from launcher.telemetry.store import read_agent_info, read_samples

REPO = Path(__file__).resolve().parents[1]


HAVE_GPU = nvml_gpu_count() > 0
gpu = pytest.mark.skipif(not HAVE_GPU, reason="needs an NVIDIA GPU with NVML")


@pytest.mark.skipif(HAVE_GPU, reason="this machine has NVML")
def test_no_nvml_is_one_clear_notice() -> None:
    c = GpuCollector("n1")
    info = c.open()
    assert info["available"] is False
    assert len(info["notices"]) == 1 and info["notices"][0].startswith("no NVML: ")
    assert c.sample(slow=True) == []
    c.close()


def by_name(rows: list[tuple]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for r in rows:
        out.setdefault(r[4], []).append(r[6])
    return out


@pytest.mark.gpu
@gpu
def test_collector_reports_real_values() -> None:
    c = GpuCollector("n1", {0: "decode-0@n1"})
    info = c.open()
    try:
        assert info["available"] and info["gpus"]
        g0 = info["gpus"][0]
        assert g0["uuid"].startswith("GPU-") and g0["name"]
        assert g0["process"] == "decode-0@n1"
        for must in ("util", "memory", "power_w", "sm_clock_mhz", "temp_c"):
            assert must in g0["supported"], (must, g0["unsupported"])
        # everything not collected is recorded with a reason
        assert all(isinstance(v, str) and v for v in g0["unsupported"].values())
        first = c.sample(slow=True)
        time.sleep(1.0)
        rows = c.sample(slow=True)
        v = by_name(rows)
        n = len(c.gpus)
        assert len(v["gpu:util_pct"]) == n and all(0 <= x <= 100 for x in v["gpu:util_pct"])
        assert all(x > 1e9 for x in v["gpu:mem_total_bytes"])
        assert all(0 <= u <= t for u, t in zip(v["gpu:mem_used_bytes"],
                                               v["gpu:mem_total_bytes"], strict=True))
        assert all(10 < x < 1500 for x in v["gpu:power_w"])
        assert all(0 < x < 110 for x in v["gpu:temp_c"])
        assert all(x > 0 for x in v["gpu:mem_clock_mhz"])
        assert len(v["gpu:clock_event_active"]) == 9 * n
        if "energy_mj" in g0["supported"]:
            e0 = by_name(first)["gpu:energy_mj"]
            assert all(b >= a for a, b in zip(e0, v["gpu:energy_mj"], strict=True))
        if "gpm" in g0["supported"]:
            assert "gpu:gpm_sm_util_pct" in v
        assert rows[0][2] == "decode-0@n1" and json.loads(rows[0][5])["uuid"] == g0["uuid"]
        print(json.dumps({"info": info, "sample_errors": c.sample_errors,
                          "values": {k: x[:1] for k, x in v.items()}}, default=str))
    finally:
        c.close()


@pytest.mark.gpu
@gpu
def test_agent_writes_gpu_samples(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    p = subprocess.run(
        [sys.executable, "-m", "launcher.telemetry.agent", "--run-dir", str(run), "--node",
         "n1", "--interval", "0.5", "--duration", "3"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
        timeout=120, check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    df = read_samples(run, name_prefix="gpu:")
    assert {"gpu:util_pct", "gpu:power_w", "gpu:mem_used_bytes"} <= set(df.name)
    info = read_agent_info(run)["n1"]
    assert info["gpu"]["available"] is True
