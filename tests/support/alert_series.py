"""A scrape of a gateway's ``/metrics`` as `promtool test rules` input: that state, lasting.

A test puts a real gateway in a state (a dead letter, a stuck lane...), scrapes it once, and
asks whether the alerting rules of ``deploy/alerts.yml`` fire if the state lasts. A scrape is
one instant; the rules look at time (``for:``, rates, windows). `input_series` turns every
sample into a series that starts when the scraped process started and holds the state from
then on, by what each kind of number does while a state lasts:

* a gauge holds its scraped value (a stuck lane stays stuck);
* an age (`AGES`: how long the oldest item has waited) grows by one second a second from its
  scraped value, since the item keeps waiting; 0 means nothing waits, and stays 0;
* a counter (and a histogram's buckets, count and sum) started at 0 with the process: with
  ``repeat_every_s`` unset, what it counted happened once, at the first step after the start;
  set, the same counts recur at that pace (a channel that keeps refusing, a process that keeps
  crashing), spread evenly over the steps. `ACCUMULATING` gauges (dead letters: nothing removes
  them but an operator) follow the counters' rule.

Each series gets the target labels Prometheus adds to a scrape (`TARGET`: ``job``,
``instance``). `promtool_test` writes the test files (JSON, which YAML reads) and runs
``promtool test rules``; `expected_alert` renders an alert's labels and annotations from the
rule file, for ``exp_alerts``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "ACCUMULATING",
    "AGES",
    "TARGET",
    "AlertCheck",
    "Timeline",
    "alert_rules",
    "expected_alert",
    "input_series",
    "promtool_test",
    "seconds",
]

TARGET: Mapping[str, str] = {"job": "gateway", "instance": "gateway-1:8787"}
"""The labels a Prometheus scrape of one replica adds (`job` from the config, the address)."""

AGES = frozenset(
    {
        "gateway_inbox_oldest_age_seconds",
        "gateway_outbox_oldest_age_seconds",
        "gateway_approval_oldest_wait_seconds",
    }
)
"""Gauges that measure how long the oldest waiting item has waited (0: none waits)."""

ACCUMULATING = frozenset({"gateway_dead_letters"})
"""Gauges that only an operator makes smaller: a lasting state piles them up like a counter."""

_CUMULATIVE = frozenset({"counter", "histogram", "summary"})
_TEMPLATE = re.compile(r"\{\{\s*\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """How long the state is followed, at what resolution, and whether its counts recur."""

    steps: int
    """Samples after the first (the process's start)."""
    interval_s: int = 60
    """Seconds between two samples (a common scrape interval)."""
    repeat_every_s: int | None = None
    """The scraped counts recur every this many seconds; None: they happened once."""

    @property
    def interval(self) -> str:
        return f"{self.interval_s}s"


@dataclass(frozen=True, kw_only=True)
class AlertCheck:
    """One ``alert_rule_test``: at `eval_time`, `alert` fires with exactly `expected` (or none)."""

    alert: str
    eval_time: str
    expected: tuple[Mapping[str, Any], ...] = ()


def _number(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _selector(name: str, labels: Mapping[str, str]) -> str:
    def quoted(value: str) -> str:
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'

    inner = ",".join(f"{key}={quoted(value)}" for key, value in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def _values(kind: str, name: str, value: float, timeline: Timeline) -> str:
    """The series notation of one sample over the timeline (``a+bxn``: a, a+b, ..., a+nb)."""
    steps = timeline.steps
    if kind in _CUMULATIVE or name in ACCUMULATING:
        if timeline.repeat_every_s is None:
            return f"0 {_number(value)}+0x{steps - 1}"  # happened once, just after the start
        per_step = value * timeline.interval_s / timeline.repeat_every_s
        return f"0+{_number(per_step)}x{steps}"
    if name in AGES and value > 0:
        return f"{_number(value)}+{timeline.interval_s}x{steps}"
    return f"{_number(value)}+0x{steps}"


def input_series(
    scrape: str, timeline: Timeline, *, target: Mapping[str, str] = TARGET
) -> list[dict[str, str]]:
    """Every sample of `scrape` (Prometheus text) as an ``input_series`` entry over `timeline`.

    ``_created`` samples (a counter's creation time, which Prometheus stores as a gauge of its
    own) are left out: no rule reads them and they are not part of the state.
    """
    series: list[dict[str, str]] = []
    for family in text_string_to_metric_families(scrape):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = {**sample.labels, **target}
            series.append(
                {
                    "series": _selector(sample.name, labels),
                    "values": _values(family.type, sample.name, sample.value, timeline),
                }
            )
    return series


def alert_rules(rule_file: Path) -> dict[str, dict[str, Any]]:
    """The alerting rules of a Prometheus rule file, by alert name."""
    loaded = yaml.safe_load(rule_file.read_text(encoding="utf-8"))
    return {
        rule["alert"]: rule
        for group in loaded["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def expected_alert(rule: Mapping[str, Any], labels: Mapping[str, str]) -> dict[str, Any]:
    """``exp_alerts`` entry of `rule` firing on a series with `labels` (the rule's own added).

    The annotations are rendered here: the rule file's templates use only
    ``{{ $labels.<name> }}`` (a test of the rule file holds it to that).
    """
    every = {**labels, **rule.get("labels", {})}

    def render(text: str) -> str:
        return _TEMPLATE.sub(lambda m: every[m.group(1)], text)

    return {
        "exp_labels": every,
        "exp_annotations": {k: render(v) for k, v in rule.get("annotations", {}).items()},
    }


_DURATION = re.compile(r"(\d+)([smhd])")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
LONG_S = 3 * 3600
"""Checks evaluated later than this run at a coarser `evaluation_interval` (10 m, not 1 m): a
day of rule evaluations every minute costs promtool seconds, and the checks that late (an
approval waiting a day) hold for hours anyway."""


def seconds(duration: str) -> int:
    """A Prometheus duration (``24h15m``) in seconds."""
    parts = _DURATION.findall(duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a duration like 24h15m: {duration!r}")
    return sum(int(n) * _UNIT_S[u] for n, u in parts)


def promtool_test(
    rule_file: Path,
    series: list[dict[str, str]],
    checks: Iterable[AlertCheck],
    timeline: Timeline,
    directory: Path,
    name: str = "state",
) -> list[subprocess.CompletedProcess[str]]:
    """Run ``promtool test rules`` on `series` with `checks`: the finished processes.

    The rules are evaluated every minute, the checks past `LONG_S` every 10 minutes (a second
    test file). The files are written to `directory` (kept: a failing test's files can be run
    again by hand).
    """
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is missing (apt-get install -y prometheus)"
    late = [c for c in checks if seconds(c.eval_time) > LONG_S]
    early = [c for c in checks if seconds(c.eval_time) <= LONG_S]
    assert timeline.interval_s * timeline.steps >= max(
        (seconds(c.eval_time) for c in (*early, *late)), default=0
    ), "the series end before a check"
    finished: list[subprocess.CompletedProcess[str]] = []
    for part, group, every in ((name, early, "1m"), (f"{name}-late", late, "10m")):
        if not group:
            continue
        test = {
            "rule_files": [str(rule_file.resolve())],
            "evaluation_interval": every,
            "tests": [
                {
                    "name": part,
                    "interval": timeline.interval,
                    "input_series": series,
                    "alert_rule_test": [
                        {
                            "eval_time": check.eval_time,
                            "alertname": check.alert,
                            "exp_alerts": list(check.expected),
                        }
                        for check in group
                    ],
                }
            ],
        }
        path = directory / f"{part}.promtool-test.json"
        path.write_text(json.dumps(test, indent=1), encoding="utf-8")
        finished.append(
            subprocess.run(
                [promtool, "test", "rules", str(path)],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
        )
    return finished
