"""Pipeline bubble closed forms (Narayanan et al. 2021, section 2.2) and the step's pipeline time."""
from __future__ import annotations

import pytest

from orchestrator.estimate.pipeline import bubble_fraction, bubble_ratio, pipeline_time_s


@pytest.mark.parametrize("p,m", [(1, 8), (4, 8), (8, 64), (64, 512)])
def test_1f1b_bubble(p, m):
    assert bubble_fraction(p, m) == pytest.approx((p - 1) / (m + p - 1))
    if p > 1:
        assert bubble_ratio(p, m) == pytest.approx((p - 1) / m)


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (8, 64, 4), (64, 512, 2)])
def test_interleaved_bubble_divided_by_v(p, m, v):
    assert bubble_fraction(p, m, v) == pytest.approx((p - 1) / (v * m + p - 1))
    assert bubble_ratio(p, m, v) == pytest.approx(bubble_ratio(p, m) / v)


def test_pipeline_time_equal_stages_matches_bubble_fraction():
    p, m, v, t = 8, 32, 2, 0.1
    total = pipeline_time_s(num_microbatches=m, pp=p, vpp=v, slowest_stage_s=t, mean_stage_s=t)
    assert total == pytest.approx((m + (p - 1) / v) * t)
    idle = 1 - m * t / total
    assert idle == pytest.approx(bubble_fraction(p, m, v))


def test_slowest_stage_sets_the_pace():
    fast = pipeline_time_s(num_microbatches=16, pp=4, vpp=1, slowest_stage_s=1.0, mean_stage_s=1.0)
    slow = pipeline_time_s(num_microbatches=16, pp=4, vpp=1, slowest_stage_s=1.2, mean_stage_s=1.05)
    assert slow == pytest.approx(16 * 1.2 + 3 * 1.05)
    assert slow > fast
