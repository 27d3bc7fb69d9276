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
    mine = (b / "commands.sh").read_text().replace(str(b), "<RUN>")
    theirs = (a / "commands.sh").read_text().replace(str(a), "<RUN>")
    assert mine == theirs
    assert "again: " in out and f"launcher diff {a} NEW_RUN" in out
    code, out = launcher(tmp_path, "submit", "local-sim", "--again", str(a))
    assert code == 2 and "give no recipe and no --sweep" in out
