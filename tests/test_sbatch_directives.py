"""Issue 41, item 7: when sbatch does not know an option the launcher wrote into the batch
script, `--check` (and `submit`) name the recipe or cluster-profile key that put it there and
how to turn it off, not sbatch's words alone.

The words fed to `Slurm.sbatch_hint` (launcher.planning.schedulers) are sbatch's own: glibc getopt_long's
"unrecognized option '--segment=4'" line, then sbatch's 'Try "sbatch --help" for more
information' (src/sbatch/opt.c), as the dev cluster's Slurm 22.05 prints them; the last
test gets them from that Slurm itself."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from helpers import profile_copy

from launcher.control.prepare import plan_run
from launcher.planning.schedulers import SLURM
from launcher.schema import recipe

TRY = 'Try "sbatch --help" for more information'


def _plan(tmp_path, profile: str = "devcluster", sets: list[str] = (), **changes):
    ref = profile_copy(tmp_path / "profile.json", profile, **changes) if changes else profile
    r = recipe.load("devcluster-sim", [f"cluster={ref}", *sets])
    plan, _ = plan_run(r, tmp_path / "runs", None, {})
    return plan


def _unknown(option: str) -> str:
    return f"sbatch: unrecognized option '{option}'\n{TRY}\n"


@pytest.mark.parametrize("changes, option, words", [
    ({"segment": True}, "--segment=4", "the cluster profile's segment: true adds --segment; "
     "this Slurm has no such option: set segment: false"),
    ({}, "--gpus-per-node=4", "the cluster profile's gpu_directive: gpus-per-node adds "
     "--gpus-per-node; this Slurm has no such option: set gpu_directive: gres"),
    ({"gpu_directive": "gres"}, "--gres=gpu:4", "the cluster profile's gpu_directive: gres "
     "adds --gres; this Slurm has no such option: set gpu_directive: gpus-per-node"),
    ({}, "--exclusive", "the cluster profile's exclusive: true adds --exclusive; this Slurm "
     "has no such option: set exclusive: false"),
    ({"mem_zero": True}, "--mem=0", "the cluster profile's mem_zero: true adds --mem; this "
     "Slurm has no such option: set mem_zero: false"),
])  # fmt: skip
def test_an_option_from_the_profile_names_its_key(tmp_path, changes, option, words):
    plan = _plan(tmp_path, **changes)
    assert option in SLURM.batch_script(plan, 4, "/x")  # the launcher wrote it
    hint = SLURM.sbatch_hint(plan, _unknown(option))
    assert words in hint, hint
    assert "profile.json" in hint or "devcluster" in hint, hint  # which profile


def test_an_option_from_the_recipe_names_its_key(tmp_path):
    plan = _plan(tmp_path, sets=["slurm.directives.reservation=maint", "slurm.qos=high"])
    hint = SLURM.sbatch_hint(plan, _unknown("--reservation=maint"))
    assert "the recipe's slurm.directives.reservation adds --reservation" in hint, hint
    assert "remove it" in hint, hint
    hint = SLURM.sbatch_hint(plan, _unknown("--qos=high"))
    assert "the recipe's slurm.qos adds --qos" in hint, hint
    # the launcher's own options have no key: said so, not a wrong key
    hint = SLURM.sbatch_hint(plan, _unknown("--signal=B:USR2@120"))
    assert "slurm.signal_lead_s" in hint and "cannot be turned off" in hint, hint
    hint = SLURM.sbatch_hint(plan, _unknown("--ntasks-per-node=1"))
    assert "the launcher's own" in hint, hint
    assert SLURM.sbatch_hint(plan, "sbatch: error: invalid partition specified: x") == ""


def test_the_real_sbatch_refusal_names_segment(cli, tmp_path):
    """The issue's case through the dev cluster's real sbatch, which has no --segment."""
    if shutil.which("sbatch") is None:
        pytest.fail("Slurm is not installed: run `bash slurm/devcluster/up.sh` (as root)")
    helptext = subprocess.run(["sbatch", "--help"], capture_output=True, text=True).stdout
    assert "--segment" not in helptext, "this Slurm knows --segment: the case needs one that does not"
    profile = profile_copy(tmp_path / "seg.json", "devcluster", segment=True)
    rc, out, err = cli("submit", "devcluster-sim", "--check", "--set", f"cluster={profile}",
                       "--runs-dir", str(tmp_path / "runs"))
    assert rc == 2, (rc, err)
    assert "unrecognized option '--segment=4'" in err, err
    assert f"the cluster profile's segment: true adds --segment; this Slurm has no such " \
           f"option: set segment: false in {profile}" in err, err
