"""benchmark.custom: a recipe's own command in place of the sweep, with srt-slurm 2.x's
environment contract (docs/custom-benchmark.md).

The end-to-end tests run the local profile on simulated engines behind the real vllm-router;
the command is a small Python script that uses the environment it was given against the live
processes and writes what it found."""

import json
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import helpers
import pytest
import yaml
from helpers import launcher, leftovers

from launcher.errors import UserError
from launcher.planning import plan, render
from launcher.run import figures, rundir
from launcher.schema import cluster, native_bench, recipe

REPO = Path(__file__).resolve().parents[1]
LOCAL = REPO / "launcher" / "recipes" / "local-sim.yaml"
PORT_BASES = range(27200, 29400, 200)

# The benchmark block of InferenceX's DeepSeek-V4-Pro GB200 recipe
# (benchmarks/multi_node/srt-slurm-recipes/vllm/deepseek-v4-pro/GB200/8k1k/
# disagg-gb200-1p1d-dep8-dep8-c1024.yaml, commit 38ac93e3), its command as published.
DSV4_COMMAND = textwrap.dedent("""\
    set -euo pipefail
    result_dir=/logs/vllm_isl_8192_osl_1024
    mkdir -p "$result_dir"
    concurrency=1024
    num_prompts=$((concurrency * 10))
    num_warmups=$((concurrency * 2))
    python3 /infmax-workspace/utils/bench_serving/benchmark_serving.py \\
        --backend openai \\
        --base-url "http://$SRT_FRONTEND_HOST:$SRT_FRONTEND_PORT" \\
        --endpoint /v1/completions \\
        --model deepseek-ai/DeepSeek-V4-Pro \\
        --tokenizer /model \\
        --dataset-name random \\
        --random-input-len 8192 \\
        --random-output-len 1024 \\
        --random-range-ratio 1.0 \\
        --num-prompts "$num_prompts" \\
        --max-concurrency "$concurrency" \\
        --request-rate inf \\
        --num-warmups "$num_warmups" \\
        --ignore-eos \\
        --use-chat-template \\
        --seed 0 \\
        --result-dir "$result_dir" \\
        --result-filename "results_concurrency_${concurrency}_gpus_16_ctx_8_gen_8.json"
    """)


def _load(*sets: str):
    return recipe.load(str(LOCAL), list(sets))


def _refusal(*sets: str) -> str:
    with pytest.raises(UserError) as e:
        _load(*sets)
    return str(e.value)


# --- the recipe key -----------------------------------------------------------------------


def test_bad_values_get_one_sentence_naming_the_key():
    assert "benchmark.custom.command: the command is empty" in _refusal(
        "benchmark.custom.command=  ")
    said = _refusal("benchmark.custom.command=echo", "benchmark.custom.env=[A, B]")
    assert "benchmark.custom.env: must be a section of keys and values" in said
    said = _refusal("benchmark.custom.command=echo", "benchmark.custom.env.X=[1]")
    assert "benchmark.custom.env.X: must be text" in said
    said = _refusal("benchmark.custom.command=echo", "benchmark.custom.env.1X=a")
    assert "benchmark.custom.env: '1X' is not a valid environment variable name" in said
    said = _refusal("benchmark.custom.command=echo", "benchmark.custom.env.HF_TOKEN=x")
    assert "benchmark.custom.env.HF_TOKEN is a secret" in said and "env_from_host" in said
    said = _refusal("benchmark.custom.command=echo",
                    "prefill.args_from_concurrency={16: {max-num-seqs: 8}}")
    assert "benchmark.custom runs no sweep points" in said
    for said in [_refusal("benchmark.custom.command=echo", "benchmark.custom.env=[A, B]"),
                 _refusal("benchmark.custom.command=  ")]:
        assert "Traceback" not in said
    # numbers become text, as everywhere else a recipe sets environment
    assert _load("benchmark.custom.command=echo",
                 "benchmark.custom.env.N=8").benchmark.custom.env == {"N": "8"}


