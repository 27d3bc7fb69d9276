"""`launcher diff`: two runs that differ in one setting are named single-variable; a package
that changed between them is fingerprint drift, named."""

from __future__ import annotations

import json
import shutil

import synth
from helpers import launcher


def test_one_set_is_single_variable_and_a_changed_package_is_drift(tmp_path, tmp_path_factory):
    a = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    prof = a.parent.parent / "local-demo.yaml"
    code, out = launcher(tmp_path, "submit", "local-sim", "--set", f"cluster={prof}",
                         "--set", "benchmark.concurrency=[16]")
    assert code == 0, out
    (b,) = [r.parent for r in (tmp_path / "runs").glob("*/run.json")]
    code, out = launcher(tmp_path, "diff", str(a), str(b))
    assert code == 0, out
    assert "single-variable: only benchmark.concurrency differs, and nothing drifted" in out, out
    assert "benchmark.concurrency: [4, 16, 64] -> [16]" in out
    assert "processes (argv, environment):" in out and "bench-c4: only in A" in out
    assert "c=16 tok/s/working GPU:" in out and "c=4 " not in out  # points in both only
    assert "fingerprint: no drift" in out
    ident = json.loads((b / "run.json").read_text())["identity"]
    assert ident["packages"]["aiohttp"] and ident["engine_version"] == "simulator"
    # the same run with one package of the engine's environment changed
    c = tmp_path / "c"
    shutil.copytree(b, c)
    recipe = c / "recipe.yaml"  # its inputs are its own, as a run's are
    recipe.write_text(recipe.read_text().replace(str(b), str(c)))
    doc = json.loads((c / "run.json").read_text())
    doc["identity"]["packages"]["aiohttp"] = "0.0.1"
    (c / "run.json").write_text(json.dumps(doc))
    code, out = launcher(tmp_path, "diff", str(b), str(c), "--format", "json")
    r = json.loads(out)
    assert r["settings"] == [] and r["single_variable"] is False
    assert r["drift"] == [["package aiohttp", ident["packages"]["aiohttp"], "0.0.1"]]
    code, out = launcher(tmp_path, "diff", str(b), str(c))
    assert "NOT single-variable: 0 settings differ, 1 fingerprint item(s) drifted" in out


def test_again_reproduces_the_commands_of_a_run(tmp_path, tmp_path_factory):
    a = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    code, out = launcher(tmp_path, "submit", "--again", str(a), "--dry-run")
    assert code == 0, out
    (b,) = [r.parent for r in (tmp_path / "runs").glob("*/plan.json")]
    # Other tests' runs share this host: where one held the demo's block of ports, the demo
    # planned on the next free block and said so; a dry run plans on the profile's own block.
    # Every port keeps its place in the block.
    mine, theirs = (_ports_in_block((r / "commands.sh").read_text().replace(str(r), "<RUN>"),
                                    _router_port(r)) for r in (b, a))
    assert mine == theirs
    if _router_port(b) != _router_port(a):
        said = (a.parent.parent / "demo.out").read_text()
        assert f"this run plans on {_router_port(a)}-" in said, said
    assert "again: " in out and f"launcher diff {a} NEW_RUN" in out
    code, out = launcher(tmp_path, "submit", "local-sim", "--again", str(a))
    assert code == 2 and "give no recipe and no --sweep" in out


def _router_port(run) -> int:
    return int(json.loads((run / "plan.json").read_text())["router"]["url"].rsplit(":", 1)[1])


def _ports_in_block(text: str, router: int) -> str:
    """Every port of the run's block written as router+k."""
    import re

    def rel(m: re.Match) -> str:
        n = int(m.group())
        return f"<router+{n - router}>" if router <= n < router + 1000 else m.group()

    return re.sub(r"(?<![\d.])\d{4,5}(?![\d.])", rel, text)


