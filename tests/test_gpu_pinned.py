"""GPU telemetry per endpoint on a real multi-GPU node (one GB200 tray has 4 GPUs).

Two processes, each pinned to half of the node's GPUs through CUDA_VISIBLE_DEVICES, run a
small GPU load while the node's agent samples; every GPU must be reported once (by UUID)
and attributed to the process the plan pinned to it. Needs NVML and PyTorch with CUDA:
skipped elsewhere (CI has no GPU). `test_one_gpu_pinned` is the same check for one GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import nvml_gpu_count

from launcher.run.plandoc import NodeDoc, PlanDoc, Process, read_plan
from launcher.run.vocab import Kind, Role
from launcher.telemetry.store import read_agent_info, read_samples

LOAD = (
    "import sys, time, torch\n"
    "xs = [torch.randn(4096, 4096, device=f'cuda:{i}') for i in range(torch.cuda.device_count())]\n"
    "end = time.time() + float(sys.argv[1])\n"
    "while time.time() < end:\n"
    "    for x in xs: x @ x\n"
    "    torch.cuda.synchronize()\n"
)


def has_torch_cuda() -> bool:
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def write_plan(run: Path, node: str, groups: list[list[int]]) -> list[str]:
    """plan.json (the current schema, written by PlanDoc itself) for one agg process per GPU
    group on `node`: the agent attributes each GPU to the process the plan pins it to."""
    names = [f"agg-{i}@{node}" for i in range(len(groups))]
    doc = PlanDoc(
        run_id=run.name, recipe="gpu-pinned", cluster="local", engine="vllm", mode="agg",
        model_path="none", served_name="none", telemetry_interval_s=1.0,
        nodes=[NodeDoc(node, "127.0.0.1", sum(map(len, groups)))], endpoints=[],
        processes=[Process(name=n, kind=Kind.ENGINE, node=node, argv=[], env={},
                           log=f"logs/{n}.log", endpoint=n.split("@")[0], role=Role.AGG, gpus=g)
                   for n, g in zip(names, groups, strict=True)],
        router_url="", router_metrics_url="", gpu_count={"agg": sum(map(len, groups))},
    )  # fmt: skip
    (run / "plan.json").write_text(json.dumps(doc.to_json()))
    read_plan(run)  # the agent reads it the same way
    return names


def run_pinned(tmp_path: Path, groups: list[list[int]], seconds: float) -> None:
    run, node = tmp_path / "run", "tray-0"
    (run / "logs").mkdir(parents=True)
    names = write_plan(run, node, groups)
    agent = subprocess.Popen(
        [sys.executable, "-m", "launcher.telemetry.agent", "--run-dir", str(run),
         "--node", node, "--interval", "1"],
        stdout=open(run / "logs" / "agent.log", "w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    loads = []
    for name, gpus in zip(names, groups, strict=True):
        env = dict(os.environ, PD_PROCESS=name, PD_RUN_DIR=str(run), CUDA_DEVICE_ORDER="PCI_BUS_ID")
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        loads.append(subprocess.Popen([sys.executable, "-c", LOAD, str(seconds)], env=env))
    for p in loads:
        assert p.wait(timeout=seconds + 120) == 0
    agent.terminate()
    assert agent.wait(timeout=60) == 0

    info = read_agent_info(run)[node]
    print(json.dumps(info, indent=1, default=str)[:4000])
    df = read_samples(run, name_prefix="gpu:")
    util = df[df["name"] == "gpu:util_pct"]
    labels = util["labels"].map(json.loads)
    by_uuid = {}
    for (_, row), lab in zip(util.iterrows(), labels, strict=True):
        by_uuid.setdefault(lab["uuid"], set()).add((int(lab["index"]), row["process"]))
    owner = {g: name for name, gs in zip(names, groups, strict=True) for g in gs}
    # every GPU of the node is sampled; those the plan pins to nobody belong to nobody
    assert len(by_uuid) == N, f"expected the node's {N} GPUs by UUID, got {sorted(by_uuid)}"
    for uuid, seen in by_uuid.items():
        assert len(seen) == 1, f"{uuid} reported under several indices/processes: {seen}"
        ((index, process),) = seen
        assert process == owner.get(index, ""), f"GPU {index} ({uuid}) attributed to {process}"
        if index not in owner:
            continue
        busy = util[(labels.map(lambda x: x["uuid"]) == uuid)]["value"].max()
        assert busy > 10, f"GPU {index} never looked busy ({busy}%)"
    links = df[df["name"] == "gpu:nvlink_link_count"]["value"]
    if len(links) and links.max() > 0:
        assert (df["name"] == "gpu:nvlink_tx_bytes").any(), "NVLink present but not collected"
    procs = read_samples(run, name_prefix="proc:")
    assert set(names) <= set(procs["process"]), "host telemetry missed a pinned process"


N = nvml_gpu_count()
needs = pytest.mark.skipif(N == 0 or not has_torch_cuda(), reason="needs NVML and torch+CUDA")


@pytest.mark.gpu
@needs
@pytest.mark.skipif(N < 4, reason="needs a 4-GPU node (one GB200 tray)")
def test_four_gpu_tray_two_endpoints_of_two(tmp_path):
    run_pinned(tmp_path, [[0, 1], [2, 3]], seconds=60)


@pytest.mark.gpu
@needs
@pytest.mark.skipif(N < 2, reason="needs 2 GPUs")
def test_two_endpoints_each_pinned_to_its_gpu(tmp_path):
    run_pinned(tmp_path, [[0], [1]], seconds=20)


@pytest.mark.gpu
@needs
def test_one_gpu_pinned(tmp_path):
    run_pinned(tmp_path, [[0]], seconds=15)
