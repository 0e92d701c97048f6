"""Plan search: placeholder until the search issue lands."""

from __future__ import annotations

from typing import Any

from planner.errors import PlanError


def search_cli(base: dict[str, Any], **_: Any) -> Any:
    raise PlanError("--depth", "no model given", "give --depth N or --preset NAME")
