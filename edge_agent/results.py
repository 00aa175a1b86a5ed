"""Answers a person (or an application) reads: a classifier's top labels, and the raw
tensors summarised, from a model's outputs and its manifest.

``edge-agent infer`` prints them; a stream sends them with every frame.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edge_core.package import ModelPackage

__all__ = ["MAX_PRINTED_VALUES", "describe_outputs", "top_k"]

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
    package: ModelPackage, outputs: dict[str, Array], *, top: int = 5, full: bool = False
) -> dict[str, Any]:
    """The outputs as JSON: each tensor (its values, or a summary when large and not
    ``full``), and a classifier's ``top_k``."""
    result: dict[str, Any] = {"outputs": {}}
    for name, value in outputs.items():
        entry: dict[str, Any] = {"shape": list(value.shape), "datatype": str(value.dtype)}
        if full or value.size <= MAX_PRINTED_VALUES:
            entry["data"] = np.round(value.astype(np.float64), 6).tolist()
        else:
            entry["summary"] = {
                "min": float(value.min()),
                "max": float(value.max()),
                "mean": float(value.mean()),
            }
        result["outputs"][name] = entry
    if package.task == "classification" and package.outputs:
        result["top_k"] = top_k(package, outputs, top)
    return result
