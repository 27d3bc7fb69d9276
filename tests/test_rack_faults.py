"""Issue 52: runs that would load for 30 minutes on a GB200 rack and then fail, each reproduced
with a model, cache, image or profile of the same shape, and found before any engine loads."""

from __future__ import annotations

from pathlib import Path

from helpers import profile_copy

from launcher.control import nodecheck, pd_check, preflight, prepare, staging
from launcher.planning import ucx
from launcher.schema import recipe

DSV4 = "deepseek-v4-pro-gb200-8k1k-low-latency"
KIMI = "kimi-k2.5-gb200-8k1k-1p4d-dep4-tp8"
SHA = "0366e4e064385807ea86b088a5c6c878ff23343b"


def planned(tmp_path: Path, name: str, *sets: str):
    r = recipe.load(name, list(sets))
    plan, _ = prepare.plan_run(r, tmp_path / "runs", None)
    return plan


def engine_argvs(plan) -> list[list[str]]:
    from launcher.planning import render

    return [p.argv for p in render.processes(plan) if p.kind.value == "engine"]


# --- 3. a pinned model.revision on an offline site ---------------------------------------------


def offline_cache(root: Path, model: str, rev: str, main: str | None = None) -> Path:
    """An HF cache as `stage-model --revision` leaves it: the commit's snapshot, no refs/main
    unless `main` names another commit (whose snapshot is not there)."""
    repo = root / "hub" / f"models--{model.replace('/', '--')}"
    (repo / "snapshots" / rev).mkdir(parents=True)
    (repo / "snapshots" / rev / "config.json").write_text('{"model_type": "x"}')
    if main:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(main)
    return root


def test_a_pinned_revision_reaches_vllm_serve_and_the_staging_hint(tmp_path):
    hf = offline_cache(tmp_path / "hf", "deepseek-ai/DeepSeek-V4-Pro", SHA)
    prof = profile_copy(tmp_path / "p.yaml", "gb200-nvl72",
                        models={"hf_home": str(hf), "internet": False})
    plan = planned(tmp_path, DSV4, f"cluster={prof}", f"model.revision={SHA}")
    for argv in engine_argvs(plan):
        i = argv.index("serve")
        assert argv[i + 1] == "deepseek-ai/DeepSeek-V4-Pro"
        assert argv[argv.index("--revision") + 1] == SHA, argv
        assert argv[argv.index("--tokenizer-revision") + 1] == SHA, argv
    assert staging.check(plan.recipe, plan.cluster) == (
        None, f"model deepseek-ai/DeepSeek-V4-Pro at revision {SHA}: staged in {hf}")
    other = "a1" * 20
    plan = planned(tmp_path, DSV4, f"cluster={prof}", f"model.revision={other}")
    refuse, _ = staging.check(plan.recipe, plan.cluster)
    assert refuse == (f"model deepseek-ai/DeepSeek-V4-Pro at revision {other} is not staged in "
                      f"{hf} and gb200-nvl72's compute nodes have no internet: run python -m "
                      f"launcher stage-model deepseek-ai/DeepSeek-V4-Pro --revision {other} "
                      "--cluster gb200-nvl72 first")


def test_preflight_resolves_the_pinned_revision_offline_as_the_engine_will(tmp_path, monkeypatch):
    """The container check reads the engines' --revision and resolves it in the cache the
    way the hub library does offline (a ref's file, else the commit's snapshot); a cache
    staged at another commit (refs/main names one whose snapshot is gone) is named with the
    stage-model line that fixes it."""
    model = "deepseek-ai/DeepSeek-V4-Pro"
    hf = offline_cache(tmp_path / "hf", model, SHA, main="c2" * 20)
    monkeypatch.setenv("HF_HOME", str(hf))
    doc = {"engine": "vllm", "model": {"path": model}, "processes": [
        {"kind": "engine", "name": "prefill-0@n1", "node": "n1",
         "argv": ["vllm", "serve", model, "--revision", SHA]}]}
    got = nodecheck.model_check(doc)
    assert got["ok"] is True and got["revision"] == SHA and got["pinned"] == SHA
    doc["processes"][0]["argv"][-1] = "b3" * 20
    got = nodecheck.model_check(doc)
    assert got["ok"] is False and got["pinned"] == "b3" * 20
    # the engine without --revision would ask for main, whose snapshot is not here either
    doc["processes"][0]["argv"] = ["vllm", "serve", model]
    assert nodecheck.model_check(doc)["revision"] == "c2" * 20
    plan = planned(tmp_path, DSV4, f"model.revision={'b3' * 20}")
    from launcher.planning import render

    rendered = render.render(plan, "r", placeholder_nodes=True, with_sbatch=False)
    node = next(p.node for p in rendered.doc.processes if p.kind.value == "engine")
    facts = {n: {"engine_version": "0.20.0", "root": [1, 2]} for n in plan.nodes}
    facts[node]["model"] = {"path": model, "ok": False, "pinned": "b3" * 20, "how": "x"}
    problems = preflight.judge_container(plan, rendered.doc, facts, None)
    assert any(f"python -m launcher stage-model {model} --revision {'b3' * 20}" in p
               and "model.revision" in p for p in problems), problems


# --- 4. network.interface becomes UCX_NET_DEVICES ------------------------------------------------


