"""The charts the docs show are drawn by the commands the docs show (scripts/render_charts.py): a chart whose
data (points, labels, marks) differs from what its command draws today is stale, like a stale console block."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("matplotlib")


def _render_charts():
    spec = importlib.util.spec_from_file_location("render_charts", REPO / "scripts" / "render_charts.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["render_charts"] = module
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_every_documented_chart_is_drawn_by_its_command_today() -> None:
    rc = _render_charts()
    charts = rc.documented_charts()
    assert {c.png for c in charts} == {"docs/compare_pareto.png", "docs/memory_step.png"}
    for chart in charts:
        assert rc.stale(chart) is None

