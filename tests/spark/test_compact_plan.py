"""Compaction planning without Spark: how contiguous small objects are grouped into runs, and
how the per-job object budget cuts them."""

from __future__ import annotations

from automq.broker.storage.metadata import ObjectMetadata, ObjectType
from automq.spark.compact import CompactionSettings, Source, _runs


def _sources(count: int, size: int = 1000) -> list[tuple[Source, ObjectMetadata | None]]:
    out: list[tuple[Source, ObjectMetadata | None]] = []
    for i in range(count):
        src = Source(i, size, i * 10, (i + 1) * 10, size, stream_set=True)
        out.append((src, ObjectMetadata(i, size, ObjectType.STREAM_SET, (), committed_at_ms=0)))
    return out


def test_a_backlog_longer_than_the_budget_is_cut_not_skipped():
    # 576 small objects of one stream, a 500-object budget: the job takes the first 500
    # (a run skipped for being too long left such a backlog uncompacted for ever)
    budget = [500]
    runs = _runs(_sources(576), CompactionSettings(min_age_ms=0), now_ms=1, budget=budget)
    assert [len(r) for r in runs] == [500]
    assert [s.object_id for s in runs[0]] == list(range(500))
    assert budget == [0]


def test_runs_split_at_target_bytes_and_at_a_gap_and_share_the_budget():
    sources = _sources(10, size=100)
    sources[6] = (sources[6][0], None)  # not a candidate (too young, say): the run ends there
    budget = [7]
    runs = _runs(sources, CompactionSettings(min_age_ms=0, target_bytes=300), now_ms=1, budget=budget)
    # [0,1,2] (300 bytes), [3,4,5], then [7,8,9] cut to the one object left: not worth a rewrite
    assert [[s.object_id for s in r] for r in runs] == [[0, 1, 2], [3, 4, 5]]
    assert budget == [1]


def test_an_exhausted_budget_plans_nothing_more():
    budget = [0]
    assert _runs(_sources(5), CompactionSettings(min_age_ms=0), now_ms=1, budget=budget) == []
    assert budget == [0]
