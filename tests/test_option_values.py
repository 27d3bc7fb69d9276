"""Issue 39, first item: a recipe value that looks like an option (`--help`, `-h`,
`--version`, `-x`, `--foo=bar`, `-1`) under any `*.args` key never reaches the engine's or
the router's parser as an option of its own: it is rendered `--flag=value`, so the parser
takes it as the flag's value, or the dry-run refuses it in one sentence naming the key and
the value (exit 2). Never a help text, never a traceback."""

from __future__ import annotations

import contextlib
import io
import itertools
import shlex
from pathlib import Path

import pytest

from launcher import cli as cli_mod

SPELLINGS = ["--help", "-h", "--version", "-x", "--foo=bar", "-1"]
# (recipe, where the flag goes); the step 32 is inside devcluster-sim's sweep (8, 32)
PLACES = [
    ("devcluster-sim", "vllm_args"),
    ("devcluster-sim", "prefill.args"),
    ("devcluster-sim", "decode.args"),
    ("devcluster-sim", "decode.args_from_concurrency.32"),
    ("qwen3.5-397b-gb200-agg", "agg.args"),
    ("devcluster-sim", "router.args"),
]
HELP_WORDS = ("show this help message", "options:", "usage:", "positional arguments")


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_mod.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def _commands(runs: Path) -> str:
    found = sorted(runs.rglob("commands.sh"))
    assert len(found) == 1, found
    return found[0].read_text()


def _taken_as_value(rc: int, out: str, err: str, runs: Path, key: str, flag: str,
                    value: str) -> None:
    """Refused in one sentence naming the key and the value, or rendered --flag=value."""
    assert "Traceback" not in out + err, err
    for words in HELP_WORDS:
        assert words not in out + err, (key, value, out[-2000:], err)
    if rc == 2:
        lines = err.strip().splitlines()
        assert out == "" and len(lines) == 1 and lines[0].startswith("error: "), err
        assert key in lines[0] and value in lines[0], lines[0]
        return
    assert rc == 0, (rc, err)
    rendered = shlex.quote(f"--{flag}={value}")
    text = _commands(runs)
    assert rendered in text, (key, value)
    assert f"--{flag} {shlex.quote(value)}" not in text


@pytest.mark.parametrize("recipe, where", PLACES)
def test_every_spelling_under_every_args_key_is_a_value(tmp_path, recipe, where):
    for i, (value, flag) in enumerate(itertools.product(SPELLINGS, ["my-flag", "tokenizer"])):
        if where == "router.args" and flag == "tokenizer":
            flag = "policy"
        runs = tmp_path / f"runs{i}"
        key = f"{where}.{flag}"
        rc, out, err = _main("submit", recipe, "--dry-run", "--runs-dir", str(runs),
                             "--set", f"{key}={value}")
        _taken_as_value(rc, out, err, runs, key, flag, value)


@pytest.mark.parametrize("recipe, where", PLACES)
def test_the_real_cli_never_prints_help_or_a_traceback(cli, tmp_path, recipe, where):
    """The issue's command and its class, through `python -m launcher` as a user runs it."""
    value = SPELLINGS[PLACES.index((recipe, where)) % len(SPELLINGS)]
    key = f"{where}.my-flag"
    runs = tmp_path / "runs"
    rc, out, err = cli("submit", recipe, "--dry-run", "--runs-dir", str(runs),
                       "--set", f"{key}={value}")
    _taken_as_value(rc, out, err, runs, key, "my-flag", value)
    if where != "router.args":  # vLLM knows no --my-flag; the router's flags are not read
        assert rc == 2 and f"--my-flag={value}" in err, err


def test_the_issue_command_is_refused_naming_key_and_value(cli, tmp_path):
    rc, out, err = cli("submit", "devcluster-sim", "--dry-run", "--set",
                       "decode.args.my-flag=--help", "--runs-dir", str(tmp_path / "runs"))
    assert rc == 2 and out == "" and "Traceback" not in err, (rc, err)
    assert "unrecognized arguments: --my-flag=--help: fix decode.args.my-flag" in err, err
    assert "--help:" not in err.replace("--my-flag=--help:", ""), err  # no key "--help"


@pytest.mark.parametrize("key", ["help", "hel", "h", "-h"])
def test_a_key_that_is_the_parsers_own_help_is_refused(tmp_path, key):
    """A key, not a value, can name the parser's own --help (or an abbreviation of it)."""
    rc, out, err = _main("submit", "devcluster-sim", "--dry-run", "--runs-dir",
                         str(tmp_path / "runs"), "--set", f"decode.args.{key}=true")
    assert rc == 2 and out == "" and "Traceback" not in err, (rc, out[-500:], err)
    for words in HELP_WORDS:
        assert words not in err, err
    assert f"decode.args.{key}" in err and len(err.strip().splitlines()) == 1, err


def test_the_parsers_take_the_rendered_values_as_values():
    """vLLM 0.33's parser (the simulator's table) and the real vllm-router's parser read
    `--flag=value` as the flag's value whatever it starts with."""
    from vllm_router.launch_router import parse_router_args

    from launcher.planning import render
    from launcher.sim import argv as vllm_argv

    for value in SPELLINGS:
        argv = ["serve", "m", *render.flags({"tokenizer": value, "seed": -1})]
        ns, _ = vllm_argv.parse(argv, warn=lambda w, m: None)
        assert ns.tokenizer == value and ns.seed == -1, argv
        router = ["--worker-urls", "http://a:1", *render.flags({"host": value})]
        assert parse_router_args(router).host == value, router


def test_the_simulator_prints_help_only_as_the_engine():
    """The parser hands help and version text to its caller (the engine prints it; the
    dry-run's check does not)."""
    from launcher.sim import argv as vllm_argv
    from launcher.sim import main as sim_main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(vllm_argv.VllmArgError) as e:
        vllm_argv.parse(["serve", "m", "--help"], warn=lambda w, m: None)
    assert out.getvalue() == "" and e.value.code == 0 and "options:" in e.value.out
    with contextlib.redirect_stdout(out):
        assert sim_main.main(["serve", "m", "--help"]) == 0
    assert "options:" in out.getvalue()
    from launcher.control import argcheck  # the preflight's check of the simulator's argv

    found = argcheck.check("sim", [["serve", "m", "--hel"], ["serve", "m", "--tokenizer=-h"]])
    assert [r["message"] for r in found["results"]] == [argcheck.ASKS_HELP, None]


@pytest.mark.parametrize("value", ["-1", "--foo=bar", "plain", "a=b"])
def test_what_reads_a_flag_back_reads_both_forms_the_planner_writes(value):
    """The node check, the dry-run's tokenizer note and `recommend` read a flag's value back
    from an argv the planner wrote with `option`: either form gives the value written."""
    from launcher.planning.render import option
    from launcher.run.plandoc import option_value

    argv = ["vllm", "serve", "m", *option("--tokenizer-revision", value), "--enforce-eager"]
    assert option_value(argv, "--tokenizer-revision") == value
    assert option_value(argv, "--tokenizer") is None  # a prefix of another flag is not it
    assert option_value(argv, "--enforce-eager") is None  # no value after it
