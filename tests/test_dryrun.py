"""`submit --dry-run`: what a user sees, the files it writes, quoting, secrets, goldens."""

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.control import prepare
from launcher.errors import UserError
from launcher.planning import plan, render, schedulers
from launcher.run.plandoc import Process
from launcher.run.vocab import Kind
from launcher.schema import cluster, recipe

SEED = "qwen3.5-397b-gb200-disagg"
REPO = Path(__file__).resolve().parents[1]
HOSTILE = ["a b", "it's", 'say "hi"', "$(touch /tmp/pwned)", "`id`", "tab\there", "x;y&z|w"]


def test_dry_run_prints_plan_and_writes_run_dir(cli, tmp_path):
    code, out, err = cli("submit", SEED, "--dry-run")
    assert code == 0, err
    assert "decode-0@gb200-r01-01" in out and "decode-0@gb200-r01-02" in out
    # a front per decode tray (decode.fronts: per_node), each behind the router
    assert "dp ranks 4-7" in out and "headless" not in out
    assert "Router and clients on gb200-r01-03 (router.placement: prefill)" in out
    # The estimate's figure is kv_cache's (docs/kv-capacity.md); the published recipe turns
    # prefix caching off, so vLLM's mamba_cache_mode is none.
    assert "KV capacity decode-0 (DP8 x TP1): about " in out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("Run directory: ")]
    run_dir = Path(line.split("Run directory: ")[1].split("  (")[0])
    (cap,) = json.loads((run_dir / "plan.json").read_text())["capacity"]
    assert cap["mamba_cache_mode"] == "none"
    assert run_dir.parent == tmp_path / "runs"
    for f in ("recipe.yaml", "plan.json", "job.sbatch", "commands.sh", "submission.json"):
        assert (run_dir / f).is_file(), f
    sbatch = (run_dir / "job.sbatch").read_text()
    assert "#SBATCH --nodes=4" in sbatch and "#SBATCH --segment=4" in sbatch
    assert "#SBATCH --gpus-per-node=4" in sbatch and "#SBATCH --exclusive" in sbatch
    assert "#SBATCH --signal=B:USR2@120" in sbatch and "wckey" not in sbatch
    cmds = (run_dir / "commands.sh").read_text()
    for setting in (
        "--async-scheduling", "--mamba-ssm-cache-dtype bfloat16", "--language-model-only",
        "--max-num-batched-tokens 16384", "--stream-interval 100", "--api-server-count 1",
        "--no-enable-prefix-caching", "--generation-config vllm", "VLLM_SSM_CONV_STATE_LAYOUT=DS",
        "--no-disable-hybrid-kv-cache-manager", "--served-model-name Qwen3.5-397B-A17B-NVFP4",
        "--data-parallel-hybrid-lb", "--decode http://gb200-r01-02:",
        '"kv_connector":"NixlConnector"', '"kv_role":"kv_both"', '"kv_load_failure_policy":"fail"',
        "vllm-router --host 0.0.0.0", "--vllm-pd-disaggregation",
        "python3 -m launcher.clients.bench", "--length-rule sa-bench", "--use-chat-template",
        "launcher.telemetry.agent",
    ):  # fmt: skip
        assert setting in cmds, setting
    subprocess.run(["bash", "-n", str(run_dir / "commands.sh")], check=True)


def test_json_format_and_runs_dir(cli, tmp_path):
    code, out, err = cli("submit", SEED, "--dry-run", "--format", "json", "--runs-dir", "elsewhere")
    assert code == 0, err
    (doc,) = json.loads(out[out.index("[") :])
    assert doc["run_dir"].startswith(str(tmp_path / "elsewhere"))
    assert doc["plan"]["gpu_count"]["total"] == 16
    assert doc["sbatch"].startswith("#!/bin/bash")


def test_set_replans_bigger_topology(cli):
    code, out, _ = cli("submit", SEED, "--dry-run", "--set", "prefill.endpoints=8")
    assert code == 0
    assert "6 nodes x 4 GPUs" in out and "prefill-7@" in out


def test_impossible_value_is_one_sentence_exit_2(cli):
    code, out, err = cli("submit", SEED, "--dry-run", "--set", "decode.data_parallel=6")
    assert code == 2
    assert err.startswith("error: decode: data_parallel x tensor_parallel = 6 GPUs")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_sweep_dry_run_writes_a_study(cli, tmp_path):
    code, out, err = cli("submit", SEED, "--dry-run", "--sweep", "prefill.endpoints=4,6,8")
    assert code == 0, err
    (study,) = [p.parent for p in (tmp_path / "runs").glob("*/study.json")]
    doc = json.loads((study / "study.json").read_text())
    assert [r["values"] for r in doc["runs"]] == [
        {"prefill.endpoints": 4}, {"prefill.endpoints": 6}, {"prefill.endpoints": 8},
    ]  # fmt: skip
    assert out.count("Run directory:") == 3 and "prefill-7@" in out


