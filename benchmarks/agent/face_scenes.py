"""Synthetic scenes for measuring face detectors: real faces pasted into real photos.

Everything comes from scikit-image (no download): the faces are the
astronaut's and the cameraman's heads (with hair and background, as a camera
frames them) and 40 of the bundled LFW faces (tight grey crops); the
backgrounds and the face-free photographs are every scikit-image picture that
shows no human face (:data:`FACE_FREE`).

Each face is pasted at every size of :data:`SIZES` (the face's height, brows
to chin) under every distortion of :data:`DISTORTIONS`: rotated (up to
±30°) or mirrored faces; grey, dark (x0.35), bright, JPEG quality 10 or
motion-blurred scenes. Several faces share one 640x480 scene, apart, with a
little random brightness each. Deterministic for a seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edge_agent.privacy.faces import Face

__all__ = [
    "DISTORTIONS",
    "FACE_FREE",
    "SCENE_SIZE",
    "SIZES",
    "FaceCrop",
    "Scene",
    "face_crops",
    "face_free_photos",
    "matches",
    "scenes",
]

Array = np.ndarray[Any, Any]

SIZES = (24, 32, 48, 64, 96, 192)
DISTORTIONS = ("plain", "rotated", "mirrored", "grey", "dark", "bright", "jpeg10", "motion blur")
SCENE_SIZE = (640, 480)  # width, height
MAX_FACES = 4  # per scene
# scikit-image's pictures without a human face (chelsea and cat are one picture)
FACE_FREE = (
    "brick",
    "chelsea",
    "cell",
    "clock",
    "coffee",
    "coins",
    "colorwheel",
    "grass",
    "gravel",
    "horse",
    "hubble_deep_field",
    "immunohistochemistry",
    "logo",
    "microaneurysms",
    "moon",
    "page",
    "retina",
    "rocket",
    "stereo_motorcycle",
    "text",
)


@dataclass(frozen=True)
class FaceCrop:
    """A picture of a face and where the face is in it."""

    name: str
    pixels: Array  # RGB uint8
    face: tuple[int, int, int, int]  # x0, y0, x1, y1


@dataclass(frozen=True)
class Scene:
    """A picture, the faces pasted into it (their face boxes) and where each pasted
    picture lies (a detection inside one is not a false alarm)."""

    image: Array
    faces: tuple[Face, ...]
    pasted: tuple[Face, ...]
    sizes: tuple[int, ...]
    distortion: str
    crops: tuple[str, ...]


def rgb_of(image: Array) -> Array:
    """An RGB ``uint8`` copy of a scikit-image picture (grey, boolean, float or RGBA)."""
    if image.dtype == bool:
        image = image.astype(np.uint8) * 255
    elif image.dtype != np.uint8:
        image = (np.clip(image, 0, 1) * 255).astype(np.uint8)
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3])


def face_free_photos(names: Sequence[str] = FACE_FREE) -> list[tuple[str, Array]]:
    """The face-free photographs, RGB, at their own sizes."""
    from skimage import data

    photos = []
    for name in names:
        image = getattr(data, name)()
        if isinstance(image, tuple):  # stereo_motorcycle: the left view
            image = image[0]
        photos.append((name, rgb_of(image)))
    return photos


def face_crops(lfw: int = 40) -> list[FaceCrop]:
    """The two heads of scikit-image's portraits, then ``lfw`` LFW faces."""
    import cv2
    from skimage import data

    crops = [
        FaceCrop("astronaut", rgb_of(data.astronaut())[20:230, 130:320], (51, 38, 140, 158)),
        FaceCrop("camera", rgb_of(data.camera())[80:250, 140:300], (62, 39, 118, 117)),
    ]
    faces = data.lfw_subset()[:100]  # the first 100 are faces, the rest are not
    for index in np.linspace(0, len(faces) - 1, lfw).round().astype(int):
        pixels = rgb_of(cv2.resize(faces[index], (100, 100), interpolation=cv2.INTER_CUBIC))
        crops.append(FaceCrop(f"lfw{index}", pixels, (0, 0, 100, 100)))
    return crops


def _background(photo: Array, rng: np.random.Generator) -> Array:
    """A 640x480 part of ``photo``, scaled to cover the scene."""
    import cv2

    width, height = SCENE_SIZE
    scale = max(width / photo.shape[1], height / photo.shape[0]) * rng.uniform(1.0, 1.3)
    big = cv2.resize(photo, (math.ceil(photo.shape[1] * scale), math.ceil(photo.shape[0] * scale)))
    y = int(rng.integers(0, big.shape[0] - height + 1))
    x = int(rng.integers(0, big.shape[1] - width + 1))
    return np.ascontiguousarray(big[y : y + height, x : x + width])


