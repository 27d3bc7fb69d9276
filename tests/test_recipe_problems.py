"""Issue 41, item 4: an invalid recipe (or cluster profile) shows every problem at once, each
with its did-you-mean, in `submit`, `recipes show` and wherever else validation is read
(the error's text); one problem stays one line."""

from __future__ import annotations

import pytest
from helpers import profile_copy

from launcher.errors import UserError
from launcher.schema import cluster, recipe

BAD = """\
name: many-problems
engine: vlm
mode: dissagg
model:
  path: x/y
prefil:
  endpoints: 1
decode:
  endpointz: 1
slurm:
  time_limt: 10
benchmark:
  concurency: [1]
  input_len: x
"""
# each problem and the words it must carry (the name probably meant, the accepted form)
EXPECTED = [
    "missing required key 'cluster'",
    "engine: must be one of vllm, sim; did you mean 'vllm'?",
    "mode: must be one of disagg, agg; did you mean 'disagg'?",
    "unknown key 'prefil'; did you mean 'prefill'?",
    "unknown key 'decode.endpointz'; did you mean 'endpoints'?",
    "unknown key 'slurm.time_limt'; did you mean 'time_limit'?",
    "unknown key 'benchmark.concurency'; did you mean 'concurrency'?",
    "benchmark.input_len: must be a whole number",
]


def _bad(tmp_path, text: str = BAD) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return str(path)


def _listed(err: str, path: str, expected: list[str]) -> None:
    """`error: FILE: N problems:` then one line per problem (in the recipe's key order)."""
    lines = err.strip().splitlines()
    assert lines[0] == f"error: {path}: {len(expected)} problems:", err
    assert len(lines) == 1 + len(expected) and all(x.startswith("  - ") for x in lines[1:])
    for words in expected:
        assert len([x for x in lines[1:] if words in x]) == 1, (words, err)
    assert "more problem" not in err and "Traceback" not in err


@pytest.mark.parametrize("command", [["submit", "--dry-run"], ["recipes", "show"]])
def test_every_problem_of_a_recipe_is_listed(cli, tmp_path, command):
    path = _bad(tmp_path)
    rc, out, err = cli(*command[:1], path, *command[1:], "--runs-dir", str(tmp_path / "r")) \
        if command[0] == "submit" else cli(*command, path)
    assert rc == 2 and out == "", (rc, out)
    _listed(err, path, EXPECTED)


def test_the_error_text_holds_them_all_on_one_line(tmp_path):
    """What else reads a recipe's validation (run.json's error inside the allocation, the
    dashboard) gets the same problems in str(error), numbered, on one line."""
    with pytest.raises(UserError) as e:
        recipe.load(_bad(tmp_path))
    text = str(e.value)
    assert "\n" not in text and text.startswith(f"{tmp_path / 'bad.yaml'}: 8 problems: (1) ")
    for i in range(1, len(EXPECTED) + 1):
        assert f"; ({i}) " in text or i == 1, text
    assert all(words in text for words in EXPECTED), text


def test_problems_a_set_brought_name_the_set(cli, tmp_path):
    rc, out, err = cli("submit", "local-sim", "--dry-run", "--runs-dir", str(tmp_path / "r"),
                       "--set", "prefill.endpointz=4", "--set", "slurm.time_limt=10",
                       "--set", "sim.speeed=2")
    lines = err.strip().splitlines()
    assert rc == 2 and lines[0].endswith(": 3 problems:"), err
    assert "did you mean 'endpoints'? (from --set prefill.endpointz)" in lines[1], lines
    assert "did you mean 'time_limit'? (from --set slurm.time_limt)" in lines[2], lines
    assert "did you mean 'speed'? (from --set sim.speeed)" in lines[3], lines


def test_a_single_problem_stays_one_line(cli, tmp_path):
    rc, out, err = cli("submit", "local-sim", "--dry-run", "--runs-dir", str(tmp_path / "r"),
                       "--set", "prefill.endpointz=4")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "with --set prefill.endpointz: unknown key 'prefill.endpointz'; did you mean " \
           "'endpoints'?" in err, err


def test_the_recipe_wide_checks_are_listed_together(tmp_path):
    """The checks across keys (env names, secrets, pools per mode) run once every key is
    valid, and list every problem too, not the first."""
    text = recipe.RECIPES_DIR.joinpath("local-sim.yaml").read_text()
    path = _bad(tmp_path, text)
    with pytest.raises(UserError) as e:
        recipe.load(path, ["env.HF_TOKEN=x", "env.-bad=1", "agg.endpoints=1",
                           "router.args.api-key=k"])
    msg = str(e.value)
    assert ": 4 problems: " in msg, msg
    for words in ("env.HF_TOKEN is a secret", "'-bad' is not a valid environment variable",
                  "mode disagg takes no agg endpoints", "router.args.api-key carries a secret"):
        assert words in msg, (words, msg)


def test_every_problem_of_a_cluster_profile_is_listed(tmp_path):
    path = profile_copy(tmp_path / "p.json", "local", port_bsae=9000, gpus_per_node="four")
    with pytest.raises(UserError) as e:
        cluster.load(path)
    msg = str(e.value)
    assert "2 problems" in msg and "did you mean 'port_base'?" in msg, msg
    assert "gpus_per_node: must be a whole number" in msg, msg