def _hostile_plan():
    r = recipe.load(SEED)
    r.env = {**r.env, **{f"HOSTILE_{i}": v for i, v in enumerate(HOSTILE)}}  # DS stays
    r.prefill.args = {f"opt-{i}": v for i, v in enumerate(HOSTILE)}
    r.slurm.directives = {"comment": HOSTILE[3] + " " + HOSTILE[1]}
    return plan.make_plan(r, cluster.load("gb200-nvl72"), cluster.expand_nodelist("n[1-4]"))


def test_hostile_values_survive_quoting_exactly(tmp_path):
    p = _hostile_plan().at(str(tmp_path))
    text = render.commands_sh(p)
    engines = [pr for pr in render.processes(p) if pr.name.startswith("prefill-0@")]
    (proc,) = engines
    line = shlex.join(render.command_line(p, proc))
    assert line.replace(render.JOBID_PLACEHOLDER, render.JOBID_BY_HAND) in text
    tokens = shlex.split(line)
    for i, v in enumerate(HOSTILE):
        assert f"HOSTILE_{i}={v}" in tokens
        assert tokens[tokens.index(f"--opt-{i}") + 1] == v
    # The shell itself reads the script back into the same words, and runs nothing.
    script = tmp_path / "c.sh"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert not Path("/tmp/pwned").exists()


def test_a_newline_in_any_value_is_refused_in_one_sentence(cli):
    # YAML's double-quoted escapes are how a newline gets into a --set value
    for setting in ('env.X="line1\\nline2"', 'slurm.directives.comment="a\\n#SBATCH --x"'):
        code, out, err = cli("submit", SEED, "--dry-run", "--set", setting)
        assert code == 2 and "newline or control character" in err, err
        assert len(err.strip().splitlines()) == 1


def test_hostile_sbatch_directive_is_quoted(tmp_path):
    text = schedulers.SLURM.batch_script(_hostile_plan(), 4, str(tmp_path))
    (line,) = [x for x in text.splitlines() if x.startswith("#SBATCH --comment=")]
    assert shlex.split(line.split("=", 1)[1]) == [HOSTILE[3] + " " + HOSTILE[1]]


def test_hostile_values_run_exactly_through_bash(tmp_path):
    """A rendered line, executed by bash, hands the program exactly the words we planned."""
    p = _hostile_plan()
    proc = Process(
        name="probe", kind=Kind.BENCH, node="n1", log="logs/probe.log",
        argv=[sys.executable, "-c", "import sys,json,os;print(json.dumps([sys.argv[1:], os.environ['V']]))", *HOSTILE],
        env={"V": HOSTILE[5] + HOSTILE[3]},
    )  # fmt: skip
    line = shlex.join(render.command_line(p, proc)[len(render.step_prefix(p, proc)) :])
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [HOSTILE, HOSTILE[5] + HOSTILE[3]]
    assert not Path("/tmp/pwned").exists()


def test_secrets_travel_by_name_only(tmp_path):
    env = dict(os.environ, HF_TOKEN="hf_SECRETVALUE123")
    out = subprocess.run(
        [sys.executable, "-m", "launcher", "submit", SEED, "--dry-run", "--format", "json"],
        capture_output=True, text=True, cwd=tmp_path, env=env, check=True,
    ).stdout  # fmt: skip
    assert "HF_TOKEN" in out
    for f in (tmp_path / "runs").rglob("*"):
        if f.is_file():
            assert "hf_SECRETVALUE123" not in f.read_text(), f
    assert "hf_SECRETVALUE123" not in out


def test_golden_examples_are_current():
    sys.path.insert(0, str(REPO / "slurm" / "examples"))
    import regenerate

    for name in recipe.shipped():  # the CPU recipes' estimates read their local models
        model = Path(recipe.load(name).model.path)
        if model.is_absolute() and not model.exists():
            pytest.fail(f"{name}: {model} is missing: run bash tests/vllm_cpu/setup.sh "
                        "(make test does)", pytrace=False)
    fresh = regenerate.render_all()
    assert set(fresh) == (set(recipe.shipped()) | {regenerate.STUDY} | set(regenerate.VARIANTS)
                          | set(regenerate.IMPORTED))
    for name, files in fresh.items():
        for f, text in files.items():
            golden = REPO / "slurm" / "examples" / name / f
            assert golden.exists(), f"missing {golden}: run python slurm/examples/regenerate.py"
            assert golden.read_text() == text, (
                f"{golden} is stale: run python slurm/examples/regenerate.py and review the diff"
            )


# the CLI by name for launcher/recipes/*.yaml; the srt-slurm imports in its folders dry-run
# through the same prepare_all in test_golden_examples_are_current (a process each would
# cost the suite 25 interpreter starts)
@pytest.mark.parametrize("name", sorted(n for n, p in recipe.shipped().items()
                                        if p.parent == recipe.RECIPES_DIR))