def _gb200_plan(custom: dict, **decode):
    data = {
        "name": "c", "cluster": "gb200-nvl72", "engine": "vllm", "mode": "disagg",
        "model": {"path": "/models/q", "served_name": "q"},
        "container": {"image": "vllm/vllm-openai@sha256:" + "0" * 64},
        "prefill": {"endpoints": 2, "data_parallel": 2, "expert_parallel": True},
        "decode": {"endpoints": 1, "data_parallel": 8, "expert_parallel": True, **decode},
        "benchmark": {"custom": custom},
    }  # fmt: skip
    r = recipe.validate(data, "test")
    c = cluster.load("gb200-nvl72")
    p = plan.make_plan(r, c, cluster.profile_nodes(c, plan.nodes_needed(r, c)))
    return p.at("/runs/r1")


def test_the_contract_lists_every_router_worker_aligned_by_role():
    # a decode over two nodes with an API server on each: two decode workers of the router
    p = _gb200_plan({"command": "true", "env": {"SRT_FRONTEND_PORT": "1"}}, fronts="per_node")
    (bench,) = [x for x in render.processes(p) if x.kind == "bench"]  # no sweep points
    env = bench.env
    fronts = {role: [u for ep in p.endpoints if ep.role == role for u in p.front_urls(ep)]
              for role in ("prefill", "decode")}
    assert len(fronts["decode"]) == 2
    for role, urls in fronts.items():
        hosts = [u.removeprefix("http://") for u in urls]
        assert env[f"SRT_{role.upper()}_ENDPOINTS"].split(",") == hosts
        assert env[f"SRT_{role.upper()}_IPS"].split(",") == [h.rsplit(":", 1)[0] for h in hosts]
    assert env["AIPERF_SERVER_METRICS_URLS"].split(",") == [
        u + "/metrics" for u in fronts["prefill"] + fronts["decode"]]
    assert "SRT_AGG_IPS" not in env
    assert env["SRT_FRONTEND_HOST"] == p.address(p.router_node)
    assert env["SRT_WORKER_NODES"].split(",") == list(p.nodes)
    assert env["SRT_GPUS_PER_NODE"] == "4"
    # the recipe's own benchmark env is applied last, as srt-slurm applies benchmark.env
    assert env["SRT_FRONTEND_PORT"] == "1"
    # in the engine's container, as the builtin client runs, on the router's node
    assert bench.container and bench.node == p.router_node
    assert bench.argv == ["bash", "-lc", "true"]
    line = render.command_line(p, bench)  # a pyxis step on the router's node, like the client's
    assert line[0] == "srun" and f"--nodelist={p.router_node}" in line
    assert any(w.startswith("--container-image=") for w in line)
    # srt-slurm's /logs (its log directory: here the run directory) and /model, in every
    # container step: pyxis attaches later steps to the node's running named container
    (mounts,) = [w for w in line if w.startswith("--container-mounts=")]
    assert mounts.endswith(",/runs/r1:/logs,/models/q:/model:ro"), mounts
    engine = next(x for x in render.processes(p) if x.kind == "engine")
    assert mounts in render.command_line(p, engine)
    # a study's one allocation keeps containers across runs: no /logs of one run there
    assert ":/logs" not in " ".join(render.command_line(p.at("/runs/r1", "/runs"), bench))
    assert line[-3:] == ["bash", "-lc", "true"]


def test_a_script_over_several_lines_is_one_line_of_commands_sh(tmp_path):
    src = yaml.safe_load(LOCAL.read_text())
    src["benchmark"] = {"custom": {"command": "set -e\necho \"it's $SRT_FRONTEND_PORT\"\t\nexit 3\n",
                                   "env": {"X": 1}}}
    for k in ("data", "train"):
        src["accuracy"][k] = str((LOCAL.parent / src["accuracy"][k]).resolve())
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(src))
    code, out = launcher(tmp_path, "submit", str(path), "--dry-run")
    assert code == 0, out
    run = next((tmp_path / "runs").glob("*/commands.sh")).parent
    lines = (run / "commands.sh").read_text().splitlines()
    (i,) = [n for n, ln in enumerate(lines) if ln.startswith("# bench (bench)")]
    line = lines[i + 1]
    assert line.endswith(f"> {run}/logs/bench.log 2>&1 &")
    # bash reads the line's words back: the environment, then the $'...' word as the command
    words = subprocess.run(
        ["bash", "-c", "printf '%s\\0' " + line.removesuffix(f" > {run}/logs/bench.log 2>&1 &")],
        capture_output=True, text=True, check=True).stdout.split("\0")[:-1]
    assert words[-3:] == ["bash", "-lc", src["benchmark"]["custom"]["command"]]
    assert "X=1" in words and any(w.startswith("AIPERF_SERVER_METRICS_URLS=http") for w in words)
    assert "Custom benchmark (benchmark.custom) in place of the sweep, on local-3" in out
    assert "Sweep:" not in out
    assert "KV capacity below: for benchmark.input_len/output_len (8192/1024)" in out
    assert json.loads((run / "plan.json").read_text())["workload"]["driver"] == "custom"


