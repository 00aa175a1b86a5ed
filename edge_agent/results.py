"""Answers a person (or an application) reads: a classifier's top labels, a detector's
boxes, and the raw tensors on request, from a model's outputs and its manifest.

``edge-agent infer`` prints them; a stream sends them with every frame.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from edge_core.package import ModelPackage

__all__ = ["MAX_PRINTED_VALUES", "describe_outputs", "json_line", "per_row", "reads", "top_k"]

Array = np.ndarray[Any, Any]
MAX_PRINTED_VALUES = 1000  # an output with more values is summarised, unless asked for whole


def top_k(package: ModelPackage, outputs: dict[str, Array], k: int) -> list[list[dict[str, Any]]]:
    """For a classifier: each row's ``k`` best classes, with their labels and scores."""
    scores = outputs[package.outputs[0].name]
    rows = scores.reshape(-1, scores.shape[-1])
    labels = package.labels
    return [
        [
            {
                "index": int(i),
                "label": labels[i] if i < len(labels) else str(i),
                "score": round(float(row[i]), 6),
            }
            for i in np.argsort(-row)[:k]
        ]
        for row in rows
    ]


def describe_outputs(
    package: ModelPackage,
    outputs: dict[str, Array],
    *,
    top: int = 5,
    full: bool = False,
    raw: bool = False,
    image_hw: tuple[int, int] | Sequence[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    """The outputs as JSON a person reads: a classifier's ``top_k``; a detector's boxes
    (:func:`edge_agent.decoders.detections`, in the pixels of the picture of
    ``image_hw`` when given, or of each row's picture); and the tensors themselves
    (``outputs``: each one's values, or a summary when large and not ``full``) when
    asked for (``raw``, ``full``) or when nothing here reads them."""
    from edge_agent.decoders import detections

    result: dict[str, Any] = {}
    if package.task == "classification" and package.outputs:
        result["top_k"] = top_k(package, outputs, top)
    decoded = detections(package, outputs, image_hw)
    if decoded is not None:
        result.update(decoded)
    if raw or full or not result:
        result["outputs"] = {name: _tensor(value, full) for name, value in outputs.items()}
    return result


def reads(package: ModelPackage) -> bool:
    """Whether :func:`describe_outputs` reads what this model's outputs mean (its top
    labels, its boxes), not only the tensors."""
    from edge_agent.decoders import decoder_for

    return (package.task == "classification" and bool(package.outputs)) or (
        decoder_for(package) is not None
    )


def per_row(described: dict[str, Any]) -> list[dict[str, Any]]:
    """What :func:`describe_outputs` decoded, one document a batch row (no raw tensors);
    empty when it decoded nothing."""
    lists: dict[str, Any] = {k: described[k] for k in ("top_k", "detections") if k in described}
    if not lists:
        return []
    rows = max(len(v) for v in lists.values())
    out = []
    for index in range(rows):
        row: dict[str, Any] = {k: v[index] for k, v in lists.items() if index < len(v)}
        if "detections" in row:
            row["coordinates"] = described["coordinates"]
        out.append(row)
    return out


def _tensor(value: Array, full: bool) -> dict[str, Any]:
    entry: dict[str, Any] = {"shape": list(value.shape), "datatype": str(value.dtype)}
    if full or value.size <= MAX_PRINTED_VALUES:
        entry["data"] = np.round(value.astype(np.float64), 6).tolist()
    else:
        entry["summary"] = {
            "min": float(value.min()),
            "max": float(value.max()),
            "mean": float(value.mean()),
        }
    return entry


def json_line(document: Any) -> str:
    """``document`` as one line of strict JSON: a value that is not finite (a model's NaN)
    is ``null``, as a browser's ``JSON.parse`` takes nothing else."""
    try:
        return json.dumps(document, separators=(",", ":"), allow_nan=False, default=str)
    except ValueError:
        return json.dumps(_finite(document), separators=(",", ":"), allow_nan=False, default=str)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
