"""A new engine kind is one entry in launcher/run/engines.py: the plan, the render, the cost
estimate and the way runs are shown take its answers without a change elsewhere."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.run import engines


@pytest.fixture
def new_kind(monkeypatch):
    """`engine: vllm` answered by a kind that is not one of the shipped three: vLLM for CPU's
    needs, its own cost table and marks."""
    kind = dataclasses.replace(
        engines.VLLM_CPU, label="Other engine", tag="OTHER", status_note=" [other]",
        costs=engines.Costs(preflight_s=123.0, client_s=4.0, teardown_s=7.0,
                            gsm8k_answer_tokens=50, speed=engines.SPEED_CPU, published=False))
    real = engines.of
    monkeypatch.setattr(engines, "of", lambda e, p=None: kind if e == "vllm" else real(e, p))
    return kind


def _plan(sets=()):
    from launcher.planning import plan as plan_mod
    from launcher.schema import cluster as cluster_mod
    from launcher.schema import recipe

    r = recipe.load(str(recipe.shipped()["local-vllm-cpu-agg"]), list(sets))
    c = cluster_mod.load(r.cluster)
    return plan_mod.make_plan(r, c, cluster_mod.profile_nodes(c, plan_mod.nodes_needed(r, c)))


def test_the_cost_estimate_reads_the_kinds_cost_table(new_kind):
    from launcher.planning import cost

    p = _plan()
    assert p.recipe.engine_kind is new_kind
    c = cost.estimate(p)
    phases = dict(c.phases)
    assert phases["preflight"] == 123.0 and phases["teardown"] == 7.0
    assert all(pt.source == cost.ASSUMED_CPU for pt in c.points)
    # a point is the kind's client time plus its requests by the CPU model
    first = c.points[0]
    n = p.recipe.benchmark.lengths()
    assert first.seconds == pytest.approx(
        4.0 + cost.cpu_batch_s(first.requests, first.concurrency, n.mean_output))


def test_each_speed_and_load_model_a_kind_names_exists():
    from launcher.planning import cost

    for kind in (engines.VLLM_GPU, engines.VLLM_CPU, engines.SIM, engines.of("other")):
        assert kind.costs.speed in cost.SPEEDS and kind.costs.load in cost.LOADS, kind.label


def test_a_plan_doc_and_the_status_line_show_the_kinds_marks(new_kind, tmp_path):
    from launcher.planning import render

    doc = render.plan_doc(_plan().at(str(tmp_path)), "r1", placeholder_nodes=False)
    assert doc.engine_kind is new_kind and doc.engine_label == "Other engine"
    assert doc.engine_kind.shown_as == "Other engine"  # no list name of its own
    assert engines.SIM.shown_as == "sim" and engines.VLLM_GPU.shown_as == "vLLM"


def test_a_stand_in_reports_its_own_version_and_nothing_to_check():
    from launcher.control import nodecheck

    assert nodecheck.engine_build("sim") == {"engine_version": "simulator",
                                            "engine_commit": None, "engine_platform": None}
    assert engines.SIM.expected_version("0.33") is None
    assert engines.VLLM_GPU.expected_version("0.33") == "0.33"


def test_the_fingerprints_packages_are_every_distributions_name_and_version(tmp_path):
    """nodecheck reads each package's headers only; what it lists is what importlib's full
    parse gives, for every installed distribution, and for one whose long description holds
    a line that looks like a header."""
    from importlib import metadata

    from launcher.control import nodecheck

    want = {}
    for d in metadata.distributions():
        if name := (d.metadata.get("Name") or "").lower():
            want[name] = d.version
    assert nodecheck.packages() == dict(sorted(want.items())) and len(want) > 20
    info = tmp_path / "odd_pkg-1.2.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\r\nName: Odd-Pkg\r\nVersion: 1.2.3\r\n"
                                   "\r\nVersion: 9.9.9\r\nName: not-this\r\n")
    import sys

    sys.path.insert(0, str(tmp_path))
    try:
        found = nodecheck.packages()
    finally:
        sys.path.remove(str(tmp_path))
    assert found["odd-pkg"] == "1.2.3" and "not-this" not in found