# --- what the dry-run offers instead --------------------------------------------------------


def test_inferencex_fixed_length_commands_are_named_with_the_native_sets():
    n = native_bench.recognise(DSV4_COMMAND, {})
    assert n.runs_natively and "benchmark_serving.py" in n.what and not n.missing
    assert n.sets == ["benchmark.input_len=8192", "benchmark.output_len=1024",
                      "benchmark.concurrency=[1024]", "benchmark.length_rule=sa-bench",
                      "benchmark.range_ratio=1.0", "benchmark.prompts_multiplier=10",
                      "benchmark.warmup=0", "benchmark.warmup_multiplier=2",
                      "benchmark.chat_template=true"]
    # the offered --sets make a recipe whose sweep is that workload
    r = recipe.load("qwen3.5-397b-gb200-disagg", [
        f"benchmark.custom.command={DSV4_COMMAND}", "benchmark.custom=null", *n.sets])
    b = r.benchmark
    assert b.sweeps and (b.input_len, b.output_len, b.concurrency) == (8192, 1024, [1024])
    assert (b.prompts(1024), b.warmups(1024), b.range_ratio) == (10240, 2048, 1.0)

    wrapper = "bash /infmax-workspace/benchmarks/multi_node/srt_bench.sh"
    n = native_bench.recognise(wrapper, {"PREFILL_GPUS": "4", "TOTAL_GPUS": "20"})
    assert "srt_bench.sh" in n.what
    assert n.missing == ["benchmark.input_len", "benchmark.output_len", "benchmark.concurrency"]
    assert "ISL" not in n.text() or "give benchmark.input_len" in n.text()
    n = native_bench.recognise(wrapper, {"ISL": "1024", "OSL": "1024",
                                         "CONCURRENCIES": "64x128", "USE_CHAT_TEMPLATE": "false"})
    assert not n.missing and "benchmark.concurrency=[64,128]" in n.sets
    assert "benchmark.chat_template=false" in n.sets and "benchmark.range_ratio=0.8" in n.sets

    agentic = native_bench.recognise(
        "bash /infmax-workspace/benchmarks/multi_node/agentic_srt.sh", {"IS_MULTINODE": "true"})
    assert not agentic.runs_natively and "agentic" in agentic.text()
    assert native_bench.recognise("python my_bench.py", {}) is None


def test_the_dry_run_says_which_and_how_to_run_it_natively(tmp_path):
    code, out = launcher(
        tmp_path, "submit", "local-sim", "--dry-run",
        "--set", "benchmark.custom.command=bash /ix/benchmarks/multi_node/srt_bench.sh",
        "--set", "benchmark.custom.env.ISL=256", "--set", "benchmark.custom.env.OSL=32",
        "--set", "benchmark.custom.env.CONCURRENCIES=4x8")
    assert code == 0, out
    said = " ".join(out.split())
    assert ("This is InferenceX's fixed-length sa-bench wrapper (srt_bench.sh), which the "
            "builtin sweep sends natively") in said
    sets = said.split("natively (sa-bench's lengths and warm-up, per-point results, the "
                      "dashboard): ", 1)[1].split(" Accuracy gate:", 1)[0]
    assert sets.startswith("--set benchmark.custom=null --set benchmark.input_len=256 ")
    # the offered line, run as printed, plans the builtin sweep
    code, again = launcher(tmp_path, "submit", "local-sim", "--dry-run",
                           "--set", "benchmark.custom.command=x", *shlex.split(sets))
    assert code == 0, again
    assert "Sweep: concurrency 4, 8 at" in again and "Custom benchmark" not in again


