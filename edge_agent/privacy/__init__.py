"""Privacy: find what is personal in a request, and redact it.

:class:`PrivacyInspector` looks into a request's tensors: image inputs (as the
model's manifest describes them, or any 3-D tensor that looks like a picture)
are searched for faces with BlazeFace (:mod:`.faces`), text (``BYTES``)
inputs for e-mail addresses, phone, card and ID numbers (:mod:`.text`).
:meth:`PrivacyInspector.redact` returns new tensors with the faces pixelated
(:mod:`.redact`) and the text masked, checked again with the same detectors.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_agent.package import ImagePreprocessing
from edge_agent.preprocess import ImageView, tensor_to_image
from edge_agent.privacy.faces import Face, FaceDetector
from edge_agent.privacy.redact import redact_faces
from edge_agent.privacy.text import find_pii, mask_pii

__all__ = ["FaceDetector", "Findings", "PrivacyInspector", "find_pii", "mask_pii", "pictures"]

Array = np.ndarray[Any, Any]


# A tensor with two dimensions at least this long may be a picture.
PICTURE_SIDE = 32


@dataclass
class Findings:
    """What the detectors found, by input name."""

    faces: dict[str, list[list[Face]]] = field(default_factory=dict)  # per picture
    pii: dict[str, list[str]] = field(default_factory=dict)  # kinds found
    images: int = 0  # pictures searched
    unsearchable: list[str] = field(default_factory=list)  # inputs that may be pictures, unread

    @property
    def kinds(self) -> frozenset[str]:
        kinds = set()
        if any(any(items) for items in self.faces.values()):
            kinds.add("faces")
        if any(self.pii.values()):
            kinds.add("pii")
        return frozenset(kinds)

    @property
    def face_count(self) -> int:
        return sum(len(item) for items in self.faces.values() for item in items)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "faces": self.face_count,
            "pii": sorted({kind for kinds in self.pii.values() for kind in kinds}),
            "images_searched": self.images,
        }
        if self.unsearchable:
            out["unsearchable"] = self.unsearchable
        return out


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _looks_like_a_picture(array: Array) -> bool:
    return sum(1 for d in array.shape if d >= PICTURE_SIDE) >= 2


def pictures(
    array: Array, pre: ImagePreprocessing | None
) -> list[tuple[tuple[int, ...], ImageView]]:
    """The pictures an input holds, with where each is (an index into the array).

    With the manifest's preprocessing, each batch item is one picture. Without
    it, layouts are guessed: one 2-D grey picture, one 3-D picture (HWC or CHW,
    1, 3 or 4 channels), or a batch of them along the leading dimensions.
    """
    found: list[tuple[tuple[int, ...], ImageView]] = []
    if pre is not None:
        for index in range(len(array) if array.ndim else 0):
            view = tensor_to_image(np.asarray(array[index]), pre)
            if view is not None:
                found.append(((index,), view))
        return found
    if array.ndim in (2, 3):
        view = tensor_to_image(array, None)
        if view is not None:
            return [((), view)]
    if array.ndim < 3:
        return []
    for index in np.ndindex(*array.shape[: array.ndim - 3] if array.ndim >= 4 else array.shape[:1]):
        item = np.asarray(array[index])
        view = tensor_to_image(item, None)
        if view is not None:
            found.append((tuple(index), view))
    return found


class PrivacyInspector:
    """Finds faces and personal data in tensors, and redacts them.

    ``faces`` is ``None`` on a device without the BlazeFace model: pictures are
    then not searched, and are reported as unsearchable, which the exit guard
    treats as "cannot prove clean". So is any tensor that may be a picture but
    whose layout cannot be read: the guard fails closed.
    """

    def __init__(self, faces: FaceDetector | None) -> None:
        self.detector = faces

    @staticmethod
    def _pre(name: str, preprocessing: ImagePreprocessing | None) -> ImagePreprocessing | None:
        return preprocessing if preprocessing is not None and preprocessing.input == name else None

    def inspect(
        self, inputs: dict[str, Array], preprocessing: ImagePreprocessing | None = None
    ) -> Findings:
        findings = Findings()
        for name, array in inputs.items():
            if array.dtype == object or array.dtype.kind in "SU":
                kinds = sorted({m.kind for v in array.ravel() for m in find_pii(_text(v))})
                if kinds:
                    findings.pii[name] = kinds
                continue
            found = pictures(array, self._pre(name, preprocessing))
            searchable = [view for _, view in found if min(view.rgb.shape[:2]) >= PICTURE_SIDE]
            if (not found and _looks_like_a_picture(array)) or (
                searchable and self.detector is None
            ):
                findings.unsearchable.append(name)
                continue
            if self.detector is None or not searchable:
                continue
            findings.images += len(searchable)
            findings.faces[name] = [self.detector.detect(view.rgb) for _, view in found]
        return findings

    def redact(
        self,
        inputs: dict[str, Array],
        findings: Findings,
        preprocessing: ImagePreprocessing | None = None,
    ) -> tuple[dict[str, Array], Findings]:
        """New inputs with faces pixelated and personal text masked; what is still found."""
        out = dict(inputs)
        for name, kinds in findings.pii.items():
            if kinds:
                masked = np.empty(inputs[name].size, dtype=object)
                masked[:] = [mask_pii(_text(v))[0].encode() for v in inputs[name].ravel()]
                out[name] = masked.reshape(inputs[name].shape)
        for name, per_picture in findings.faces.items():
            if not any(per_picture) or self.detector is None:
                continue
            array = np.array(inputs[name], copy=True)
            for (where, view), faces in zip(
                pictures(array, self._pre(name, preprocessing)), per_picture, strict=True
            ):
                if faces:
                    redacted, _ = redact_faces(view.rgb, faces, self.detector)
                    array[where] = view.encode(redacted)
            out[name] = array
        return out, self.inspect(out, preprocessing)
