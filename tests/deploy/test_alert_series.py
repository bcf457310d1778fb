"""The scrape-to-series converter: each kind of number moves as its state lasting would."""

from __future__ import annotations

import pytest

from tests.support.alert_series import Timeline, expected_alert, input_series, seconds

SCRAPE = """\
# HELP gateway_takeovers_total Lane operations this process resumed after a crash.
# TYPE gateway_takeovers_total counter
gateway_takeovers_total 2.0
# HELP gateway_takeovers_created Lane operations this process resumed after a crash.
# TYPE gateway_takeovers_created gauge
gateway_takeovers_created 1.7e+09
# HELP gateway_stuck_lanes Lanes interrupted too often.
# TYPE gateway_stuck_lanes gauge
gateway_stuck_lanes 1.0
# HELP gateway_inbox_oldest_age_seconds Age of the oldest inbox item waiting.
# TYPE gateway_inbox_oldest_age_seconds gauge
gateway_inbox_oldest_age_seconds 1.5
# HELP gateway_outbox_oldest_age_seconds Age of the oldest due delivery pending.
# TYPE gateway_outbox_oldest_age_seconds gauge
gateway_outbox_oldest_age_seconds 0.0
# HELP gateway_dead_letters Dead letters kept in the outbox.
# TYPE gateway_dead_letters gauge
gateway_dead_letters 3.0
# HELP gateway_mcp_server_up 1 while the MCP server is connected.
# TYPE gateway_mcp_server_up gauge
gateway_mcp_server_up{server="a \\"quoted\\" one"} 0.0
"""

TARGET = {"job": "gw", "instance": "h:1"}


def _series(timeline: Timeline) -> dict[str, str]:
    return {s["series"]: s["values"] for s in input_series(SCRAPE, timeline, target=TARGET)}


def test_each_kind_of_number_lasts_its_own_way() -> None:
    assert _series(Timeline(steps=10)) == {
        'gateway_takeovers_total{instance="h:1",job="gw"}': "0 2.0+0x9",  # once, after start
        'gateway_stuck_lanes{instance="h:1",job="gw"}': "1.0+0x10",  # holds
        'gateway_inbox_oldest_age_seconds{instance="h:1",job="gw"}': "1.5+60x10",  # keeps waiting
        'gateway_outbox_oldest_age_seconds{instance="h:1",job="gw"}': "0.0+0x10",  # none waits
        'gateway_dead_letters{instance="h:1",job="gw"}': "0 3.0+0x9",  # piled up once
        'gateway_mcp_server_up{instance="h:1",job="gw",server="a \\"quoted\\" one"}': "0.0+0x10",
    }  # and no `_created` series


def test_recurring_counts_come_again_at_their_pace() -> None:
    series = _series(Timeline(steps=10, interval_s=30, repeat_every_s=120))
    assert series['gateway_takeovers_total{instance="h:1",job="gw"}'] == "0+0.5x10"
    assert series['gateway_dead_letters{instance="h:1",job="gw"}'] == "0+0.75x10"
    assert series['gateway_stuck_lanes{instance="h:1",job="gw"}'] == "1.0+0x10"
    assert series['gateway_inbox_oldest_age_seconds{instance="h:1",job="gw"}'] == "1.5+30x10"


def test_an_expected_alert_renders_its_label_templates() -> None:
    rule = {
        "alert": "Down",
        "labels": {"severity": "warning"},
        "annotations": {"summary": "{{ $labels.server }} on {{$labels.instance}} is down"},
    }
    assert expected_alert(rule, {"server": "demo", "instance": "h:1"}) == {
        "exp_labels": {"server": "demo", "instance": "h:1", "severity": "warning"},
        "exp_annotations": {"summary": "demo on h:1 is down"},
    }


@pytest.mark.parametrize(("text", "count"), [("3m", 180), ("1h10m", 4200), ("24h15m", 87300)])
def test_durations_are_read_as_prometheus_writes_them(text: str, count: int) -> None:
    assert seconds(text) == count


def test_a_duration_it_cannot_read_is_refused() -> None:
    with pytest.raises(ValueError, match="not a duration"):
        seconds("1h 10m")
