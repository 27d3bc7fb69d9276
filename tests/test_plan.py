"""The pure planner: placement, DP ranks, ports, and plans that do not fit."""

import pytest

from launcher.errors import UserError
from launcher.planning import plan, render
from launcher.schema import cluster, recipe

SEED = "qwen3.5-397b-gb200-disagg"
GB200 = cluster.load("gb200-nvl72")
NODES = cluster.expand_nodelist("gb200-[001-018]")


def make(*sets, ref=SEED, prof=GB200, nodes=NODES):
    return plan.make_plan(recipe.load(ref, list(sets)), prof, nodes)


def all_ports(p):
    ports = [p.router_port, p.router_metrics_port, *p.exporter_ports.values()]
    for ep in p.endpoints:
        ports += [ep.http_port, ep.dp_rpc_port]
        ports += range(ep.nixl_port_base, ep.nixl_port_base + ep.pool.data_parallel)
    return ports


@pytest.mark.parametrize("n", [4, 5, 6, 7, 8])
def test_seed_topology_for_4_to_8_prefill_endpoints(n):
    p = make(f"prefill.endpoints={n}")
    decode = [ep for ep in p.endpoints if ep.role == "decode"]
    prefill = [ep for ep in p.endpoints if ep.role == "prefill"]
    assert len(decode) == 1 and len(prefill) == n
    d = decode[0]
    # DEP8 over 2 nodes: one head (API server) and one headless part with ranks 4..7.
    assert [(pt.node, pt.gpus, pt.dp_ranks, pt.head) for pt in d.parts] == [
        (NODES[0], (0, 1, 2, 3), (0, 1, 2, 3), True),
        (NODES[1], (0, 1, 2, 3), (4, 5, 6, 7), False),
    ]
    # Two DEP2 prefill endpoints per node, disjoint GPUs, never on decode nodes.
    used = {}
    for ep in prefill:
        (part,) = ep.parts
        assert part.node not in (NODES[0], NODES[1])
        assert len(part.gpus) == 2
        for g in part.gpus:
            assert (part.node, g) not in used, f"GPU {g} of {part.node} given twice"
            used[(part.node, g)] = ep.name
    assert len(p.nodes) == 2 + (n + 1) // 2
    assert p.gpu_count() == {"prefill": 2 * n, "decode": 8, "agg": 0, "total": 2 * n + 8}
    ports = all_ports(p)
    assert len(ports) == len(set(ports)), "a port is used twice in the job"


def test_ports_unique_across_job_on_single_host_devcluster():
    dev = cluster.load("devcluster")
    p = make(ref="devcluster-sim", prof=dev, nodes=cluster.expand_nodelist("gb200-[01-06]"))
    ports = all_ports(p)
    assert len(ports) == len(set(ports))


def all_port_numbers(p):
    """all_ports plus each part's vLLM internal range (VLLM_PORT .. + span)."""
    ports = set(all_ports(p))
    for ep in p.endpoints:
        for part in ep.parts:
            ports |= set(range(part.vllm_port, part.vllm_port + plan.VLLM_PORT_SPAN))
    return ports


@pytest.mark.parametrize("ref, prof, sets", [
    ("devcluster-sim", "devcluster", ["prefill.endpoints=1"]),
    ("devcluster-sim", "devcluster", ["prefill.endpoints=2"]),
    (SEED, "gb200-nvl72", ["prefill.endpoints=8"]),
])
def test_jobs_that_share_a_host_plan_disjoint_ports(ref, prof, sets):
    """Jobs of any shape, with consecutive ids (a study's), never share a port; outside a job
    (the dry-run) the ports are the profile's own; every port stays below the ephemeral range."""
    c = cluster.load(prof)
    nodes = cluster.expand_nodelist("gb200-[01-06]") if prof == "devcluster" else NODES
    r_small = recipe.load(ref, list(sets))
    r_big = recipe.load(ref, ["prefill.endpoints=4"] if ref != SEED else [])
    dry = plan.make_plan(r_small, c, nodes)
    assert dry.router_port == c.port_base
    slots, block = plan.job_port_slots(c, dry.port_span)
    assert slots > 1 and block >= dry.port_span
    seen: dict[int, str] = {}
    for i, job in enumerate(range(4100, 4100 + slots)):
        r = r_small if i % 2 else r_big  # shapes alternate, as in a study
        p = plan.make_plan(r, c, nodes, job_id=str(job))
        ports = all_port_numbers(p)
        assert max(ports) < plan.EPHEMERAL_FLOOR
        clash = {q: seen[q] for q in ports if q in seen}
        assert not clash, f"job {job} reuses ports of {set(clash.values())}"
        seen.update(dict.fromkeys(ports, str(job)))
    # the same job id plans the same ports (the plan is made twice inside the allocation)
    a = plan.make_plan(r_small, c, nodes, job_id="4242")
    assert all_port_numbers(a) == all_port_numbers(plan.make_plan(r_small, c, nodes, job_id="4242"))
    assert plan.make_plan(r_small, c, nodes, job_id="4242_7").router_port == a.router_port


