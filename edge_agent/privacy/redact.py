"""Redaction: each face's whole head hidden, then checked by a stronger eye.

A detector's box is the face (brows to chin); hair, ears and jaw give a person
away too, so the hidden area is a square ``mask_scale`` times the box's longer
side around its centre, raised a little (:func:`hidden_area`). The area is hidden as the
policy says (:data:`MODES`):

- ``pixelate``: averaged into blocks of a third of the face's side (three
  blocks across a face: no eye, nose or mouth survives);
- ``blur``: box-blurred twice with a kernel half the area's side;
- ``fill``: painted black.

Then the picture is searched again with the *checker*, the strongest detector
at a low threshold (:data:`edge_agent.privacy.faces.CHECK`), not the detector
that chose the boxes: whatever it still finds (a face the first detector
missed, a face the hiding left recognisable) is hidden again, then painted
over. What comes out is a new array: the image's metadata (EXIF and the like)
never travels with tensors, and a decoded image is re-encoded from its pixels
only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.policy.rules import REDACTION_MODES as MODES
from edge_agent.privacy.faces import Face, FaceFinder
from edge_core import imaging

__all__ = ["MODES", "Redaction", "hidden_area", "hide", "redact_faces"]

Array = np.ndarray[Any, Any]

BLOCKS_PER_FACE = 3  # pixelation cells across one face box


@dataclass(frozen=True)
class Redaction:
    """How faces are hidden: ``mode`` (one of :data:`MODES`) and ``mask_scale`` (the
    hidden area's side, in face-box sides)."""

    mode: str = "pixelate"
    mask_scale: float = 1.6

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown redaction mode {self.mode!r}; one of {', '.join(MODES)}")
        if not 1.0 <= self.mask_scale <= 4.0:
            raise ValueError(f"mask_scale must be in [1, 4], got {self.mask_scale}")


def hidden_area(face: Face, mask_scale: float) -> Face:
    """The area hidden for ``face``: a square ``mask_scale`` times the box's longer
    side (a head with its hair is about as wide as it is high, a face box is
    narrower), its centre raised by a tenth of its side (the hair is above the box;
    the neck below it gives nothing away)."""
    cx, cy = (face.x0 + face.x1) / 2, (face.y0 + face.y1) / 2
    side = max(face.width, face.height) * mask_scale
    cy -= side / 10
    return Face(cx - side / 2, cy - side / 2, cx + side / 2, cy + side / 2, face.score)


def _pixels(area: Face, height: int, width: int) -> tuple[int, int, int, int] | None:
    x0, y0 = max(int(np.floor(area.x0)), 0), max(int(np.floor(area.y0)), 0)
    x1, y1 = min(int(np.ceil(area.x1)), width), min(int(np.ceil(area.y1)), height)
    return (x0, y0, x1, y1) if x1 > x0 and y1 > y0 else None


def hide(rgb: Array, faces: Sequence[Face], redaction: Redaction) -> Array:
    """A copy of ``rgb`` with each face's hidden area hidden as ``redaction`` says
    (``rgb`` itself when there are no faces)."""
    if not faces:
        return rgb
    out = rgb.copy()
    height, width = out.shape[:2]
    for face in faces:
        box = _pixels(hidden_area(face, redaction.mask_scale), height, width)
        if box is None:
            continue
        x0, y0, x1, y1 = box
        region = out[y0:y1, x0:x1]
        if redaction.mode == "fill":
            region[...] = 0
            continue
        if redaction.mode == "blur":
            kernel = max(3, min(x1 - x0, y1 - y0) // 2)
            region[...] = imaging.box_blur(imaging.box_blur(region, kernel), kernel)
            continue
        cell = max(1.0, min(face.width, face.height) / BLOCKS_PER_FACE)
        cols, rows = max(1, round((x1 - x0) / cell)), max(1, round((y1 - y0) / cell))
        small = imaging.resize(region, (rows, cols), "area")
        region[...] = imaging.resize(small, (y1 - y0, x1 - x0), "nearest")
    result: Array = out
    return result


def redact_faces(
    rgb: Array,
    faces: Sequence[Face],
    checker: FaceFinder,
    redaction: Redaction | None = None,
    *,
    rounds: int = 2,
    seen: Callable[[Array], Array] | None = None,
) -> tuple[Array, list[Face]]:
    """``rgb`` with ``faces`` hidden, and the faces ``checker`` still finds (normally none);
    ``rgb`` itself when nothing was hidden.

    Each round hides what the checker found in the last; after ``rounds`` rounds
    what it still finds is painted over, with a wider margin. ``seen``: the picture as
    it will be seen where it goes (a JPEG's round trip, of the same size): the checker
    searches that, since an encoding's artefacts can make a face of what was none."""
    redaction = redaction or Redaction()
    look = seen or (lambda picture: picture)
    out = hide(rgb, faces, redaction)
    for _ in range(rounds):
        remaining = checker.detect(look(out))
        if not remaining:
            return out, []
        out = hide(out, remaining, redaction)
    remaining = checker.detect(look(out))
    if remaining:
        wider = Redaction("fill", min(4.0, redaction.mask_scale + 0.5))
        out = hide(out, remaining, wider)
        remaining = checker.detect(look(out))
    return out, remaining
