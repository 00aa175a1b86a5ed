"""Redaction: faces pixelated and blurred until the detector finds none.

Each face box is widened (hair, ears and jaw give a face away too), its pixels
averaged into coarse blocks and blurred. The picture is searched again with the
same detector; a face still found is redacted again more coarsely, and after
the last round painted over. What comes out is a new array: the image's
metadata (EXIF and the like) never travels with tensors, and a decoded image
is re-encoded from its pixels only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edge_agent.privacy.faces import Face, FaceDetector

__all__ = ["pixelate", "redact_faces"]

Array = np.ndarray[Any, Any]


def pixelate(rgb: Array, faces: Sequence[Face], *, margin: float = 0.35, blocks: int = 6) -> Array:
    """A copy of ``rgb`` with each (widened) face box reduced to ``blocks`` x ``blocks`` cells."""
    import cv2

    out = rgb.copy()
    height, width = out.shape[:2]
    for face in faces:
        grow_x, grow_y = face.width * margin, face.height * margin
        x0, y0 = max(int(face.x0 - grow_x), 0), max(int(face.y0 - grow_y), 0)
        x1, y1 = (
            min(int(np.ceil(face.x1 + grow_x)), width),
            min(int(np.ceil(face.y1 + grow_y)), height),
        )
        if x1 <= x0 or y1 <= y0:
            continue
        region = out[y0:y1, x0:x1]
        small = cv2.resize(region, (blocks, blocks), interpolation=cv2.INTER_AREA)
        coarse = cv2.resize(small, (x1 - x0, y1 - y0), interpolation=cv2.INTER_NEAREST)
        kernel = max(3, (min(x1 - x0, y1 - y0) // 4) | 1)
        out[y0:y1, x0:x1] = cv2.GaussianBlur(coarse, (kernel, kernel), 0)
    result: Array = out
    return result


def redact_faces(
    rgb: Array, faces: Sequence[Face], detector: FaceDetector, *, rounds: int = 3
) -> tuple[Array, list[Face]]:
    """``rgb`` with ``faces`` redacted, and the faces the detector still finds (none, normally)."""
    out = rgb
    remaining = list(faces)
    for round_index in range(rounds):
        if not remaining:
            return out, []
        out = pixelate(
            out, remaining, margin=0.35 + 0.25 * round_index, blocks=max(2, 6 - 2 * round_index)
        )
        remaining = detector.detect(out)
    if remaining:  # still found: paint the boxes over
        out = out.copy()
        for face in remaining:
            out[
                max(int(face.y0), 0) : int(np.ceil(face.y1)),
                max(int(face.x0), 0) : int(np.ceil(face.x1)),
            ] = 0
        remaining = detector.detect(out)
    return out, remaining