# --- a run -----------------------------------------------------------------------------------

CHECK = textwrap.dedent("""\
    import json, os, sys, urllib.request
    out = {"env": {k: v for k, v in os.environ.items() if k.startswith(("SRT", "AIPERF"))},
           "metrics": {}, "health": {}}
    for url in os.environ["AIPERF_SERVER_METRICS_URLS"].split(","):
        text = urllib.request.urlopen(url, timeout=30).read().decode()
        out["metrics"][url] = sum(1 for ln in text.splitlines() if ln.startswith("vllm:"))
    for role in ("PREFILL", "DECODE", "AGG"):
        for ep in filter(None, os.environ.get(f"SRT_{role}_ENDPOINTS", "").split(",")):
            out["health"][ep] = urllib.request.urlopen(f"http://{ep}/health", timeout=30).status
    front = f"http://{os.environ['SRT_FRONTEND_HOST']}:{os.environ['SRT_FRONTEND_PORT']}"
    body = {"model": os.environ["MY_MODEL"], "prompt": "hello", "max_tokens": 4}
    req = urllib.request.Request(front + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    out["completion"] = json.loads(urllib.request.urlopen(req, timeout=60).read())
    with open(os.environ["MY_OUT"], "w") as f:
        json.dump(out, f)
    print("checked", len(out["metrics"]), "workers; exiting with", os.environ["MY_EXIT"])
    sys.exit(int(os.environ["MY_EXIT"]))
    """)


def _custom_run(tmp_path, exit_code: int):
    (tmp_path / "check.py").write_text(CHECK)
    prof = helpers.profile_copy(tmp_path / "local.yaml", "local",
                                port_base=helpers.free_port_base(PORT_BASES, 200))
    code, out = launcher(
        tmp_path, "submit", "local-sim", "--set", f"cluster={prof}",
        "--set", f"benchmark.custom.command={shlex.join([sys.executable, str(tmp_path / 'check.py')])}",
        "--set", f"benchmark.custom.env.MY_OUT={tmp_path / 'found.json'}",
        "--set", "benchmark.custom.env.MY_MODEL=qwen3.5-toy",
        "--set", f"benchmark.custom.env.MY_EXIT={exit_code}",
        "--set", "accuracy.num_questions=5")
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    return code, out, run


