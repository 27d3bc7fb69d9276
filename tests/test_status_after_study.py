"""Issue 41, item 9: `status` after a study. With no argument it shows the newest thing (the
study itself when the newest run belongs to one); an engine reads "kept loaded" only while
its study's allocation lives; the last line names the next step. On a synthetic study
planned by the real planner and recorded as one allocation (tests/synth.py); the real local
study is tests/test_study_allocation.py's."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import synth

from launcher.run.rundir import RunDir


def _study(root: Path) -> Path:
    study = synth.in_one_allocation(root, synth.study(root / "src"))
    # what a configuration that left its engines for the next one records
    first = json.loads((study / "study.json").read_text())["allocation"]["turns"][0]["run"]
    rd = RunDir(study / first)
    rec = rd.read_record()
    for p in rec.processes.values():
        if p.kind == "engine":
            p.kept, p.stopped, p.exit_code = True, False, None
    rd.write_record(rec)
    return study


def _no_age(out: str) -> str:
    """`status` as printed, each age (launcher.text.age: 1h05m, 3m07s) as AGE."""
    import re

    return re.sub(r"\b\d+(?:h\d{2}m|m\d{2}s)\b", "AGE", out)


def _kept_rows(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(("decode-", "prefill-"))]


def test_status_shows_the_newest_study_and_its_next_step(cli, tmp_path):
    root = tmp_path / "runs"
    study = _study(root)
    rc, out, err = cli("status", "--runs-dir", str(root))
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["RUN", "STATE"], out
    assert lines[1].startswith(f"{study.name}/  (study: 3 runs over prefill.endpoints=1,2,3, "
                               "in one allocation)"), out
    assert any(ln.startswith("allocation: succeeded: 3 of 3 configuration(s) succeeded")
               for ln in lines), out
    assert lines[-1].startswith(f"next: python -m launcher report {study}"), out
    assert f"python -m launcher recommend {study}" in lines[-1]
    assert f"python -m launcher dashboard {root}" in lines[-1]
    # the same, asked by name
    rc, again, err = cli("status", study.name, "--runs-dir", str(root))
    # the AGE column is the clock's: a minute may turn between the two calls
    assert _no_age(again) == _no_age(out), (again, out)


def test_an_engine_is_kept_loaded_only_while_the_allocation_lives(cli, tmp_path):
    root = tmp_path / "runs"
    study = _study(root)
    first = json.loads((study / "study.json").read_text())["allocation"]["turns"][0]["run"]
    rc, out, err = cli("status", first, "--runs-dir", str(root))
    assert rc == 0, err
    rows = _kept_rows(out)
    assert rows and not any("kept loaded" in r for r in rows), out
    assert all(" stopped " in r for r in rows), rows
    assert "stopped at the end of its study's allocation" in out, out
    assert out.splitlines()[-1].startswith("next: python -m launcher report "), out
    # while the allocation lives (a process of the launcher's here), the engines are loaded
    alloc = study / "allocation.json"
    doc = json.loads(alloc.read_text())
    held = subprocess.Popen(["sh", "-c", "sleep 120", "launcher"])
    try:
        doc.update(state="running", ended=None, host=socket.gethostname(), pid=held.pid,
                   slurm_job_id=None)
        alloc.write_text(json.dumps(doc))
        rc, out, err = cli("status", first, "--runs-dir", str(root))
        assert all("kept loaded" in r for r in _kept_rows(out)), out
        rc, out, err = cli("status", study.name, "--runs-dir", str(root))
        assert f"allocation: running (pid {held.pid} on {socket.gethostname()})" in out, out
    finally:
        held.kill()
        held.wait()
    # an allocation whose process is gone without recording its end keeps nothing loaded
    doc.update(pid=2**22 - 7)
    alloc.write_text(json.dumps(doc))
    rc, out, err = cli("status", first, "--runs-dir", str(root))
    assert not any("kept loaded" in r for r in _kept_rows(out)), out
    rc, out, err = cli("status", study.name, "--runs-dir", str(root))
    assert "allocation: its process (pid" in out and "is gone without recording its end" in out


def test_the_last_line_of_status_names_the_next_step(cli, tmp_path):
    rc, out, err = cli("submit", "local-sim", "--dry-run", "--runs-dir", str(tmp_path))
    assert rc == 0, err
    rc, out, err = cli("status", "--runs-dir", str(tmp_path))
    assert out.splitlines()[-1].startswith("next: submit it: python -m launcher submit "
                                           "local-sim --runs-dir"), out
    assert "--dry-run" not in out.splitlines()[-1], out
    root = tmp_path / "failed"
    run = synth.failed(root)
    rc, out, err = cli("status", "--runs-dir", str(root))
    last = out.splitlines()[-1]
    culprit = RunDir(run).read_record().culprit
    assert last.startswith(f"next: python -m launcher logs {run} {culprit}"), out
    assert f"python -m launcher submit --again {run}" in last, last


def test_the_dashboard_reads_the_same(tmp_path):
    from launcher.analysis import load

    study = _study(tmp_path / "runs")
    first = json.loads((study / "study.json").read_text())["allocation"]["turns"][0]["run"]
    procs = load.run_info(study / first).processes
    assert procs and "kept loaded" not in procs.values(), procs
