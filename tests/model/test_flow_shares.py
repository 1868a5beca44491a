"""Flow telemetry (DESIGN §7a): the pipeline's apportionment and per-share lateness against the reference model."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.model.reference import HOUR, apportion_flow, late_shares
from traffic.core.periods import apportion_to_panes, from_micros, late_mask

FLOWS = st.lists(st.tuples(st.integers(0, 4 * HOUR), st.integers(0, 3 * HOUR), st.integers(0, 10**9)),
                 min_size=1, max_size=12)


def test_the_model_apportions_by_hand():
    five = 5 * 60 * 1_000_000
    assert apportion_flow(0, 2 * five, 7) == [(0, 4), (five, 3)]  # 3.5 each: the earlier pane rounds up
    assert apportion_flow(10, 10, 9) == [(10, 9)]
    assert late_shares(0, 2 * five, 7, HOUR) == (0, 7) and late_shares(0, 2 * five, 7, None) == (7, 0)


@settings(max_examples=300, deadline=None)
@given(FLOWS, st.one_of(st.none(), st.integers(0, 8).map(lambda h: h * HOUR)))
def test_flow_shares_and_their_lateness_match_the_model(flows, watermark):
    """Each flow's shares equal the model's, so they add up to it; which shares are late (their hour
    closed by the watermark before the batch) equals the model's, share by share."""
    base = 1_793_000_000 * 1_000_000 // HOUR * HOUR  # an hour in 2026
    start = np.array([base + s for s, _, _ in flows])
    end = start + np.array([length for _, length, _ in flows])
    flow, ts, (shares,) = apportion_to_panes(start, end, [np.array([a for _, _, a in flows])])
    late = late_mask(ts, from_micros(base + watermark) if watermark is not None else None)
    for i, (s, length, amount) in enumerate(flows):
        mine = np.flatnonzero(flow == i)
        assert list(zip(ts[mine].tolist(), shares[mine].tolist())) == apportion_flow(base + s, base + s + length, amount)
        got = (int(shares[mine][~late[mine]].sum()), int(shares[mine][late[mine]].sum()))
        assert got == late_shares(base + s, base + s + length, amount,
                                  base + watermark if watermark is not None else None)