def test_a_sites_port_blocks_bound_where_jobs_sharing_a_host_plan():
    """A profile's port_blocks (a site's open port range) bounds the blocks jobs take turns
    on: job ids past it wrap around inside it, and no port leaves the range."""
    c = cluster.load("devcluster").model_copy(update={"port_blocks": 3})
    nodes = cluster.expand_nodelist("gb200-[01-06]")
    r = recipe.load("devcluster-sim")
    span = plan.make_plan(r, c, nodes).port_span
    assert plan.job_port_slots(c, span) == (3, 1000)
    routers = [plan.make_plan(r, c, nodes, job_id=str(j)).router_port for j in range(30, 36)]
    assert routers == [c.port_base + k % 3 * 1000 for k in range(30, 36)], routers
    top = max(max(all_port_numbers(plan.make_plan(r, c, nodes, job_id=str(j))))
              for j in range(30, 36))
    assert top < c.port_base + 3000
    # without it: as many as fit below the ephemeral range, at most 16
    assert plan.job_port_slots(cluster.load("devcluster"), span)[0] == 9


def test_multinode_rendezvous_flags():
    p = make()
    procs = {pr.name: pr for pr in render.processes(p.at("/runs/x"))}
    head = procs[f"decode-0@{NODES[0]}"].argv
    tail = procs[f"decode-0@{NODES[1]}"].argv
    d = p.endpoints[0]

    def val(argv, flag):
        return argv[argv.index(flag) + 1]

    for argv in (head, tail):
        assert val(argv, "--data-parallel-size") == "8"
        assert val(argv, "--data-parallel-size-local") == "4"
        assert val(argv, "--data-parallel-address") == NODES[0]
        assert val(argv, "--data-parallel-rpc-port") == str(d.dp_rpc_port)
        assert "--enable-expert-parallel" in argv
    # decode.fronts: per_node (the seed): an API server per node, hybrid load balancing
    for argv, start in ((head, "0"), (tail, "4")):
        assert "--headless" not in argv and val(argv, "--api-server-count") == "1"
        assert "--data-parallel-hybrid-lb" in argv
        assert val(argv, "--data-parallel-start-rank") == start
    assert val(head, "--port") != val(tail, "--port")
    # the endpoint spans nodes: vLLM picks its internal ports (srt-slurm unsets it too)
    assert all("VLLM_PORT" not in procs[f"decode-0@{n}"].env for n in NODES[:2])
    # one front and headless parts (decode.fronts: one)
    one = {pr.name: pr for pr in render.processes(make("decode.fronts=one").at("/r"))}
    head1, tail1 = one[f"decode-0@{NODES[0]}"].argv, one[f"decode-0@{NODES[1]}"].argv
    assert "--headless" not in head1 and val(head1, "--api-server-count") == "1"
    assert "--headless" in tail1 and val(tail1, "--data-parallel-start-rank") == "4"
    assert "--api-server-count" not in tail1 and "--port" not in tail1
    assert "--data-parallel-hybrid-lb" not in head1 + tail1
    # The published scheme: kv_both on both sides (recipe kv_connector.kv_role).
    assert '"kv_role":"kv_both"' in val(head, "--kv-transfer-config")
    pre = procs[f"prefill-0@{NODES[2]}"]
    assert '"kv_role":"kv_both"' in val(pre.argv, "--kv-transfer-config")
    assert pre.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == NODES[2]
    assert pre.env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert procs[f"prefill-1@{NODES[2]}"].env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert procs[f"decode-0@{NODES[1]}"].env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == NODES[1]


def test_router_gets_every_endpoint():
    p = make("prefill.endpoints=6")
    router = next(pr for pr in render.processes(p.at("/r")) if pr.kind == "router")
    assert "--vllm-pd-disaggregation" in router.argv
    # each decode front is a decode worker (decode.fronts: per_node)
    assert router.argv.count("--prefill") == 6 and router.argv.count("--decode") == 2
    fronts = [router.argv[i + 1] for i, a in enumerate(router.argv) if a == "--decode"]
    d = p.endpoints[0]
    assert fronts == [p.url(part.node, part.http_port) for part in d.parts]
    one = next(pr for pr in render.processes(make("decode.fronts=one").at("/r"))
               if pr.kind == "router")
    assert one.argv.count("--decode") == 1
    assert router.argv[router.argv.index("--kv-connector") + 1] == "nixl"