def test_an_interface_name_as_ucx_device_is_said_at_dry_run_and_named_by_the_pd_refusal(tmp_path):
    """A profile naming ib0 (an IPoIB netdev) leaves NIXL's UCX only TCP between trays: the
    dry-run says so as a blocker where TCP is refused, and the P->D check's refusal names
    network.interface as the cause. RDMA devices in env.UCX_NET_DEVICES are kept."""
    prof = profile_copy(tmp_path / "ib0.yaml", "gb200-nvl72",
                        network={"interface": "ib0"})
    qwen = "qwen3.5-397b-gb200-disagg"
    plan = planned(tmp_path, qwen, f"cluster={prof}")
    warnings, blockers = ucx.ucx_lines(plan)
    assert not warnings
    (b,) = blockers
    assert b.startswith("network.interface ib0 is exported as UCX_NET_DEVICES=ib0, a network "
                        "interface, not an RDMA device"), b
    assert "UCX gets only TCP between nodes" in b and "env to the RDMA devices" in b
    error, _ = pd_check.tcp_verdict(plan, {"decode-0@n1": ["tcp/ib0"]})
    assert error and "the cause: network.interface ib0 is exported as UCX_NET_DEVICES=ib0" in error
    # the fix it names: RDMA devices in the profile's env, which the interface leaves alone
    prof = profile_copy(tmp_path / "rdma.yaml", "gb200-nvl72", network={"interface": "ib0"},
                        env={"UCX_NET_DEVICES": "mlx5_0:1,mlx5_1:1"})
    plan = planned(tmp_path, qwen, f"cluster={prof}")
    assert ucx.ucx_lines(plan) == ([], [])
    envs = [p.env for p in __import__("launcher.planning.render", fromlist=["x"]).processes(plan)
            if p.kind.value == "engine"]
    assert {e["UCX_NET_DEVICES"] for e in envs} == {"mlx5_0:1,mlx5_1:1"}
    assert {e["NCCL_SOCKET_IFNAME"] for e in envs} == {"ib0"}


def test_the_schema_text_says_the_interface_becomes_ucx_net_devices(cli):
    code, out, err = cli("recipes", "fields")
    assert code == 0, err
    assert "UCX_NET_DEVICES" in out and "only TCP" in out, out[-2000:]


# --- 5. a recipe pinning UCX_TLS without an RDMA lane ---------------------------------------------


def test_a_recipe_pinning_tcp_only_ucx_tls_is_said_at_dry_run_and_runs_as_published(tmp_path):
    """DeepSeek-V4's published UCX_TLS=cuda_copy,cuda_ipc,tcp: the dry-run says KV goes over
    TCP and names the key and the fix; the default refusal of TCP lets it run (the recipe
    asks for it, its figures were measured so); a profile that says refuse makes it a
    blocker at dry-run, not a failure after the load."""
    plan = planned(tmp_path, DSV4)
    (w,), blockers = ucx.ucx_lines(plan)
    assert not blockers
    assert w.startswith("env.UCX_TLS=cuda_copy,cuda_ipc,tcp has no RDMA lane"), w
    assert "add an RDMA lane to env.UCX_TLS" in w and "published" in w
    assert ucx.kv_tcp_refused(plan) is False
    error, note = pd_check.tcp_verdict(plan, {"decode-0@n1": ["tcp/eth0"]})
    assert error is None and "env.UCX_TLS=cuda_copy,cuda_ipc,tcp" in note
    prof = profile_copy(tmp_path / "refuse.yaml", "gb200-nvl72",
                        network={"kv_over_tcp": "refuse"})
    plan = planned(tmp_path, DSV4, f"cluster={prof}")
    _, (b,) = ucx.ucx_lines(plan)
    assert "env.UCX_TLS=cuda_copy,cuda_ipc,tcp" in b and "refuses KV over TCP" in b, b
    # the profile's own pin is no request of the recipe: refused by default, said at dry-run
    prof = profile_copy(tmp_path / "site.yaml", "gb200-nvl72",
                        env={"UCX_TLS": "cuda_copy,cuda_ipc,tcp"})
    plan = planned(tmp_path, "qwen3.5-397b-gb200-disagg", f"cluster={prof}")
    _, (b,) = ucx.ucx_lines(plan)
    assert b.startswith("the profile's env.UCX_TLS=cuda_copy,cuda_ipc,tcp has no RDMA lane"), b


def test_ucx_lane_reading():
    assert ucx.rdma_in_tls(None) and ucx.rdma_in_tls("all") and ucx.rdma_in_tls("rc_x,cuda_copy")
    assert ucx.rdma_in_tls("^tcp") and not ucx.rdma_in_tls("^ib,tcp")
    assert not ucx.rdma_in_tls("cuda_copy,cuda_ipc,tcp") and not ucx.rdma_in_tls("tcp,sm")
    assert ucx.rdma_devices("mlx5_0:1") and ucx.rdma_devices("all") and ucx.rdma_devices(None)
    assert not ucx.rdma_devices("ib0") and not ucx.rdma_devices("eth0,ib1")


def test_dry_run_golden_text_names_the_ucx_rule(cli, tmp_path):
    code, out, err = cli("submit", DSV4, "--dry-run")
    assert code == 0, err
    assert "warning: env.UCX_TLS=cuda_copy,cuda_ipc,tcp has no RDMA lane" in out
