"""Issue 40: the site's own launch settings (extra srun options, a step preamble, no GPU
request, the IMEX channel, the decode fronts) are refused in one sentence when they would
break a step or leak a secret, and land where the dry-run says."""

from __future__ import annotations

import pytest
from helpers import profile_copy

from launcher.control.prepare import plan_run
from launcher.errors import UserError
from launcher.planning import render
from launcher.schema import cluster, recipe


@pytest.mark.parametrize("option, words", [
    ("--nodelist=gb200-01", "remove --nodelist=gb200-01: the planner places each step"),
    ("--node=2", "remove --node=2: srun reads it as --nodelist, which the launcher sets"),
    ("--gres=gpu:4", "remove --gres=gpu:4: set the profile's gpu_directive"),
    ("--export=ALL", "each process's environment is rendered on its command line"),
    ("--container-image=x", "the container runtime's flags come from the profile's containers"),
    ("cpu-bind=none", "write it as --name or --name=value, one item per option"),
    ("--cpu-bind none", "write it as --name or --name=value, one item per option"),
    ("--comment=HF_TOKEN=hf_abc", "HF_TOKEN"),
])  # fmt: skip
@pytest.mark.parametrize("key", ["slurm.srun_options", "decode.srun_options"])
def test_an_srun_option_the_launcher_owns_or_a_secret_is_refused(key, option, words):
    with pytest.raises(UserError) as e:
        recipe.load("devcluster-sim", [f"{key}=[{option!r}]"])
    text = str(e.value)
    assert words in text and key in text, text
    assert "\n" not in text.strip(), text


def test_the_profile_refuses_the_same_and_a_preamble_that_sets_a_secret(tmp_path):
    for changes, words in (
        ({"srun_options": ["--jobid=7"]}, "remove --jobid=7: every step runs in the job's "
                                          "allocation"),
        ({"step_preamble": "export HF_TOKEN=hf_abc; module load cuda"}, "HF_TOKEN"),
        ({"gpu_directive": "gpus"}, "gpu_directive"),
        ({"imex": {"channel": "first"}}, "imex.channel"),
        ({"network": {"loopback_ok": True, "kv_over_tcp": "maybe"}}, "network.kv_over_tcp"),
    ):
        path = profile_copy(tmp_path / "p.json", "devcluster", **changes)
        with pytest.raises(UserError) as e:
            cluster.load(path)
        assert words in str(e.value), (changes, str(e.value))


def test_fronts_per_node_on_an_endpoint_of_one_node_is_one_front(tmp_path):
    """per_node only changes an endpoint over several nodes: a one-node prefill keeps its one
    API server and no hybrid-LB flag."""
    r = recipe.load("devcluster-sim", ["prefill.fronts=per_node", "decode.fronts=per_node"])
    plan, _ = plan_run(r, tmp_path / "runs", None, {})
    pre = next(p for p in render.processes(plan.at("/r")) if p.name.startswith("prefill-0@"))
    assert "--data-parallel-hybrid-lb" not in pre.argv and pre.url
    fronts = [p for p in render.processes(plan.at("/r")) if p.endpoint == "decode-0"]
    assert len(fronts) == 2 and all("--data-parallel-hybrid-lb" in p.argv for p in fronts)
    assert len({p.url for p in fronts}) == 2


def test_the_preamble_runs_before_the_command_and_fails_the_step_when_it_fails(tmp_path):
    """The preamble is a bash -c word before the process's env and argv: the step's command
    runs (exec, same process) only when every preamble command succeeded."""
    import subprocess

    path = profile_copy(tmp_path / "p.json", "local", step_preamble="echo pre; false")
    r = recipe.load("local-sim", [f"cluster={path}"])
    plan, _ = plan_run(r, tmp_path / "runs", None, {})
    words = render.preamble(plan, "x")
    assert words[:2] == ["bash", "-c"] and "echo pre; false" in words[2]
    bad = subprocess.run([*words, "echo", "ran"], capture_output=True, text=True)
    assert bad.returncode != 0 and bad.stdout.split() == ["pre"]
    good = render.preamble(plan.at("/r"), "x")
    good[2] = good[2].replace("false", "true")
    ran = subprocess.run([*good, "echo", "ran"], capture_output=True, text=True)
    assert ran.returncode == 0 and ran.stdout.split() == ["pre", "ran"]
