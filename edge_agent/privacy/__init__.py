"""Privacy: find what is personal in a request, and redact it.

:class:`PrivacyInspector` looks into a request's tensors: image inputs (as the
model's manifest describes them, or any 3-D tensor that looks like a picture)
are searched for faces with the chosen detector (:mod:`.faces`: CenterFace by
default), text (``BYTES``)
inputs for e-mail addresses, phone, card and ID numbers (:mod:`.text`).
Encoded image files (JPEG, PNG, WebP, BMP, GIF, TIFF), whether ``BYTES``
elements or a flat ``uint8`` tensor, are recognised by their signature and
decoded (:mod:`.encoded`) to be searched like any picture; one that cannot be
decoded is unsearchable, which the exit guard refuses.
:meth:`PrivacyInspector.redact` returns new tensors with each face's head hidden
(:mod:`.redact`: pixelated, blurred or filled, as the policy says), the text
masked and encoded images written again from their (redacted) pixels, without
their metadata; then searched again, pictures with the stronger *checker*
(``inspect(..., strict=True)``), which the exit guard also uses on every
redacted request.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edge_agent.preprocess import ImageView, tensor_to_image
from edge_agent.privacy.encoded import carries_metadata, decode, encode, unwrap_base64
from edge_agent.privacy.faces import DETECTOR_MODELS, Face, FaceFinder
from edge_agent.privacy.redact import Redaction, redact_faces
from edge_agent.privacy.text import find_pii, mask_pii
from edge_core.errors import InputError, PrivacyRefusal
from edge_core.images import MAX_IMAGE_PIXELS, image_format
from edge_core.package import ImagePreprocessing

__all__ = [
    "FaceFinder",
    "Findings",
    "PrivacyInspector",
    "Redacted",
    "Redaction",
    "encoded_images",
    "find_pii",
    "mask_pii",
    "pictures",
]

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
    metadata: list[str] = field(default_factory=list)  # inputs whose image files carry metadata

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
        if self.metadata:
            out["image_metadata"] = self.metadata
        return out


def _text(value: Any) -> str:
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _looks_like_a_picture(array: Array) -> bool:
    return sum(1 for d in array.shape if d >= PICTURE_SIDE) >= 2


# An image file is never shorter; the first two bytes of each format, as one number.
MIN_FILE_BYTES = 64
_PAIR = np.array([256, 1], np.uint16)
_STARTS = np.array([0xFFD8, 0x8950, 0x4749, 0x5249, 0x4949, 0x4D4D, 0x424D], np.uint16)


def _holds_text(array: Array) -> bool:
    return array.dtype == object or array.dtype.kind in "SU"


def _byte_rows(array: Array) -> bool:
    """A ``uint8`` tensor of image files' bytes: one file (1-D) or a batch of them, one
    per row, padded to one length (``[N, L]``), some row starting with an image
    signature. Pictures are not: their last axis is channels (``HWC``, a pixel is no
    file however its bytes read) or a row of grey pixels, and a row of pixels that
    happens to spell a signature makes a picture of files that do not decode,
    which is refused rather than let through unsearched."""
    if array.dtype != np.uint8 or array.ndim not in (1, 2) or array.shape[-1] < MIN_FILE_BYTES:
        return False
    rows = array.reshape(-1, array.shape[-1])
    candidates = np.flatnonzero(np.isin(rows[:, :2].astype(np.uint16) @ _PAIR, _STARTS))
    return any(image_format(rows[i, :32].tobytes()) is not None for i in candidates)


def _holds_bytes(array: Array) -> bool:
    return _holds_text(array) or _byte_rows(array)


def _images(array: Array) -> dict[int, tuple[bytes, bytes | None]]:
    """The image files an input holds, by flat index (by row for ``uint8`` rows), each
    with the prefix of the base64 text it came as (``None``: the file's own bytes)."""
    if _byte_rows(array):  # every row: one that is no file of a known format is unreadable
        rows = np.ascontiguousarray(array).reshape(-1, array.shape[-1])
        return {index: (row.tobytes(), None) for index, row in enumerate(rows)}
    if array.dtype.kind == "S":  # fixed width: keep the NUL bytes numpy would strip
        width, raw = array.dtype.itemsize, np.ascontiguousarray(array).tobytes()
        items: list[Any] = [raw[i * width : (i + 1) * width] for i in range(array.size)]
    elif array.dtype == object or array.dtype.kind == "U":
        items = list(array.ravel())
    else:
        return {}
    found: dict[int, tuple[bytes, bytes | None]] = {}
    for index, item in enumerate(items):
        if isinstance(item, str):
            item = item.encode("utf-8", errors="replace")
        if not isinstance(item, bytes):
            continue
        if image_format(item):
            found[index] = (item, None)
        elif (wrapped := unwrap_base64(item)) is not None:
            found[index] = (wrapped[1], wrapped[0])
    return found


def encoded_images(array: Array) -> dict[int, bytes]:
    """The encoded image files an input holds, by flat index: ``BYTES`` elements that
    start with an image signature or are one in base64 (a ``data:image/...`` URL or
    bare), or a flat ``uint8`` tensor that starts with one (index 0)."""
    return {index: data for index, (data, _) in _images(array).items()}


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


@dataclass(frozen=True)
class Redacted:
    """What :meth:`PrivacyInspector.anonymize` made: the inputs, redacted; how many
    faces the detector found; and how many pictures were searched."""

    outputs: dict[str, Array]
    faces: int
    pictures: int


class PrivacyInspector:
    """Finds faces and personal data in tensors, and redacts them.

    ``faces`` is ``None`` on a device without a face detector's model: pictures
    are then not searched, and are reported as unsearchable, which the exit
    guard treats as "cannot prove clean". So is any tensor that may be a picture
    but whose layout cannot be read: the guard fails closed. ``checker`` is the
    stronger eye that redacted pictures must pass (default: ``faces`` itself);
    ``redaction`` how faces are hidden. An image file over ``max_pixels`` is
    refused before it is decoded (:class:`~edge_core.errors.InputError`).

    ``opener`` opens the detector and the checker again from where their models are
    now (the models installed over the air first): :meth:`reload` calls it when one
    of :data:`~edge_agent.privacy.faces.DETECTOR_MODELS` changes, so a detector
    delivered by an update replaces the shipped one, and one that cannot be opened
    leaves the current eyes in place.
    """

    def __init__(
        self,
        faces: FaceFinder | None,
        *,
        checker: FaceFinder | None = None,
        redaction: Redaction | None = None,
        max_pixels: int = MAX_IMAGE_PIXELS,
        opener: Callable[[], tuple[FaceFinder, FaceFinder]] | None = None,
    ) -> None:
        self.detector = faces
        self.checker = checker or faces
        self.redaction = redaction or Redaction()
        self.max_pixels = max_pixels
        self._opener = opener

    def reload(self, model: str) -> bool:
        """Open the detector and the checker again when ``model`` is one of theirs;
        whether they changed. Searches already running finish with the old ones.

        Raises:
            EdgeError: the new model cannot be opened (the old eyes stay).
        """
        if self._opener is None or model not in DETECTOR_MODELS:
            return False
        self.detector, self.checker = self._opener()
        return True

    def _eye(self, strict: bool) -> FaceFinder | None:
        return self.checker if strict else self.detector

    @staticmethod
    def _pre(name: str, preprocessing: ImagePreprocessing | None) -> ImagePreprocessing | None:
        return preprocessing if preprocessing is not None and preprocessing.input == name else None

    def inspect(
        self,
        inputs: dict[str, Array],
        preprocessing: ImagePreprocessing | None = None,
        *,
        strict: bool = False,
    ) -> Findings:
        """What the detectors find in ``inputs``; pictures searched with the checker
        when ``strict`` (a redacted request), else with the detector."""
        findings = Findings()
        detector = self._eye(strict)
        for name, array in inputs.items():
            if _holds_bytes(array):
                self._inspect_bytes(name, array, findings, detector)
                continue
            found = pictures(array, self._pre(name, preprocessing))
            searchable = [view for _, view in found if min(view.size) >= PICTURE_SIDE]
            if (not found and _looks_like_a_picture(array)) or (searchable and detector is None):
                findings.unsearchable.append(name)
                continue
            if detector is None or not searchable:
                continue
            findings.images += len(searchable)
            findings.faces[name] = [detector.detect(view.rgb) for _, view in found]
        return findings

    def _inspect_bytes(
        self, name: str, array: Array, findings: Findings, detector: FaceFinder | None
    ) -> None:
        """Text for personal data; encoded images for faces and metadata."""
        images = encoded_images(array)
        if _holds_text(array):
            texts = [v for i, v in enumerate(array.ravel()) if i not in images]
            kinds = sorted({m.kind for v in texts for m in find_pii(_text(v))})
            if kinds:
                findings.pii[name] = kinds
        if not images:
            return
        if any(carries_metadata(data) for data in images.values()):
            findings.metadata.append(name)
        decoded = [decode(data, self.max_pixels) for data in images.values()]
        if detector is None or any(rgb is None for rgb in decoded):
            findings.unsearchable.append(name)
            return
        findings.images += len(decoded)
        findings.faces[name] = [detector.detect(rgb) for rgb in decoded if rgb is not None]

    def _rewrite(self, data: bytes, faces: list[Face]) -> bytes | None:
        """An image file written again from its pixels (faces redacted): no metadata.
        ``None`` for one that cannot be decoded: it is left as it is, for the exit guard
        to refuse."""
        rgb = decode(data, self.max_pixels)
        if rgb is None:
            return None
        if self.checker is not None:  # also what the detector missed and the checker sees
            rgb, _ = redact_faces(rgb, faces, self.checker, self.redaction)
        return encode(rgb, image_format(data) or "png")

    def _redact_bytes(self, array: Array, pii: list[str], per_image: list[list[Face]]) -> Array:
        images = _images(array)
        if not images and not pii:
            return array
        faces = per_image if len(per_image) == len(images) else [[] for _ in images]
        rewritten: dict[int, bytes] = {}
        for (index, (data, prefix)), found in zip(images.items(), faces, strict=True):
            written = self._rewrite(data, found)
            if written is not None:
                rewritten[index] = written if prefix is None else prefix + base64.b64encode(written)
        out: Array
        if _byte_rows(array):
            rows = np.ascontiguousarray(array).reshape(-1, array.shape[-1])
            files = [rewritten.get(i, row.tobytes()) for i, row in enumerate(rows)]
            width = max(len(f) for f in files)  # shorter files padded with zeros, as sent
            out = np.zeros((len(files), width), np.uint8)
            for i, data in enumerate(files):
                out[i, : len(data)] = np.frombuffer(data, np.uint8)
            return out.reshape(*array.shape[:-1], width)
        items = np.empty(array.size, dtype=object)
        for index, value in enumerate(array.ravel()):
            if index in rewritten:
                items[index] = rewritten[index]
            else:
                items[index] = mask_pii(_text(value))[0].encode() if pii else value
        out = items.reshape(array.shape)
        return out

    def redact(
        self,
        inputs: dict[str, Array],
        findings: Findings,
        preprocessing: ImagePreprocessing | None = None,
        *,
        seen: Callable[[Array], Array] | None = None,
    ) -> tuple[dict[str, Array], Findings]:
        """New inputs with faces hidden, personal text masked and encoded images
        written again without metadata; what is still found (pictures searched by
        the checker: for pixel tensors, what it found in the last round of
        :func:`redact_faces`, in the picture as ``seen`` makes it, when it will leave
        encoded; the exit guard searches what leaves once more)."""
        out = dict(inputs)
        for name, array in inputs.items():
            if _holds_bytes(array):
                out[name] = self._redact_bytes(
                    array, findings.pii.get(name, []), findings.faces.get(name, [])
                )
        left: dict[str, list[list[Face]]] = {}
        for name, per_picture in findings.faces.items():
            if self.checker is None or _holds_bytes(inputs[name]):
                continue
            array = np.array(inputs[name], copy=True)
            left[name] = []
            for (where, view), faces in zip(
                pictures(array, self._pre(name, preprocessing)), per_picture, strict=True
            ):
                # every picture: the checker also hides what the detector missed
                redacted, remaining = redact_faces(
                    view.rgb, faces, self.checker, self.redaction, seen=seen
                )
                left[name].append(remaining)
                if redacted is not view.rgb:
                    array[where] = view.encode(redacted)
            out[name] = array
        rest = {name: array for name, array in out.items() if name not in left}
        after = self.inspect(rest, preprocessing, strict=True)
        after.faces.update(left)
        after.images += sum(len(per_picture) for per_picture in left.values())
        return out, after

    def anonymize(self, inputs: dict[str, Array], redaction: Redaction | None = None) -> Redacted:
        """``inputs`` with every picture's faces hidden (pictures as tensors or image
        files), personal text masked, image metadata dropped: nothing leaves the
        device, and nothing that the checker still finds is handed back.

        Raises:
            InputError: no input holds a picture, or one cannot be searched.
            PrivacyRefusal: the checker still finds a face after redaction.
        """
        inspector = self
        if redaction is not None:
            inspector = copy.copy(self)
            inspector.redaction = redaction
        findings = inspector.inspect(inputs)
        if findings.unsearchable:
            raise InputError(
                f"cannot search {', '.join(findings.unsearchable)} for faces here "
                "(no face detector, or a layout or file that cannot be read)"
            )
        if not findings.images:
            raise InputError("no input holds a picture to redact (at least 32 px a side)")
        outputs, after = inspector.redact(inputs, findings)
        if after.face_count or after.unsearchable:
            raise PrivacyRefusal("the checker still finds a face after redaction; not handed back")
        return Redacted(outputs, findings.face_count, findings.images)