def _prepare(
    crop: FaceCrop, size: int, distortion: str, angle: float, rng: np.random.Generator
) -> tuple[Array, Array, Face]:
    """The crop scaled so that its face is ``size`` px high, maybe mirrored or
    rotated: its pixels, where it is opaque, and its face box in it."""
    import cv2

    x0, y0, x1, y1 = crop.face
    scale = size / (y1 - y0)
    pixels = cv2.resize(
        crop.pixels,
        (max(1, round(crop.pixels.shape[1] * scale)), max(1, round(crop.pixels.shape[0] * scale))),
        interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC,
    )
    gain = rng.uniform(0.8, 1.15)
    pixels = np.clip(pixels.astype(np.float32) * gain, 0, 255).astype(np.uint8)
    corners = np.array([[x0, y0], [x1, y0], [x1, y1], [x0, y1]], np.float64) * scale
    if distortion == "mirrored":
        pixels = np.ascontiguousarray(pixels[:, ::-1])
        corners[:, 0] = pixels.shape[1] - corners[:, 0]
    mask = np.full(pixels.shape[:2], 255, np.uint8)
    if distortion == "rotated":
        h, w = pixels.shape[:2]
        matrix = cv2.getRotationMatrix2D((w / 2, h / 2), angle, 1.0)
        cos, sin = abs(matrix[0, 0]), abs(matrix[0, 1])
        new_w, new_h = math.ceil(w * cos + h * sin), math.ceil(w * sin + h * cos)
        matrix[0, 2] += (new_w - w) / 2
        matrix[1, 2] += (new_h - h) / 2
        pixels = cv2.warpAffine(pixels, matrix, (new_w, new_h), flags=cv2.INTER_LINEAR)
        mask = cv2.warpAffine(mask, matrix, (new_w, new_h), flags=cv2.INTER_NEAREST)
        corners = np.hstack([corners, np.ones((4, 1))]) @ matrix.T
    xs, ys = corners[:, 0], corners[:, 1]
    return pixels, mask, Face(xs.min(), ys.min(), xs.max(), ys.max(), 1.0)


def _distort_scene(image: Array, distortion: str, rng: np.random.Generator) -> Array:
    import cv2

    if distortion == "grey":
        grey: Array = cv2.cvtColor(image, cv2.COLOR_RGB2GRAY)
        return np.repeat(grey[:, :, None], 3, axis=2)
    if distortion == "dark":
        return (image.astype(np.float32) * 0.35).astype(np.uint8)
    if distortion == "bright":
        bright: Array = np.clip(image.astype(np.float32) * 1.6 + 30, 0, 255)
        return bright.astype(np.uint8)
    if distortion == "jpeg10":
        ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, 10])
        assert ok
        return np.asarray(cv2.imdecode(data, cv2.IMREAD_UNCHANGED))
    if distortion == "motion blur":
        length = 9
        line = np.zeros((length, length), np.float32)
        line[length // 2] = 1.0 / length
        rotate = cv2.getRotationMatrix2D(
            (length / 2 - 0.5, length / 2 - 0.5), float(rng.uniform(0, 180)), 1.0
        )
        kernel: Array = cv2.warpAffine(line, rotate, (length, length))
        return np.asarray(cv2.filter2D(image, -1, kernel / kernel.sum()))
    return image


def _place(
    size: tuple[int, int], taken: list[Face], rng: np.random.Generator
) -> tuple[int, int] | None:
    """Where a ``size`` (w, h) picture fits in the scene apart from the others."""
    width, height = SCENE_SIZE
    w, h = size
    if w >= width or h >= height:
        return None
    for _ in range(60):
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        box = Face(x - 8, y - 8, x + w + 8, y + h + 8, 1.0)
        if all(box.x1 <= t.x0 or t.x1 <= box.x0 or box.y1 <= t.y0 or t.y1 <= box.y0 for t in taken):
            return x, y
    return None


def scenes(
    crops: Sequence[FaceCrop],
    backgrounds: Sequence[Array],
    *,
    sizes: Sequence[int] = SIZES,
    distortions: Sequence[str] = DISTORTIONS,
    seed: int = 0,
) -> Iterator[Scene]:
    """Every crop at every size under every distortion, a few to a scene."""
    rng = np.random.default_rng(seed)
    angles = (-30.0, 30.0, -20.0, 20.0, -10.0, 10.0)
    for distortion in distortions:
        todo = [(crop, size) for size in sizes for crop in crops]
        order = rng.permutation(len(todo))
        todo = [todo[i] for i in order]
        while todo:
            image = _background(backgrounds[int(rng.integers(len(backgrounds)))], rng)
            taken: list[Face] = []
            faces: list[Face] = []
            kept: list[tuple[FaceCrop, int]] = []
            for crop, size in list(todo):
                if len(kept) == MAX_FACES:
                    break
                angle = angles[len(faces) % len(angles)]
                pixels, mask, face = _prepare(crop, size, distortion, angle, rng)
                spot = _place((pixels.shape[1], pixels.shape[0]), taken, rng)
                if spot is None:
                    if not kept:  # too big for any scene: drop it
                        todo.remove((crop, size))
                    continue
                x, y = spot
                h, w = pixels.shape[:2]
                region = image[y : y + h, x : x + w]
                np.copyto(region, pixels, where=mask[:, :, None] > 0)
                taken.append(Face(x, y, x + w, y + h, 1.0))
                faces.append(face.shifted(x, y))
                kept.append((crop, size))
                todo.remove((crop, size))
            if kept:
                yield Scene(
                    image=_distort_scene(image, distortion, rng),
                    faces=tuple(faces),
                    pasted=tuple(taken),
                    sizes=tuple(size for _, size in kept),
                    distortion=distortion,
                    crops=tuple(crop.name for crop, _ in kept),
                )


def matches(detection: Face, truth: Face) -> bool:
    """Whether a detection is of the face ``truth`` (overlapping it, or centred on it:
    a rotated face's upright box overlaps its detection less)."""
    from edge_agent.privacy.faces import iou

    cx, cy = (detection.x0 + detection.x1) / 2, (detection.y0 + detection.y1) / 2
    inside = truth.x0 <= cx <= truth.x1 and truth.y0 <= cy <= truth.y1
    return inside or iou(detection, truth) >= 0.3
