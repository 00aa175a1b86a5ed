"""The gateway's update plan, read strictly, and the names shared with the publisher.

The plan (``GET /v2/ota/plan``) is the one *unsigned* input of an update
check: it only says which models to look at now. Everything it could be used
to force (a version to install, a version to leave) is decided by the signed
metadata, so here the plan is only held to its shape and size: a body of at
most :data:`MAX_PLAN_BYTES`, an object whose ``models`` is a list of objects,
each with a model name (:mod:`edge_core.names`) and an integer version >= 1.
A plan that is anything else is refused whole, as a gateway fault.

This module is pure: no I/O.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edge_core.errors import DownloadError
from edge_core.names import MAX_VERSION, MODEL_NAME_RULE, is_model_name

__all__ = [
    "MAX_PLAN_BYTES",
    "PlanEntry",
    "key_target",
    "parse_plan",
    "payload_target",
]

MAX_PLAN_BYTES = 64 * 1024


def payload_target(name: str, version: int) -> str:
    """The TUF target path of a model version's blob."""
    return f"models/{name}/{version}/payload"


def key_target(group: str, name: str, version: int) -> str:
    """The TUF target path of a model version's data key, wrapped for ``group``."""
    return f"keys/{group}/{name}/{version}.json"


@dataclass(frozen=True)
class PlanEntry:
    """One model of the plan.

    ``withdrawn``: the gateway aborted the rollout of ``version`` (a hint to
    look at the signed metadata now; only a signed withdrawal moves a device).
    """

    name: str
    version: int
    withdrawn: bool = False


def _entry(index: int, item: Any) -> PlanEntry:
    where = f"the update plan: models[{index}]"
    if not isinstance(item, dict):
        raise DownloadError(f"{where}: expected an object, got {type(item).__name__}")
    name, version, withdrawn = item.get("name"), item.get("version"), item.get("withdrawn", False)
    if not is_model_name(name):
        raise DownloadError(
            f"{where}.name: expected a model name ({MODEL_NAME_RULE}), got {name!r:.80}"
        )
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= MAX_VERSION:
        raise DownloadError(f"{where}.version: expected an integer >= 1, got {version!r:.40}")
    if not isinstance(withdrawn, bool):
        raise DownloadError(f"{where}.withdrawn: expected true or false, got {withdrawn!r:.40}")
    return PlanEntry(name, version, withdrawn)


def parse_plan(body: bytes) -> list[PlanEntry]:
    """The entries of a plan body (already cut at :data:`MAX_PLAN_BYTES` by the caller).

    Raises:
        DownloadError: the body is too long, not JSON, or not a plan's shape.
    """
    if len(body) > MAX_PLAN_BYTES:
        raise DownloadError(f"the update plan is over {MAX_PLAN_BYTES} bytes; refused")
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise DownloadError(f"the update plan is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise DownloadError("the update plan: expected an object with 'models'")
    models = document.get("models", [])
    if not isinstance(models, list):
        raise DownloadError(
            f"the update plan: 'models' must be a list, got {type(models).__name__}"
        )
    return [_entry(index, item) for index, item in enumerate(models)]