def test_addresses_override_names():
    r = recipe.load(SEED)
    addrs = {n: f"10.0.0.{i}" for i, n in enumerate(NODES)}
    p = plan.make_plan(r, GB200, NODES, addrs)
    head = next(pr for pr in render.processes(p.at("/r")) if pr.name == f"decode-0@{NODES[1]}")
    assert head.argv[head.argv.index("--data-parallel-address") + 1] == "10.0.0.0"
    assert head.env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "10.0.0.1"


@pytest.mark.parametrize(
    "sets, words",
    [
        (["decode.data_parallel=6"], "does not fill whole nodes of 4 GPUs"),
        (["decode.tensor_parallel=8"], "takes whole nodes (a multiple of 4) and data_parallel 1"),
        (["decode.tensor_parallel=6", "decode.data_parallel=1"], "a multiple of 4"),
        (["prefill.tensor_parallel=2"], "same tensor parallel size on prefill and decode"),
        (["prefill.gpus_per_node=8"], "a gb200-nvl72 node has 4 GPUs"),
        (["prefill.endpoints=40"], "one rack of gb200-nvl72 has 18"),
        (["prefill.args.block-size=32"], "same block size"),
        (["prefill.args.data-parallel-size=4"], "set prefill.data_parallel"),
        (["decode.args.--port=1"], "the launcher owns every port"),
        (["vllm_args.kv-transfer-config='{\"a\":1}'"], "kv_role per side"),
        (["prefill.env.CUDA_VISIBLE_DEVICES=0"], "pins GPUs"),
        (["decode.pipeline_parallel=2", "vllm_args.pipeline-parallel-size=null"],
         "decode.pipeline_parallel 2: vLLM's NixlConnector does not move KV to or from "
         "pipeline stages"),
        (["prefill.args.pipeline-parallel-size=2"],
         "prefill.args: remove 'pipeline-parallel-size': set prefill.pipeline_parallel instead"),
        (["decode.data_parallel=1", "decode.tensor_parallel=4", "decode.pipeline_parallel=2"],
         "vllm_args: remove 'pipeline-parallel-size': decode.pipeline_parallel renders "
         "--pipeline-parallel-size"),
    ],
)
def test_impossible_plans_say_what_to_change(sets, words):
    with pytest.raises(UserError) as e:
        make(*sets)
    assert words in str(e.value)


@pytest.mark.parametrize("sets, words", [
    (["agg.pipeline_parallel=2"],
     "agg: pipeline_parallel 2 with data_parallel 8 is not laid out by this launcher"),
    (["agg.data_parallel=1", "agg.tensor_parallel=3", "agg.pipeline_parallel=2"],
     "agg.tensor_parallel x pipeline_parallel 3 x 2 is larger than the 4 GPUs"),
])
def test_impossible_pipeline_stages_say_what_to_change(sets, words):
    with pytest.raises(UserError) as e:
        make(*sets, ref="qwen3.5-397b-gb200-agg")
    assert words in str(e.value)


def test_pipeline_stages_on_one_tray_and_over_two():
    """TP2 x PP2 fits a tray: no rendezvous; TP4 x PP2 takes two, node rank 1 headless."""
    one = make("agg.data_parallel=1", "agg.tensor_parallel=2", "agg.pipeline_parallel=2",
               "agg.expert_parallel=false", ref="qwen3.5-397b-gb200-agg")
    argv = next(pr for pr in render.processes(one.at("/r")) if pr.kind == "engine").argv
    assert argv[argv.index("--pipeline-parallel-size") + 1] == "2" and "--nnodes" not in argv
    assert [len(ep.parts) for ep in one.endpoints] == [1, 1] and one.gpu_count()["agg"] == 8
    two = make("agg.data_parallel=1", "agg.tensor_parallel=4", "agg.pipeline_parallel=2",
               ref="qwen3.5-397b-gb200-agg")
    assert len(two.nodes) == 4 and two.gpu_count()["agg"] == 16
    eng = [pr for pr in render.processes(two.at("/r")) if pr.endpoint == "agg-0"]
    assert [pr.argv[pr.argv.index("--node-rank") + 1] for pr in eng] == ["0", "1"]
    assert [pr.headless for pr in eng] == [False, True]


def test_not_enough_nodes():
    with pytest.raises(UserError, match="needs 4 nodes of 4 GPUs but only 3"):
        make(nodes=NODES[:3])


def test_nodelist_expansion():
    assert cluster.expand_nodelist("gb200-[01-03,07],login1") == [
        "gb200-01", "gb200-02", "gb200-03", "gb200-07", "login1",
    ]  # fmt: skip
    assert cluster.expand_nodelist("n[9-11]") == ["n9", "n10", "n11"]
    with pytest.raises(UserError):
        cluster.expand_nodelist("n[a-b]")
    with pytest.raises(UserError, match="unbalanced"):
        cluster.expand_nodelist("x[1-")
