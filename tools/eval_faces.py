"""Measure face-detector recall and false positives on synthetic scenes; pick a default.

Faces of several sizes are pasted into scikit-image photographs that show no
human face; every detector configuration (short-range or full-range BlazeFace,
both, with or without tiling, at two score thresholds) runs on the same scenes.
A pasted face counts as found when a detection overlaps it (IoU >= 0.3); a
detection that overlaps no pasted face is a false positive. Prints a table and
writes JSON::

    python tools/eval_faces.py --json bench-results/faces.json

Faces come from scikit-image too: the astronaut's and the cameraman's heads
(with hair and some background, as a camera sees them) and 40 of the bundled
LFW faces (tight crops, greyscale), each pasted at 48, 96 and 192 pixels,
mirrored or not, with random brightness.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_agent.privacy.faces import FULL_RANGE, SHORT_RANGE, Face, FaceDetector, iou
from edge_core.report import render_table, write_json
from edge_core.repository import ModelRepository

SIZES = (48, 96, 192)
BACKGROUNDS = (
    "coffee",
    "chelsea",
    "rocket",
    "hubble_deep_field",
    "brick",
    "coins",
    "retina",
    "immunohistochemistry",
    "grass",
    "gravel",
)
Array = np.ndarray[Any, Any]


def _rgb(image: Array) -> Array:
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    if image.dtype != np.uint8:
        image = (np.clip(image, 0, 1) * 255).astype(np.uint8)
    return np.ascontiguousarray(image[:, :, :3])


def face_crops() -> list[Array]:
    import cv2
    from skimage import data

    crops = [
        _rgb(data.astronaut())[40:220, 140:315],  # head with hair, as a camera frames it
        _rgb(data.camera())[80:250, 140:300],
    ]
    lfw = data.lfw_subset()
    for index in range(0, 100, 5):
        crops.append(_rgb(cv2.resize(lfw[index], (100, 100), interpolation=cv2.INTER_CUBIC)))
    return crops


def scenes(seed: int = 0) -> list[tuple[Array, list[Face]]]:
    """Background photographs with faces pasted in, and where the faces are."""
    import cv2
    from skimage import data

    rng = np.random.default_rng(seed)
    crops = face_crops()
    out: list[tuple[Array, list[Face]]] = []
    for name in BACKGROUNDS:
        out.append(
            (_rgb(getattr(data, name)()), [])
        )  # the photograph alone: any detection is false
    for index, crop in enumerate(crops):
        for size in SIZES:
            background = _rgb(
                getattr(data, BACKGROUNDS[(index + size) % len(BACKGROUNDS)])()
            ).copy()
            height, width = background.shape[:2]
            scale = size / max(crop.shape[:2])
            face = cv2.resize(crop, (round(crop.shape[1] * scale), round(crop.shape[0] * scale)))
            if rng.random() < 0.5:
                face = face[:, ::-1]
            face = np.clip(face.astype(np.float32) * rng.uniform(0.7, 1.2), 0, 255).astype(np.uint8)
            fh, fw = face.shape[:2]
            if fh >= height or fw >= width:
                continue
            y, x = int(rng.integers(0, height - fh)), int(rng.integers(0, width - fw))
            background[y : y + fh, x : x + fw] = face
            out.append((background, [Face(x, y, x + fw, y + fh, 1.0)]))
    return out


def evaluate(detector: FaceDetector, data: list[tuple[Array, list[Face]]]) -> dict[str, Any]:
    found = dict.fromkeys(SIZES, 0)
    total = dict.fromkeys(SIZES, 0)
    false_positives = 0
    clean_images_with_detections = 0
    started = time.perf_counter()
    for image, truth in data:
        detections = detector.detect(image)
        for face in truth:
            size = min(SIZES, key=lambda s: abs(s - max(face.width, face.height)))
            total[size] += 1
            found[size] += any(iou(face, d) >= 0.3 or _inside(d, face) for d in detections)
        false_positives += sum(
            1 for d in detections if not any(iou(d, t) >= 0.3 or _inside(d, t) for t in truth)
        )
        clean_images_with_detections += not truth and bool(detections)
    elapsed = (time.perf_counter() - started) / len(data) * 1000
    recall = {size: round(found[size] / total[size], 3) for size in SIZES if total[size]}
    return {
        "recall_by_size": recall,
        "recall": round(sum(found.values()) / sum(total.values()), 3),
        "false_positives": false_positives,
        "clean_photos_with_detections": clean_images_with_detections,
        "ms_per_image": round(elapsed, 2),
    }


def _inside(detection: Face, truth: Face) -> bool:
    """A detection of the face itself inside a pasted crop that shows a whole head."""
    cx, cy = (detection.x0 + detection.x1) / 2, (detection.y0 + detection.y1) / 2
    return truth.x0 <= cx <= truth.x1 and truth.y0 <= cy <= truth.y1


CONFIGURATIONS: dict[str, dict[str, Any]] = {
    "short": {"models": (SHORT_RANGE,), "tiles": 0},
    "short, tiles 2x2": {"models": (SHORT_RANGE,), "tiles": 2},
    "short, tiles 3x3": {"models": (SHORT_RANGE,), "tiles": 3},
    "full": {"models": (FULL_RANGE,), "tiles": 0},
    "full, tiles 2x2": {"models": (FULL_RANGE,), "tiles": 2},
    "short + full": {"models": (SHORT_RANGE, FULL_RANGE), "tiles": 0},
    "short + full, tiles 2x2": {"models": (SHORT_RANGE, FULL_RANGE), "tiles": 2},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir", type=Path, default=Path(__file__).resolve().parents[1] / "models"
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    repository = ModelRepository(args.model_dir)
    data = scenes()
    faces = sum(len(t) for _, t in data)
    results = {}
    rows = []
    for name, config in CONFIGURATIONS.items():
        for threshold in (None, 0.65):
            models = config["models"]
            if threshold is not None:
                models = tuple(
                    replace(spec, min_score=max(spec.min_score, threshold)) for spec in models
                )
            label = name + (f", score >= {threshold}" if threshold is not None else "")
            detector = FaceDetector(repository, models=models, tiles=config["tiles"], min_score=0.0)
            result = evaluate(detector, data)
            results[label] = result
            rows.append(
                [
                    label,
                    *[result["recall_by_size"].get(s) for s in SIZES],
                    result["recall"],
                    result["false_positives"],
                    result["clean_photos_with_detections"],
                    result["ms_per_image"],
                ]
            )
    print(f"{len(data)} scenes, {faces} pasted faces, {len(BACKGROUNDS)} photographs without faces")
    print(
        render_table(
            [
                "detector",
                *[f"recall {s}px" for s in SIZES],
                "recall",
                "false pos.",
                "clean photos hit",
                "ms/image",
            ],
            rows,
        )
    )
    if args.json:
        write_json(args.json, {"scenes": len(data), "faces": faces, "results": results})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
