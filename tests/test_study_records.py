"""Issue 36: the study's own files are typed (launcher.run.studydoc), as the run's are. A
damaged study.json or allocation.json is one sentence, naming the file and the field, from
every reader: the CLI (`runs`, `status STUDY`, `status RUN`, `report STUDY`, `logs STUDY`,
`cancel STUDY`, `run STUDY`) and every dashboard page; never a traceback. On a synthetic
study planned by the real planner and recorded as one allocation (tests/synth.py), good
first, then damaged."""

from __future__ import annotations

import contextlib
import dataclasses
import html
import io
import json
import re
import shutil
from pathlib import Path

import pytest
import synth
from helpers import open_app

from launcher import cli as cli_mod
from launcher.errors import UserError
from launcher.run import listing, studydoc
from launcher.run.rundir import ALLOCATION, STUDY
from launcher.run.studydoc import StudyFileError


def _main(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli_mod.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A good study in one allocation, its runs planned by the real planner."""
    root = tmp_path_factory.mktemp("good")
    (root / "runs").mkdir()
    return synth.in_one_allocation(root / "runs", synth.study(root / "src"))


# --- the damages ------------------------------------------------------------------------------


def _text(text: str):
    return lambda path: path.write_text(text)


def _edit(change):
    def damage(path: Path) -> None:
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc))
    return damage


def _turn(i: int, **kw):
    return _edit(lambda d: d["allocation"]["turns"][i].update(kw))


# case -> (file, damage, what the sentence says in its parentheses)
CASES = {
    "study-not-json": (STUDY, _text('{"study": "x", "axes": '), "not valid JSON: "),
    "study-a-list": (STUDY, _text("[1, 2]"), "the file is [1, 2], not a JSON object"),
    "study-empty": (STUDY, _text("\n"), "it is empty"),
    "study-wrong-type": (STUDY, _edit(lambda d: d["allocation"].update(nodes="four")),
                         'allocation.nodes is "four", not a whole number'),
    "study-axes-type": (STUDY, _edit(lambda d: d.update(axes={"prefill.endpoints": 5})),
                        "axes is {\"prefill.endpoints\": 5}, not a mapping of keys to lists"),
    "study-missing": (STUDY, _edit(lambda d: d.pop("runs")), "runs is missing"),
    "study-missing-nested": (STUDY, _edit(lambda d: d["allocation"].pop("turns")),
                             "allocation.turns is missing"),
    "study-turn-shape": (STUDY, _turn(1, start="decode-0"),
                         'allocation.turns[1].start is "decode-0", not a list of text'),
    "study-turn-no-run": (STUDY, _edit(lambda d: d["allocation"]["turns"][0].pop("run")),
                          "allocation.turns[0].run is missing"),
    "study-turn-not-object": (STUDY, _edit(lambda d: d["allocation"]["turns"].__setitem__(
        0, "x")), 'allocation.turns[0] is "x", not a JSON object'),
    "study-turn-elsewhere": (STUDY, _turn(0, run="no-such-run"),
                             'allocation.turns[0].run is "no-such-run", not one of its runs'),
    "study-run-outside": (STUDY, _edit(lambda d: d["runs"][0].update(run="../x")),
                          'runs[0].run is "../x", not the name of a run directory'),
    "study-mode": (STUDY, _edit(lambda d: d["allocation"].update(mode="two")),
                   'allocation.mode is "two", not "one"'),
    "alloc-not-json": (ALLOCATION, _text("{]"), "not valid JSON: "),
    "alloc-a-list": (ALLOCATION, _text('["succeeded"]'),
                     'the file is ["succeeded"], not a JSON object'),
    "alloc-empty": (ALLOCATION, _text(""), "it is empty"),
    "alloc-wrong-type": (ALLOCATION, _edit(lambda d: d["summary"].update(gpu_hours="4")),
                         'summary.gpu_hours is "4", not a finite number'),
    "alloc-state": (ALLOCATION, _edit(lambda d: d.update(state="finished")),
                    'state is "finished", not one of'),
    "alloc-missing": (ALLOCATION, _edit(lambda d: d.pop("state")), "state is missing"),
    "alloc-turn-shape": (ALLOCATION,
                         _edit(lambda d: d["configurations"][0]["turn"].update(keep=5)),
                         "configurations[0].turn.keep is 5, not a list of text"),
    "alloc-lost-node": (ALLOCATION, _edit(lambda d: d.update(lost_nodes=[
        {"node": "n1", "why": "gone", "run": "between configurations", "ts": 1.0}])),
        "lost_nodes[0].released is missing"),
    "alloc-engine": (ALLOCATION, _edit(lambda d: d["engines"].__setitem__(0, 5)),
                     "engines[0] is 5, not a JSON object"),
}
# the CLI and the dashboard take every case: each reads both files
SHOWN = list(CASES)


@pytest.fixture
def damaged(request, good, tmp_path) -> tuple[Path, Path, str, str]:
    """(runs root, study, the damaged file's name, the sentence its reader says)."""
    name, damage, _ = CASES[request.param]
    root = tmp_path / "runs"
    study = Path(shutil.copytree(good, root / good.name))
    damage(study / name)
    read = studydoc.read_study if name == STUDY else studydoc.read_allocation
    with pytest.raises(StudyFileError) as e:
        read(study)
    return root, study, name, str(e.value)


# --- the records ------------------------------------------------------------------------------


def test_the_good_files_read_as_their_records(good, tmp_path):
    doc, rec = studydoc.read_study(good), studydoc.read_allocation(good)
    assert doc is not None and doc.allocation is not None and rec is not None
    assert [r.run for r in doc.runs] == sorted(p.name for p in good.iterdir() if p.is_dir())
    assert doc.allocation.nodes == 4 and doc.allocation.estimated_gpu_hours() == (1.0, 1.5)
    assert rec.state == "succeeded" and rec.summary is not None and rec.summary.gpus == 16
    assert [c.run for c in rec.configurations] == [t["run"] for t in doc.allocation.turns]
    # written back through the writers, they read the same
    studydoc.write_study(tmp_path, doc)
    studydoc.write_allocation(tmp_path, rec)
    assert studydoc.read_study(tmp_path) == doc and studydoc.read_allocation(tmp_path) == rec
    study = listing.entries(good)[0]
    assert isinstance(study, listing.Study) and study.problems() == [] and study.in_one_allocation


def test_a_study_the_planner_writes_reads_back(tmp_path):
    """What prepare writes (the allocation's plan, its comparison, the choice) fits the
    record its readers read."""
    from launcher.control import prepare

    runs = prepare.prepare_all("local-sim", [], ["prefill.endpoints=1,2"], tmp_path / "runs",
                               allocation="one")
    doc = studydoc.read_study(runs[0].shared.path)
    assert doc is not None and doc.allocation is not None and doc.choice is not None
    assert [t["run"] for t in doc.allocation.turns] == [t.run for t in runs[0].shared.turns]
    assert set(studydoc.COMPARISON_TYPES) == set(doc.allocation.comparison)
    assert set(studydoc.CHOICE_TYPES) == set(doc.choice)


def test_the_turns_shape_is_the_planners():
    """study.json's turns are planning.study.Turn's JSON: the shape checked is its fields."""
    from launcher.planning.study import Turn

    assert set(studydoc.TURN_TYPES) == {f.name for f in dataclasses.fields(Turn)}
    # what the check lets through, Turn reads: only its run is required there
    assert Turn.from_json({k: d for k, d in [("run", "r")] if k in studydoc.TURN_REQUIRED}) \
        == Turn("r", (), (), (), ())


def test_an_allocation_record_is_written_as_before():
    """What is absent while a configuration runs, or for a start, stays absent."""
    rec = studydoc.AllocationRecord(state="running", started=1.0, configurations=[
        studydoc.ConfigurationRecord(run="r1", turn={"run": "r1"})], engines=[
        studydoc.EngineEvent.of({"event": "started", "endpoint": "decode-0", "run": "r1",
                                 "processes": ["decode-0@n1"], "ts": 2.0, "new": "dropped"})])
    d = rec.to_json()
    assert d["configurations"] == [{"run": "r1", "turn": {"run": "r1"}}]
    assert d["engines"] == [{"event": "started", "endpoint": "decode-0", "run": "r1",
                             "ts": 2.0, "processes": ["decode-0@n1"]}]
    assert "lost_nodes" not in d and "summary" not in d and d["ended"] is None
    assert studydoc.AllocationRecord.from_json(json.loads(json.dumps(d))) == rec


@pytest.mark.parametrize("damaged", list(CASES), indirect=True)
def test_each_damage_is_one_sentence_naming_the_file_and_the_field(damaged, request):
    root, study, name, said = damaged
    _, _, field = CASES[request.node.callspec.params["damaged"]]
    assert said.startswith(f"{study.name}/{name} is damaged (") and field in said, said
    assert "\n" not in said and said.count("(") >= 1
    assert issubclass(StudyFileError, UserError)  # the CLI says it and exits 2
    (entry,) = listing.entries(root)
    assert said in entry.problems()


def test_a_study_json_that_cannot_be_read_says_so(good, tmp_path):
    study = Path(shutil.copytree(good, tmp_path / good.name))
    (study / STUDY).unlink()
    (study / STUDY).mkdir()  # a directory where the file should be
    with pytest.raises(StudyFileError, match=rf"^{re.escape(study.name)}/study.json cannot "
                                             r"be read \("):
        studydoc.read_study(study)


# --- the CLI ----------------------------------------------------------------------------------


def _one_sentence(rc: int, out: str, err: str, said: str) -> None:
    assert rc == 2 and out == "" and err == err.strip() + "\n", (rc, out, err)
    assert err.startswith("error: ") and said in err, (said, err)


@pytest.mark.parametrize("damaged", SHOWN, indirect=True)
def test_every_cli_reader_says_the_sentence(damaged):
    root, study, name, said = damaged
    first = sorted(p.name for p in study.iterdir() if (p / "plan.json").is_file())[0]
    seen = {}
    for args in (("runs",), ("status", study.name), ("status", first), ("logs", study.name),
                 ("report", study), ("cancel", study.name), ("run", study)):
        rc, out, err = _main(*args, *(["--runs-dir", root] if args[0] != "run" else []))
        assert "Traceback" not in out + err, (args, out, err)
        seen[args[0] if args[0] != "status" else f"status {args[1]}"] = rc, out, err
    # the listing shows the study, its runs and the sentence
    rc, out, err = seen["runs"]
    line = next(ln for ln in out.splitlines() if ln.startswith(f"{study.name}/"))
    assert rc == 0 and line.endswith(f"; {said})") and out.count("synthetic-study-p") >= 3, out
    rc, out, err = seen[f"status {study.name}"]
    assert rc == 0 and said in out and out.splitlines()[-1].startswith("next: "), out
    rc, out, err = seen[f"status {first}"]
    assert rc == 0 and f"warning: {said}: left out" in out, out
    rc, out, err = seen["logs"]
    assert rc == 0 and out.startswith(f"warning: {said}\n"), out
    rc, out, err = seen["report"]
    page = html.unescape(Path(out.strip()).read_text())
    assert rc == 0 and f"{said}: left out" in page, out
    if name == STUDY:  # one allocation or one job each is not known: nothing is touched
        _one_sentence(*seen["cancel"], said)
        assert "how study" in seen["cancel"][2] and "nothing was cancelled" in seen["cancel"][2]
        _one_sentence(*seen["run"], said)
        assert not any(p.name == "cancel.json" for p in study.rglob("cancel.json"))
    else:
        rc, out, err = seen["cancel"]
        assert rc == 0 and out.startswith(f"warning: {said}\n") and "nothing to cancel" in out
        rc, out, err = seen["run"]  # a study is run once: its record is there, damaged or not
        assert rc == 2 and "already holds an attempt (allocation.json)" in err, err


def test_a_live_study_whose_record_is_damaged_is_not_signalled_blindly(good, tmp_path):
    """cancel STUDY without a Slurm job finds its process in allocation.json: damaged, it
    says so in one sentence and signals nothing (the configurations are marked)."""
    from launcher.run.rundir import RunDir

    root = tmp_path / "runs"
    study = Path(shutil.copytree(good, root / good.name))
    for p in study.iterdir():
        if (p / "run.json").is_file():
            (p / "run.json").unlink()  # planned: not ended
            sub = RunDir(p).read_submission()
            sub.slurm_job_id = None
            RunDir(p).write_submission(sub)
    (study / ALLOCATION).write_text('{"state": "running"}')
    rc, out, err = _main("cancel", study.name, "--runs-dir", root)
    said = f"{study.name}/allocation.json is damaged (started is missing)"
    assert rc == 2 and err.startswith(f"error: {said}: which process runs its allocation is "
                                       "not known, so none was signalled; 3 configuration(s) "
                                       "marked cancelled"), (rc, out, err)
    assert "Traceback" not in out + err and len(err.strip().splitlines()) == 1


# --- the dashboard ----------------------------------------------------------------------------



def _pages(root: Path, monkeypatch, pages: list[str], **params: str):
    """Each page in turn, as a user clicks through them: (page, its AppTest) each."""
    pytest.importorskip("streamlit")
    at = open_app(root, monkeypatch, **params)
    for page in pages:
        at.switch_page(page).run()
        yield page, at


def _errors_say(at, page: str, said: str) -> None:
    assert not at.exception, (page, [e.value for e in at.exception])
    errors = [str(e.value) for e in at.error]
    # a page body that raised is caught and said (ui.guarded): none may here
    assert not [e for e in errors if "could not be drawn" in e], (page, errors)
    assert any(said in e for e in errors), (page, said, errors)


@pytest.mark.parametrize("damaged", SHOWN, indirect=True)
def test_the_study_pages_show_the_sentence(damaged, monkeypatch):
    root, study, name, said = damaged
    first = sorted(p.name for p in study.iterdir() if (p / "plan.json").is_file())[0]
    for page, at in _pages(root, monkeypatch, ["app_pages/runs.py", "app_pages/study.py",
                                               "app_pages/overview.py"],
                           run=first, study=study.name):
        _errors_say(at, page, said)
        if page.endswith("study.py"):  # the study is still shown, from its runs
            assert at.get("vega_lite_chart") or at.get("arrow_vega_lite_chart"), page


@pytest.mark.parametrize("damaged", ["study-turn-shape", "alloc-wrong-type"], indirect=True)
def test_every_page_of_a_run_in_the_study_shows_it(damaged, monkeypatch):
    from dashboard import ui

    root, study, name, said = damaged
    first = sorted(p.name for p in study.iterdir() if (p / "plan.json").is_file())[0]
    pages = [p for p, *_ in ui.PAGES]
    for page, at in _pages(root, monkeypatch, pages, run=first, study=study.name):
        _errors_say(at, page, said)


# --- one way to read them -----------------------------------------------------------------------


def test_the_study_files_are_read_only_through_launcher_run():
    """Outside launcher/run, nothing opens study.json or allocation.json itself: every
    reader goes through launcher.run.studydoc (through listing.Study)."""
    repo = Path(__file__).resolve().parents[1]
    pattern = re.compile(r"""(read_json|read_text|json\.loads?|open)\([^)]*"""
                         r"""(\bSTUDY\b|\bALLOCATION\b|study\.json|allocation\.json)""")
    found = []
    for f in [*repo.glob("launcher/**/*.py"), *repo.glob("dashboard/**/*.py")]:
        if f.parent.name == "run" and f.parent.parent.name == "launcher":
            continue
        found += [f"{f.relative_to(repo)}:{i}" for i, line in
                  enumerate(f.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found
    names = [f"{f.relative_to(repo)}: {ln}" for f in repo.glob("launcher/**/*.py")
             for ln in f.read_text().splitlines()
             if re.match(r'^\w+ = "(study|allocation)\.json"', ln)]
    assert len(names) == 2 and all(n.startswith("launcher/run/rundir.py: ") for n in names), \
        names  # the name table holds both, once
