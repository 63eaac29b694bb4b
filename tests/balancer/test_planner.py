"""The planner on synthetic load: each goal, the cool-down, the move bound and drain."""

import pytest

from automq.broker.balancer.model import ACTIVE, DRAINING, FENCED, NOT_READY, BrokerMeta, LoadModel, PartitionLoad
from automq.broker.balancer.planner import COUNTS, EVACUATE, NETWORK, RACKS, Goals, GoalsError, drain, plan

KB = 1024.0
MB = 1024 * KB


def model(parts, brokers=(1, 2, 3), states=None, racks=None):
    metas = {b: BrokerMeta(b, (racks or {}).get(b), (states or {}).get(b, ACTIVE)) for b in brokers}
    return LoadModel.from_partitions(metas, [PartitionLoad(t, i, leader, bi, bo) for t, i, leader, bi, bo in parts])


def placed(m, proposal):
    where = {k: p.leader for k, p in m.partitions.items()}
    for mv in proposal.moves:
        assert where[mv.key] == mv.source
        where[mv.key] = mv.target
    return where


def test_skewed_bytes_in_is_balanced_within_tolerance():
    # 6 equal hot partitions all on broker 1
    m = model([("hot", i, 1, 1 * MB, 2 * MB) for i in range(6)])
    p = plan(m, Goals(max_moves=10))
    assert {mv.goal for mv in p.moves} == {NETWORK}
    assert all(mv.source == 1 for mv in p.moves)
    assert len(p.moves) == 4
    for t in p.after.values():
        assert t.bytes_in == pytest.approx(2 * MB) and t.partitions == 2
    assert p.imbalance_before["bytes_in_percent"] == pytest.approx(200.0)
    assert p.imbalance_after["bytes_in_percent"] == 0.0


def test_balanced_cluster_gets_no_moves():
    m = model([("t", i, 1 + i % 3, 100 * KB + i * KB, 100 * KB) for i in range(9)])
    p = plan(m)
    assert p.moves == ()


def test_idle_noise_below_min_rate_is_not_imbalance():
    m = model([("t", 0, 1, 3 * KB, 0), ("t", 1, 2, 0, 0), ("t", 2, 3, 0, 0)])
    assert plan(m).moves == ()


def test_evacuates_draining_fenced_and_not_ready_brokers_even_in_cooldown():
    parts = [("t", i, 1 + i % 4, 10 * KB * (i + 1), 0) for i in range(8)]
    m = model(parts, brokers=(1, 2, 3, 4), states={2: DRAINING, 3: FENCED, 4: NOT_READY})
    p = plan(m, Goals(max_moves=100), last_moved={("t", i): 0.0 for i in range(8)}, now=1.0)
    where = placed(m, p)
    assert set(where.values()) == {1}
    assert {mv.goal for mv in p.moves} == {EVACUATE}
    assert p.imbalance_after[EVACUATE] == 0 and p.imbalance_before[EVACUATE] == 6


def test_excluded_broker_never_receives_and_is_emptied():
    m = model([("t", i, 1, 1 * MB, 0) for i in range(4)] + [("t", 9, 3, 1 * MB, 0)])
    p = plan(m, Goals(max_moves=10), exclude=[3])
    assert all(mv.target != 3 for mv in p.moves)
    assert placed(m, p)[("t", 9)] != 3


def test_cooldown_keeps_recently_moved_partitions_put():
    m = model([("hot", i, 1, 1 * MB, 0) for i in range(6)])
    recent = {("hot", i): 100.0 for i in range(5)}
    p = plan(m, Goals(cooldown_s=300), last_moved=recent, now=200.0)
    assert [mv.key for mv in p.moves] == [("hot", 5)]
    assert any(NETWORK in n for n in p.notes)
    p2 = plan(m, Goals(cooldown_s=300), last_moved=recent, now=400.0)
    assert len(p2.moves) == 4


def test_max_moves_bounds_a_proposal():
    m = model([("hot", i, 1, 1 * MB, 0) for i in range(30)])
    p = plan(m, Goals(max_moves=3))
    assert len(p.moves) == 3
    assert any("max moves" in n for n in p.notes)


def test_partition_counts_spread_without_hurting_network():
    # network balanced (all load on one partition per broker), counts 7/1/1
    parts = [("hot", 0, 1, 1 * MB, 0), ("hot", 1, 2, 1 * MB, 0), ("hot", 2, 3, 1 * MB, 0)]
    parts += [("cold", i, 1, 0, 0) for i in range(6)]
    m = model(parts)
    p = plan(m)
    assert {mv.goal for mv in p.moves} == {COUNTS}
    assert all(mv.key[0] == "cold" for mv in p.moves)
    assert sorted(t.partitions for t in p.after.values()) == [3, 3, 3]
    assert p.imbalance_after["bytes_in_percent"] == 0.0


def test_rack_spread_of_a_topic():
    # 4 brokers in 2 racks; topic "r" has all 4 partitions in rack a (one per... two brokers)
    racks = {1: "a", 2: "a", 3: "b", 4: "b"}
    parts = [("r", 0, 1, 0, 0), ("r", 1, 1, 0, 0), ("r", 2, 2, 0, 0), ("r", 3, 2, 0, 0)]
    parts += [("s", 0, 3, 0, 0), ("s", 1, 3, 0, 0), ("s", 2, 4, 0, 0), ("s", 3, 4, 0, 0)]
    m = model(parts, brokers=(1, 2, 3, 4), racks=racks)
    p = plan(m)
    where = placed(m, p)
    for topic in ("r", "s"):
        per_rack = {"a": 0, "b": 0}
        for (t, _), b in where.items():
            if t == topic:
                per_rack[racks[b]] += 1
        assert per_rack == {"a": 2, "b": 2}
    assert p.imbalance_before[RACKS] > 0 and p.imbalance_after[RACKS] == 0
    assert sorted(t.partitions for t in p.after.values()) == [2, 2, 2, 2]


def test_drain_moves_everything_off_spread_by_load():
    parts = [("t", i, 1, (i + 1) * 100 * KB, 0) for i in range(6)] + [("u", i, 2 + i % 2, 50 * KB, 0) for i in range(4)]
    m = model(parts)
    p = drain(m, [1])
    where = placed(m, p)
    assert 1 not in where.values()
    assert len(p.moves) == 6 and {mv.goal for mv in p.moves} == {EVACUATE}
    b2, b3 = p.after[2].bytes_in, p.after[3].bytes_in
    assert abs(b2 - b3) <= 600 * KB  # the largest partition bounds the difference
    assert p.after[1].partitions == 0


def test_drain_with_no_eligible_broker_says_so():
    m = model([("t", 0, 1, 0, 0)], brokers=(1,))
    p = drain(m, [1])
    assert p.moves == () and "no eligible broker" in p.notes[0]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"tolerance_percent": 0}, "tolerancePercent"), ({"max_moves": -1}, "maxMoves"), ({"cooldown_s": -5}, "cooldown")],
)
def test_goals_out_of_range_name_the_field(kwargs, field):
    with pytest.raises(GoalsError, match=field):
        Goals(**kwargs)


def test_proposal_serialises_to_json():
    import json

    m = model([("hot", i, 1, 1 * MB, 0) for i in range(3)])
    data = json.loads(json.dumps(plan(m).to_dict()))
    assert data["moves"][0]["source"] == 1 and set(data["before"]) == {"1", "2", "3"}