def test_a_custom_command_reaches_the_live_processes_through_its_environment(tmp_path):
    code, out, run = _custom_run(tmp_path, 0)
    assert code == 0, out
    st = rundir.RunDir(run).status()
    assert st.state == "succeeded", st.error
    found = json.loads((tmp_path / "found.json").read_text())
    env = found["env"]
    doc = json.loads((run / "plan.json").read_text())
    # the front end is the live router; every worker's /metrics is a live vLLM API server's
    assert f"http://{env['SRT_FRONTEND_HOST']}:{env['SRT_FRONTEND_PORT']}" == doc["router"]["url"]
    fronts = [u for role in ("prefill", "decode") for e in doc["endpoints"]
              if e["role"] == role for u in e["fronts"]]
    assert env["AIPERF_SERVER_METRICS_URLS"].split(",") == [u + "/metrics" for u in fronts]
    assert len(found["metrics"]) == 3 and all(n > 50 for n in found["metrics"].values()), found
    assert set(found["health"].values()) == {200}
    assert found["completion"]["choices"][0]["text"]
    assert env["SRT_WORKER_NODES"] == "local-1,local-2,local-3"
    # its output kept, its outcome recorded; no sweep ran, the gate did
    assert "checked 3 workers; exiting with 0" in (run / "logs" / "bench.log").read_text()
    outcome = json.loads((run / "custom-bench.json").read_text())
    assert outcome["exit_code"] == 0 and outcome["log"] == "logs/bench.log"
    assert not list((run / "bench").glob("c*.json"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verdict"] == "passed", summary["verdict_reasons"]
    assert summary["custom_benchmark"]["exit_code"] == 0
    assert figures.summary_problem(summary) is None  # summary.json's shape, as readers check it
    assert summary["accuracy"]["passed"]
    assert "custom benchmark (benchmark.custom) exited with status 0" in " ".join(out.split())
    assert leftovers(run) == []
    code, _ = launcher(tmp_path, "report", str(run), "-o", str(tmp_path / "r.html"))
    page = (tmp_path / "r.html").read_text()
    assert code == 0 and "custom command (benchmark.custom), in place of the sweep" in page


def test_a_failing_custom_command_fails_the_run_with_its_exit_status(tmp_path):
    code, out, run = _custom_run(tmp_path, 7)
    assert code == 1, out
    st = rundir.RunDir(run).status()
    assert st.state == "failed"
    assert st.error.startswith("the custom benchmark (benchmark.custom: ")
    assert "exited with status 7; last lines of logs/bench.log:" in st.error
    assert "checked 3 workers; exiting with 7" in st.error
    rec = rundir.RunDir(run).read_record()
    assert rec.failed_stage == "sweep" and rec.culprit == "bench"
    # the gate still ran, teardown too, and nothing is left
    assert json.loads((run / "accuracy" / "gsm8k.json").read_text())["passed"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["verdict"] == "failed"
    assert "the custom benchmark exited with status 7" in summary["verdict_reasons"]
    assert json.loads((run / "custom-bench.json").read_text())["exit_code"] == 7
    code, status = launcher(tmp_path, "status", str(run))
    assert "exited with status 7" in status
    assert leftovers(run) == []


# --- through Slurm and pyxis ------------------------------------------------------------------

IN_CONTAINER = textwrap.dedent("""\
    python3 - <<'EOF'
    import json, os, urllib.request
    found = {"metrics": {}, "run_dir_at_logs": os.path.exists("/logs/plan.json")}
    for url in os.environ["AIPERF_SERVER_METRICS_URLS"].split(","):
        text = urllib.request.urlopen(url, timeout=30).read().decode()
        found["metrics"][url] = sum(1 for ln in text.splitlines() if ln.startswith("vllm:"))
    found["env"] = {k: v for k, v in os.environ.items() if k.startswith(("SRT", "AIPERF"))}
    with open("/logs/found.json", "w") as f:
        json.dump(found, f)
    print("custom step done")
    EOF
    """)


@pytest.mark.slurm
def test_a_custom_command_runs_in_the_pyxis_container_with_logs_mounted(tmp_path):
    if subprocess.run(["sinfo", "-h"], capture_output=True).returncode != 0:
        pytest.fail("the dev cluster does not answer: run slurm/devcluster/up.sh")
    shipped = REPO / "launcher" / "recipes" / "devcluster-sim.yaml"
    src = yaml.safe_load(shipped.read_text())
    src["benchmark"] = {"custom": {"command": IN_CONTAINER}}
    for k in ("data", "train"):
        src["accuracy"][k] = str((shipped.parent / src["accuracy"][k]).resolve())
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(src))
    code, out = launcher(tmp_path, "submit", str(tmp_path / "r.yaml"), "--wait",
                         "--set", "accuracy.num_questions=5", timeout=600)
    (run,) = [p.parent for p in (tmp_path / "runs").glob("*/plan.json")]
    assert code == 0, out + (run / "logs" / "bench.log").read_text(errors="replace")
    # written inside the container at /logs: the run directory
    found = json.loads((run / "found.json").read_text())
    assert found["run_dir_at_logs"]
    doc = json.loads((run / "plan.json").read_text())
    fronts = [u for role in ("prefill", "decode") for e in doc["endpoints"]
              if e["role"] == role for u in e["fronts"]]
    assert list(found["metrics"]) == [u + "/metrics" for u in fronts]
    assert all(n > 50 for n in found["metrics"].values()), found["metrics"]
    assert f"http://{found['env']['SRT_FRONTEND_HOST']}:{found['env']['SRT_FRONTEND_PORT']}" \
        == doc["router"]["url"]
    assert "custom step done" in (run / "logs" / "bench.log").read_text()
    bench = next(p for p in doc["processes"] if p["name"] == "bench")
    assert bench["container"]
    assert json.loads((run / "summary.json").read_text())["verdict"] == "passed"
    assert leftovers(run) == []
