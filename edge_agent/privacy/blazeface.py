"""Face detection with MediaPipe's BlazeFace, through the agent's LiteRT backend.

The model outputs one box regression and one score per SSD anchor; the anchors
are generated as MediaPipe's ``SsdAnchorsCalculator`` does for each model
(896 for the short-range model at 128x128, 2304 for the full-range one at
192x192), decoded as its ``TensorsToDetectionsCalculator`` does, and
overlapping boxes are merged by non-maximum suppression.

Images are letterboxed (padded to a square, not stretched) before they are
scaled to the model's input, and boxes are mapped back to the image's pixels.
The short-range model is made for faces that fill a good part of the frame;
:class:`BlazeFace` can also run it on overlapping tiles (``tiles=2``: a 2x2
grid plus the whole image) to find smaller faces, or combine it with the
full-range model. Its settings here (the short-range model on the whole image
and a 3x3 grid of tiles, boxes kept from a score of 0.65: MediaPipe's own
threshold, 0.5, also finds the cat in ``chelsea.png``) are the best BlazeFace
that ``python -m benchmarks privacy`` measured; CenterFace (:mod:`.centerface`)
finds far more of the small faces (see :mod:`.faces`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from edge_agent.privacy.faces import Face, grey_to_rgb, nms
from edge_core import imaging
from edge_core.repository import ModelSource
from edge_core.runtime import RuntimeOptions, Session, open_best

__all__ = ["FULL_RANGE", "SHORT_RANGE", "AnchorSpec", "BlazeFace", "anchors", "decode"]

Array = np.ndarray[Any, Any]


@dataclass(frozen=True)
class AnchorSpec:
    """The options of MediaPipe's SsdAnchorsCalculator and decoder for one model."""

    model: str  # package name in the model repository
    input_size: int
    strides: tuple[int, ...]
    interpolated_scale_aspect_ratio: float
    min_score: float


SHORT_RANGE = AnchorSpec("face-detection-short-range", 128, (8, 16, 16, 16), 1.0, 0.5)
FULL_RANGE = AnchorSpec("face-detection-full-range", 192, (4,), 0.0, 0.6)


@functools.lru_cache(maxsize=8)
def anchors(spec: AnchorSpec) -> Array:
    """Anchor centres ``[N, 2]`` (x, y in 0..1); anchor sizes are fixed at 1. Computed
    once a model (read-only: shared)."""
    centres: list[tuple[float, float]] = []
    layer = 0
    while layer < len(spec.strides):
        stride = spec.strides[layer]
        per_cell = 0
        # consecutive layers with the same stride share one grid
        while layer < len(spec.strides) and spec.strides[layer] == stride:
            per_cell += 1 + (1 if spec.interpolated_scale_aspect_ratio > 0 else 0)
            layer += 1
        cells = -(-spec.input_size // stride)
        for y in range(cells):
            for x in range(cells):
                for _ in range(per_cell):
                    centres.append(((x + 0.5) / cells, (y + 0.5) / cells))
    array = np.asarray(centres, dtype=np.float32)
    array.flags.writeable = False
    return array


class _Model:
    def __init__(self, spec: AnchorSpec, session: Session) -> None:
        self.spec = spec
        self.session = session
        self.anchors = anchors(spec)
        self.input = session.inputs[0].name
        regressors, scores = sorted(session.outputs, key=lambda s: -s.shape[-1])
        self.regressors, self.scores = regressors.name, scores.name
        if regressors.shape[1] != len(self.anchors):
            raise ValueError(
                f"{spec.model} has {regressors.shape[1]} boxes but {len(self.anchors)} anchors"
            )

    def detect(self, rgb: Array) -> list[Face]:
        """Faces in an RGB ``uint8`` image, in its pixels."""
        height, width = rgb.shape[:2]
        side = max(height, width)
        square = np.zeros((side, side, 3), np.uint8)
        top, left = (side - height) // 2, (side - width) // 2
        square[top : top + height, left : left + width] = rgb
        size = self.spec.input_size
        scaled = imaging.resize(square, (size, size), "area")
        tensor = (scaled.astype(np.float32) / 127.5 - 1.0)[None]
        out = self.session.run({self.input: tensor})
        boxes = decode(
            out[self.regressors][0], out[self.scores][0], self.anchors, size, self.spec.min_score
        )
        return [
            Face(x0 * side - left, y0 * side - top, x1 * side - left, y1 * side - top, score)
            for x0, y0, x1, y1, score in boxes.tolist()
        ]


def decode(
    regressors: Array, logits: Array, centres: Array, input_size: int, min_score: float
) -> Array:
    """Boxes ``[N, 5]`` (x0, y0, x1, y1 in 0..1 of the model's square input, and the
    score), before NMS, from one picture's outputs: ``regressors [A, 16]`` (offsets and
    sizes in the input's pixels), ``logits [A, 1]``, and the anchors' ``centres [A, 2]``."""
    scores = 1.0 / (1.0 + np.exp(-np.clip(logits[:, 0].astype(np.float64), -100.0, 100.0)))
    keep = np.flatnonzero(scores >= min_score)
    raw = regressors[keep, :4].astype(np.float64) / input_size
    cx, cy = raw[:, 0] + centres[keep, 0], raw[:, 1] + centres[keep, 1]
    w, h = raw[:, 2], raw[:, 3]
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2, scores[keep]], axis=1)


class BlazeFace:
    """Faces in pictures, with BlazeFace.

    Args:
        repository: where the BlazeFace packages are (shipped with the agent).
        models: which BlazeFace models to run (``SHORT_RANGE``, ``FULL_RANGE``).
        tiles: also run on an ``n x n`` grid of overlapping tiles (0: whole image only).
        min_score: the lowest score kept (at least the model's own threshold).
        min_size: images smaller than this (pixels, either side) are not searched:
            a tensor such as an 8x8 digit cannot show a recognisable face.
    """

    def __init__(
        self,
        repository: ModelSource,
        *,
        models: Sequence[AnchorSpec] = (SHORT_RANGE,),
        tiles: int = 3,
        min_score: float = 0.65,
        min_size: int = 32,
        options: RuntimeOptions | None = None,
    ) -> None:
        options = options or RuntimeOptions(threads=1, warmup=1)
        self.models = [
            _Model(
                replace(spec, min_score=max(spec.min_score, min_score)),
                open_best(repository.get(spec.model), options)[1],
            )
            for spec in models
        ]
        self.tiles = tiles
        self.min_size = min_size

    def detect(self, rgb: Array) -> list[Face]:
        """Faces in an RGB (or grey) ``uint8`` image ``H x W [x C]``, best first."""
        rgb = grey_to_rgb(rgb)
        height, width = rgb.shape[:2]
        if min(height, width) < self.min_size:
            return []
        found: list[Face] = []
        for model in self.models:
            found.extend(model.detect(rgb))
            if self.tiles > 1:
                found.extend(self._tiled(model, rgb))
        return nms(found)

    def _tiled(self, model: _Model, rgb: Array) -> list[Face]:
        height, width = rgb.shape[:2]
        n = self.tiles
        tile_h, tile_w = int(height * 1.5 / (n + 0.5)), int(width * 1.5 / (n + 0.5))
        found: list[Face] = []
        for row in range(n):
            for col in range(n):
                y0 = round(row * (height - tile_h) / max(n - 1, 1))
                x0 = round(col * (width - tile_w) / max(n - 1, 1))
                tile = rgb[y0 : y0 + tile_h, x0 : x0 + tile_w]
                if min(tile.shape[:2]) < self.min_size:
                    continue
                found.extend(face.shifted(x0, y0) for face in model.detect(tile))
        return found