def test_every_shipped_recipe_dry_runs(cli, name):
    code, out, err = cli("submit", name, "--dry-run")
    assert code == 0, err
    assert "Run directory:" in out


# --- inputs the dry-run fuzzing (tests/test_fuzz.py) found broken: one test per bug --------


def _prepare_err(tmp_path, ref=SEED, *, runs=None, sets=(), sweeps=(), nodelist=None):
    with pytest.raises(UserError) as e:
        prepare.prepare_all(ref, list(sets), list(sweeps), runs or tmp_path / "runs", nodelist)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(
    "runs, words",
    [
        ("d" * 300, "a directory name holds at most 255"),  # was an OSError traceback
        ("/".join(["d" * 200] * 25), "must fit in 4,096"),  # was an OSError traceback
        ("r\udcff", "is not UTF-8 text"),  # was a UnicodeEncodeError writing commands.sh
        ("f/runs", "cannot create a run directory there: Not a directory"),
        ("a%j", "Slurm reads as a pattern"),  # the batch output landed elsewhere
        ("a\\b", "backslash"),  # sbatch unescaped it: the output landed elsewhere
        ("my-hetjob-runs", "another job component"),  # sbatch split the job in two
        ("a:b", "container mounts"),  # the run directory's mount was cut in two
    ],
)
def test_runs_dir_that_cannot_hold_runs_is_one_sentence(tmp_path, runs, words):
    (tmp_path / "f").write_text("a file")
    msg = _prepare_err(tmp_path, runs=tmp_path / runs)
    assert msg.startswith("--runs-dir") and words in msg, msg


def test_a_value_that_reads_like_the_jobid_placeholder_stays_literal(tmp_path):
    # commands.sh replaced the placeholder as text, so this value turned into the job id
    (p,) = prepare.prepare_all(SEED, ["vllm_args.tokenizer=/m/--jobid=$SLURM_JOB_ID"], [],
                               tmp_path)
    text = p.run.commands.read_text()
    assert " --tokenizer '/m/--jobid=$SLURM_JOB_ID'" in text
    assert text.count(render.JOBID_BY_HAND) == text.count("srun ")


def test_a_null_directive_is_removed_not_written_as_none(tmp_path):
    (p,) = prepare.prepare_all(SEED, ["slurm.directives.comment=null"], [], tmp_path)
    assert "--comment" not in p.sbatch


@pytest.mark.alone
def test_a_huge_topology_is_refused_before_it_is_laid_out(tmp_path):
    # 512 endpoints of 256 nodes each were all placed before the node bound was checked
    sets = ["decode.endpoints=512", "decode.data_parallel=1024"]
    start = time.monotonic()
    msg = _prepare_err(tmp_path, sets=sets)
    assert time.monotonic() - start < 1
    assert "plans at most 90: use fewer endpoints or a smaller data_parallel" in msg


def test_sweeps_are_checked_and_planned_before_anything_is_written(tmp_path):
    runs = tmp_path / "runs"
    msg = _prepare_err(tmp_path, sweeps=["prefill.endpoints=4,5", "prefill.endpoints=6"])
    assert msg == "--sweep prefill.endpoints is given twice: list all its values in one --sweep"
    # the third run needs more nodes than a rack has: no study folder is left behind
    msg = _prepare_err(tmp_path, sweeps=["prefill.endpoints=4,8,40"])
    assert "one rack" in msg and not runs.exists()


def test_swept_values_never_put_a_job_separator_into_sbatch(tmp_path):
    # the value became part of the run directory, which is in the #SBATCH --output line
    for way in ("one", "each"):
        runs = prepare.prepare_all(SEED, [], ["model.served_name=xhetjob,y"], tmp_path,
                                   allocation=way)
        assert "het-job" in runs[0].run.path.name
        assert not any("hetjob" in p.sbatch.lower() for p in runs)


def test_a_data_path_too_long_for_the_filesystem_is_kept_as_given(tmp_path):
    # Path.is_file raised ENAMETOOLONG while staging the accuracy inputs
    data = "/tmp/" + "d" * 300 + "/test.jsonl"
    (p,) = prepare.prepare_all(SEED, [f"accuracy.data={data}"], [], tmp_path)
    assert p.plan.recipe.accuracy.data == data


def test_a_relative_data_path_from_set_is_the_same_file_inside_the_allocation(
    tmp_path, monkeypatch
):
    # recipe.yaml kept it relative, so the plan made again from the run directory (inside
    # the allocation) pointed at <run dir>/x.jsonl, not the file the dry-run showed
    monkeypatch.chdir(tmp_path)
    (p,) = prepare.prepare_all(SEED, ["accuracy.data=missing/x.jsonl"], [], tmp_path / "runs")
    want = str(tmp_path / "missing" / "x.jsonl")
    assert p.plan.recipe.accuracy.data == want
    assert recipe.load(str(p.run.recipe)).accuracy.data == want