def test_a_change_is_judged_against_the_spread_of_repeats_in_the_runs_directory(
        tmp_path, tmp_path_factory):
    """Repeats of A (the same resolved recipe, no drift) measure run-to-run spread: B's
    change is within it or outside it, said per figure; a run with another setting is not a
    repeat."""
    import yaml

    a = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    runs = tmp_path / "runs"
    runs.mkdir()

    def copy(name: str, scale: float, **setting) -> str:
        d = runs / name
        shutil.copytree(a, d)
        for f in ("recipe.yaml", "plan.json"):
            (d / f).write_text((d / f).read_text().replace(str(a), str(d)))
        if setting:
            doc = yaml.safe_load((d / "recipe.yaml").read_text())
            doc["benchmark"].update(setting)
            (d / "recipe.yaml").write_text(yaml.safe_dump(doc))
        summ = json.loads((d / "summary.json").read_text())
        for p in summ["points"]:
            p["total_tokens_per_s_per_gpu"] *= scale
        (d / "summary.json").write_text(json.dumps(summ))
        return str(d)

    base = copy("r0", 1.0)
    copy("r1", 1.02)
    copy("r2", 0.99)
    other = copy("x", 1.10, warmup=3)
    code, out = launcher(tmp_path, "diff", base, other)
    assert code == 0, out
    assert "run-to-run spread from repeats in the runs directory: A with 2, B with 0" in out
    assert "single-variable: only benchmark.warmup differs" in out
    line = next(x for x in out.splitlines() if x.strip().startswith("c=16 tok/s/working GPU"))
    assert "(+10.0 %), outside the run-to-run spread (3.0 %)" in line, line
    code, out = launcher(tmp_path, "diff", base, str(runs / "r1"), "--format", "json")
    r = json.loads(out)
    row = next(x for x in r["figures"]
               if x["concurrency"] == 16 and x["figure"] == "tok/s/working GPU")
    assert row["outside_spread"] is False and round(row["spread_pct"], 1) == 3.0
    assert sorted(r["repeats"]["a"]) == [str(runs / "r1"), str(runs / "r2")]
    # TTFT was the same in every repeat: a spread of 0, and no change is inside it
    ttft = next(x for x in r["figures"] if x["concurrency"] == 16 and x["figure"] == "TTFT p50 ms")
    assert ttft["spread_pct"] == 0 and ttft["change_pct"] == 0 and ttft["outside_spread"] is False


def test_diff_finds_the_same_repeats_by_run_id_relative_and_absolute_path(
        tmp_path, tmp_path_factory):
    """A run named by its id or by a path relative to the working directory is the same run
    as its absolute path: the same repeats, the same settings (its own directory in its
    recipe is not a setting)."""
    a = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    runs = tmp_path / "runs"
    runs.mkdir()
    for name in ("r0", "r1", "x"):
        d = runs / name
        shutil.copytree(a, d)
        for f in ("recipe.yaml", "plan.json"):
            (d / f).write_text((d / f).read_text().replace(str(a), str(d)))
    results = []
    for ra, rb in ((str(runs / "r0"), str(runs / "x")), ("r0", "x"),
                   ("runs/r0", "runs/x"), ("./runs/r0/", "x")):
        code, out = launcher(tmp_path, "diff", ra, rb, "--format", "json")
        assert code == 0, out
        r = json.loads(out)
        results.append((r["settings"], sorted(r["repeats"]["a"]), sorted(r["repeats"]["b"]),
                        r["a"], r["b"]))
    assert results[0][0] == [] and len(results[0][1]) == 2, results[0]
    assert all(x == results[0] for x in results), results


def test_a_run_that_never_started_is_said_so_not_drift(tmp_path, tmp_path_factory):
    """B refused before it ran (or a dry-run): it has no fingerprint, so nothing drifted;
    the comparison says B never started."""
    a = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    prof = a.parent.parent / "local-demo.yaml"
    code, out = launcher(tmp_path, "submit", "local-sim", "--set", f"cluster={prof}",
                         "--dry-run")
    assert code == 0, out
    (b,) = [r.parent for r in (tmp_path / "runs").glob("*/plan.json")]
    code, out = launcher(tmp_path, "diff", str(a), str(b), "--format", "json")
    r = json.loads(out)
    assert r["drift"] == [] and r["never_started"] == ["B"], r
    code, out = launcher(tmp_path, "diff", str(a), str(b))
    assert "fingerprint item(s) drifted" not in out, out
    assert "B never started (dry-run): it has no fingerprint and no figures" in out, out


def test_the_compare_page_says_a_run_never_started(tmp_path, tmp_path_factory, monkeypatch):
    from helpers import open_app

    a = synth.local_demo(tmp_path_factory.getbasetemp() / "local-demo")
    runs = tmp_path / "runs"
    shutil.copytree(a, runs / a.name)
    prof = a.parent.parent / "local-demo.yaml"
    code, out = launcher(tmp_path, "submit", "local-sim", "--set", f"cluster={prof}",
                         "--dry-run")
    assert code == 0, out
    b = next(p.parent for p in runs.glob("*/plan.json") if p.parent.name != a.name)
    at = open_app(runs, monkeypatch)
    at.query_params["a"], at.query_params["b"] = a.name, b.name
    at.switch_page("app_pages/compare.py").run()
    assert not at.exception, [e.value for e in at.exception]
    said = " ".join(str(x.value) for x in [*at.warning, *at.info, *at.success, *at.caption])
    assert "B never started (dry-run)" in said, said
    assert "drifted" not in said, said
