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
from edge_agent.preprocess import tensor_to_image
from edge_agent.privacy.faces import Face, FaceDetector
from edge_agent.privacy.redact import redact_faces
from edge_agent.privacy.text import find_pii, mask_pii

__all__ = ["FaceDetector", "Findings", "PrivacyInspector", "find_pii", "mask_pii"]

Array = np.ndarray[Any, Any]


@dataclass
class Findings:
    """What the detectors found, by input name."""

    faces: dict[str, list[list[Face]]] = field(default_factory=dict)  # per batch item
    pii: dict[str, list[str]] = field(default_factory=dict)  # kinds found
    images: int = 0  # image items searched

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
        return {
            "faces": self.face_count,
            "pii": sorted({kind for kinds in self.pii.values() for kind in kinds}),
            "images_searched": self.images,
        }


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


class PrivacyInspector:
    """Finds faces and personal data in tensors, and redacts them.

    ``faces`` is ``None`` on a device without the BlazeFace model: images are
    then not searched, which the exit guard treats as "cannot prove clean".
    """

    def __init__(self, faces: FaceDetector | None) -> None:
        self.detector = faces

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
            pre = (
                preprocessing if preprocessing is not None and preprocessing.input == name else None
            )
            items = []
            for item in array:
                view = tensor_to_image(np.asarray(item), pre)
                if view is None or self.detector is None:
                    continue
                findings.images += 1
                items.append(self.detector.detect(view.rgb))
            if items:
                findings.faces[name] = items
        return findings

    def unsearchable_images(
        self, inputs: dict[str, Array], preprocessing: ImagePreprocessing | None = None
    ) -> bool:
        """Whether some input is an image that cannot be searched (no face detector)."""
        if self.detector is not None:
            return False
        for name, array in inputs.items():
            pre = (
                preprocessing if preprocessing is not None and preprocessing.input == name else None
            )
            if array.dtype.kind in "uif" and array.ndim >= 1 and len(array):
                view = tensor_to_image(np.asarray(array[0]), pre)
                if view is not None and min(view.rgb.shape[:2]) >= 32:
                    return True
        return False

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
        for name, per_item in findings.faces.items():
            if not any(per_item) or self.detector is None:
                continue
            pre = (
                preprocessing if preprocessing is not None and preprocessing.input == name else None
            )
            array = np.array(inputs[name], copy=True)
            for index, faces in enumerate(per_item):
                if not faces:
                    continue
                view = tensor_to_image(array[index], pre)
                if view is None:
                    continue
                redacted, _ = redact_faces(view.rgb, faces, self.detector)
                array[index] = view.encode(redacted)
            out[name] = array
        return out, self.inspect(out, preprocessing)
