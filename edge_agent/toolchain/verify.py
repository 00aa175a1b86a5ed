"""Every variant against the FP32 reference, and the tolerance it must meet.

On the evaluation data (or the calibration data when there is none), by task:

- classification: top-1 agreement with FP32, agreement per class (per class
  FP32 predicts: the seed's "rare class" trap, a class that quantization
  breaks while the overall agreement looks fine), accuracy when labels are
  given;
- segmentation (a probability map): the IoU of the maps thresholded at
  ``threshold``, over all pixels of all items;
- anything else: the mean absolute error relative to the reference's mean
  magnitude.

Always: outputs must be finite (an FP16 overflow shows as ``inf``), and the
maximum and mean absolute errors are reported. :func:`refusal` says why a
variant is out of tolerance, or ``None``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["BuildTolerance", "compare", "refusal"]

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class BuildTolerance:
    """How close a variant must stay to FP32 to be kept (``models build`` flags)."""

    min_agreement: float = 0.99
    min_class_agreement: float = 0.9
    max_accuracy_drop_points: float = 1.0
    min_iou: float = 0.9
    threshold: float = 0.3
    max_relative_error: float = 0.05

    def to_dict(self) -> dict[str, float]:
        return dict(vars(self))


def compare(
    task: str,
    reference: Sequence[dict[str, Array]],
    outputs: Sequence[dict[str, Array]],
    labels: Array | None,
    tolerance: BuildTolerance,
) -> dict[str, Any]:
    """The metrics of ``outputs`` against ``reference`` (lists of items, same order)."""
    names = list(reference[0])
    errors = [
        np.abs(out[n].astype(np.float64) - ref[n].astype(np.float64))
        for ref, out in zip(reference, outputs, strict=True)
        for n in names
    ]
    finite = all(np.all(np.isfinite(out[n])) for out in outputs for n in names)
    metrics: dict[str, Any] = {
        "items": len(reference),
        "finite": bool(finite),
        "max_abs_error": _round(max(float(np.max(e, initial=0.0)) for e in errors)),
        "mean_abs_error": _round(float(np.mean([float(np.mean(e)) for e in errors]))),
    }
    first = names[0]
    if task == "classification":
        want = np.concatenate([np.argmax(ref[first], axis=-1).ravel() for ref in reference])
        got = np.concatenate([np.argmax(out[first], axis=-1).ravel() for out in outputs])
        same = want == got
        per_class = {
            str(int(c)): round(float(np.mean(same[want == c])), 4) for c in np.unique(want)
        }
        metrics["agreement"] = round(float(np.mean(same)), 4)
        metrics["class_agreement"] = per_class
        metrics["worst_class"] = min(per_class, key=lambda c: (per_class[c], c))
        if labels is not None:
            metrics["accuracy"] = round(float(np.mean(got == labels.ravel())), 4)
            metrics["reference_accuracy"] = round(float(np.mean(want == labels.ravel())), 4)
    elif task == "segmentation":
        inter = union = 0
        for ref, out in zip(reference, outputs, strict=True):
            a, b = ref[first] > tolerance.threshold, out[first] > tolerance.threshold
            inter += int(np.sum(a & b))
            union += int(np.sum(a | b))
        metrics["iou"] = round(inter / union, 4) if union else 1.0
        metrics["threshold"] = tolerance.threshold
    else:
        scale = float(np.mean([np.mean(np.abs(ref[n])) for ref in reference for n in names]))
        metrics["relative_error"] = _round(metrics["mean_abs_error"] / scale if scale else 0.0)
    return metrics


def refusal(metrics: dict[str, Any], tolerance: BuildTolerance) -> str | None:
    """Why a variant with ``metrics`` is out of tolerance, or ``None`` when it is within."""
    if not metrics["finite"]:
        return "non-finite outputs (inf or NaN: an FP16 overflow?)"
    if "agreement" in metrics:
        if metrics["agreement"] < tolerance.min_agreement:
            return (
                f"top-1 agreement with FP32 {metrics['agreement']:.4f} < "
                f"{tolerance.min_agreement:.4f}"
            )
        worst = metrics["worst_class"]
        share = metrics["class_agreement"][worst]
        if share < tolerance.min_class_agreement:
            return (
                f"class {worst} agrees with FP32 on {share:.4f} of its items < "
                f"{tolerance.min_class_agreement:.4f}"
            )
        if "accuracy" in metrics:
            drop = 100 * (metrics["reference_accuracy"] - metrics["accuracy"])
            if drop > tolerance.max_accuracy_drop_points:
                return (
                    f"accuracy {metrics['accuracy']:.4f} is {drop:.2f} points below FP32's "
                    f"(at most {tolerance.max_accuracy_drop_points:g})"
                )
    if "iou" in metrics and metrics["iou"] < tolerance.min_iou:
        return (
            f"IoU of the maps thresholded at {tolerance.threshold:g} {metrics['iou']:.4f} < "
            f"{tolerance.min_iou:.4f}"
        )
    relative = metrics.get("relative_error")
    if relative is not None and relative > tolerance.max_relative_error:
        return f"relative mean error {relative:.4g} > {tolerance.max_relative_error:g}"
    return None


def _round(value: float) -> float:
    return float(f"{value:.6g}")
