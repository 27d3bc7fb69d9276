"""The KV cache page's inputs (issue 41 item 6): every shipped recipe, simulated ones
included, plans a KV-capacity estimate for its decode endpoints (so the page can set the
prediction against what vLLM allocated), and the prompt tokens by source are drawn per role
(a prefill's computed tokens and a decode's received ones are the same prompts: stacked
together they would count them twice)."""

from __future__ import annotations

from pathlib import Path

import pytest
import synth

from launcher.analysis import derive, load
from launcher.planning import capacity, plan
from launcher.run.vocab import Role
from launcher.schema import cluster, recipe

REPO = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.stem for p in (REPO / "launcher" / "recipes").glob("*.yaml"))


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_recipe_plans_a_kv_capacity_estimate(name):
    r = recipe.load(name, [])
    c = cluster.load(r.cluster)
    p = plan.make_plan(r, c, cluster.profile_nodes(c, plan.nodes_needed(r, c)))
    caps = capacity.estimates(p)
    assert capacity.missing(p, caps) is None
    want = {ep.name for ep in p.endpoints if ep.role in (Role.DECODE, Role.AGG)}
    assert {cap.name for cap in caps} == want
    for cap in caps:
        assert cap.endpoint_at_mean_length >= 1, cap


def test_prompt_tokens_by_source_are_per_role(tmp_path):
    run = synth.healthy(tmp_path)
    p = load.read_plan_safe(run)[0]
    ss = derive.SeriesSet(load.read_telemetry(run, names=load.KV_NAMES), p)
    t0, t1 = ss.t_range
    data = derive.kv_page_data(ss, t0, t1, p.telemetry_interval_s)
    by_role = data["sources"]
    assert set(by_role) <= {"prefill", "decode"} and by_role
    for frame in by_role.values():
        assert not frame.empty and frame["value"].notna().all()
        assert not frame["group"].str.contains("·").any()  # one role: its sources alone
