"""``python -m benchmarks privacy``, part one: face detectors' recall, false alarms and time.

Every configuration runs on the same synthetic scenes (:mod:`.face_scenes`:
faces of 24 to 192 px under eight distortions, a few to a 640x480 scene) and
on the twenty face-free photographs. A pasted face is found when a detection
overlaps it (IoU >= 0.3) or is centred on it; a face-free photograph with any
detection is a false alarm. Time is the median per 640x480 scene.

The target (P8) for the default: recall >= 0.98 on faces of 32 px and more,
false alarms in at most 1 of the 20 photographs, <= 30 ms a picture.

Each model runs once per setting that changes what it computes (BlazeFace's
tiles, CenterFace's scale), at its lowest threshold; higher thresholds are
the same boxes filtered by score (greedy NMS keeps the same boxes among the
better ones), and a combination is the union of its parts' boxes, its time
the sum of theirs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.agent.face_scenes import (
    DISTORTIONS,
    SIZES,
    Scene,
    face_crops,
    face_free_photos,
    matches,
    scenes,
)
from edge_agent.privacy.faces import (
    CHECK,
    DEFAULT,
    DetectorSpec,
    Face,
    FaceFinder,
    SecondLook,
    nms,
    spec_for,
)
from edge_core.report import render_table
from edge_core.repository import ModelRepository
from edge_core.runtime import RuntimeOptions

__all__ = ["CONFIGURATIONS", "Config", "format_faces", "label_of", "run_faces"]

TARGET_RECALL, TARGET_FALSE_ALARMS, TARGET_MS, TARGET_FROM_PX = 0.98, 1, 30.0, 32


@dataclass(frozen=True)
class Config:
    """A configuration: the base runs it unites (each ``(run, threshold)``)."""

    label: str
    parts: tuple[tuple[str, float], ...]


# Base runs: what a model computes, at its lowest threshold.
RUNS: dict[str, DetectorSpec] = {
    "blazeface 0x0": DetectorSpec("blazeface", threshold=0.5, tiles=0),
    "blazeface 2x2": DetectorSpec("blazeface", threshold=0.5, tiles=2),
    "blazeface 3x3": DetectorSpec("blazeface", threshold=0.5, tiles=3),
    **{
        f"centerface x{scale:g}": DetectorSpec("centerface", threshold=0.2, scale=scale)
        for scale in (0.5, 0.75, 1.0, 1.25, 1.5)
    },
}


def label_of(spec: DetectorSpec) -> str:
    """The configuration's label in the report."""
    if spec.model == "blazeface":
        return f"blazeface {spec.tiles}x{spec.tiles} >= {spec.threshold:g}"
    centerface = f"centerface x{spec.scale:g} >= {spec.threshold:g}"
    if spec.second_look is not None:
        look = spec.second_look
        centerface += f", second look {look.candidates:g}..{spec.threshold:g} >= {look.threshold:g}"
    if spec.model == "centerface":
        return centerface
    return f"blazeface {spec.tiles}x{spec.tiles} >= {spec.blazeface_threshold:g} + {centerface}"


def _config(spec: DetectorSpec) -> Config:
    """The configuration of ``spec``: from the base runs, or a run of its own (a second
    look depends on the threshold)."""
    if spec.second_look is not None:
        RUNS.setdefault(label_of(spec), spec)
        return Config(label_of(spec), ((label_of(spec), 0.0),))
    centerface = (f"centerface x{spec.scale:g}", spec.threshold)
    blazeface = (f"blazeface {spec.tiles}x{spec.tiles}", spec.blazeface_threshold)
    if spec.model == "blazeface":
        return Config(label_of(spec), ((f"blazeface {spec.tiles}x{spec.tiles}", spec.threshold),))
    parts = (centerface,) if spec.model == "centerface" else (blazeface, centerface)
    return Config(label_of(spec), parts)


CONFIGURATIONS: tuple[Config, ...] = (
    _config(DetectorSpec("blazeface", threshold=0.65, tiles=0)),
    _config(DetectorSpec("blazeface", threshold=0.65, tiles=2)),
    _config(DetectorSpec("blazeface", threshold=0.5, tiles=3)),
    _config(DetectorSpec("blazeface", threshold=0.65, tiles=3)),
    *(_config(DetectorSpec("centerface", threshold=t, scale=0.5)) for t in (0.3, 0.5)),
    *(_config(DetectorSpec("centerface", threshold=t, scale=0.75)) for t in (0.2, 0.3, 0.5)),
    *(_config(DetectorSpec("centerface", threshold=t)) for t in (0.2, 0.25, 0.3, 0.4, 0.5, 0.6)),
    *(_config(DetectorSpec("centerface", threshold=t, scale=1.25)) for t in (0.2, 0.3, 0.5)),
    _config(DetectorSpec("centerface", threshold=0.2, scale=1.5)),
    _config(DetectorSpec("blazeface+centerface", threshold=0.3, blazeface_threshold=0.65)),
    _config(DetectorSpec("blazeface+centerface", threshold=0.2, blazeface_threshold=0.5)),
    *(
        _config(DetectorSpec("centerface", threshold=t, second_look=SecondLook(c, z)))
        for t, c, z in ((0.3, 0.08, 0.2), (0.5, 0.05, 0.15), (0.3, 0.1, 0.3))
    ),
    _config(spec_for(scale=0.75)),  # what a profile's cheaper scale costs
    _config(DEFAULT),
    _config(CHECK),
)


@dataclass
class _Run:
    """One base run's boxes on every scene and photograph, and its times."""

    scenes: list[list[Face]]
    photos: list[list[Face]]
    ms: list[float]


def _detect_all(
    detector: FaceFinder, data: Sequence[Scene], photos: Sequence[tuple[str, Any]]
) -> _Run:
    times, found = [], []
    for scene in data:
        started = time.perf_counter()
        found.append(detector.detect(scene.image))
        times.append((time.perf_counter() - started) * 1000)
    return _Run(found, [detector.detect(photo) for _, photo in photos], times)


def _kept(runs: dict[str, _Run], config: Config, field: str, index: int) -> list[Face]:
    boxes = [
        face
        for run, threshold in config.parts
        for face in getattr(runs[run], field)[index]
        if face.score >= threshold
    ]
    return nms(boxes) if len(config.parts) > 1 else boxes


def score(
    config: Config,
    runs: dict[str, _Run],
    data: Sequence[Scene],
    photos: Sequence[tuple[str, Any]],
) -> dict[str, Any]:
    """Recall by size and by distortion, false alarms and time of one configuration."""
    found: dict[tuple[int, str, str], int] = {}  # by size, distortion, kind of face
    total: dict[tuple[int, str, str], int] = {}
    stray = 0
    for index, scene in enumerate(data):
        detections = _kept(runs, config, "scenes", index)
        for face, size, crop in zip(scene.faces, scene.sizes, scene.crops, strict=True):
            key = (size, scene.distortion, "lfw crops" if crop.startswith("lfw") else "heads")
            total[key] = total.get(key, 0) + 1
            found[key] = found.get(key, 0) + any(matches(d, face) for d in detections)
        stray += sum(1 for d in detections if not any(matches(d, p) for p in scene.pasted))

    def recall(keys: Sequence[tuple[int, str, str]]) -> float | None:
        count = sum(total[k] for k in keys)
        return round(sum(found[k] for k in keys) / count, 3) if count else None

    by_size = {s: recall([k for k in total if k[0] == s]) for s in sorted({k[0] for k in total})}
    big = [k for k in total if k[0] >= TARGET_FROM_PX]
    by_distortion = {
        d: recall([k for k in big if k[1] == d]) for d in DISTORTIONS if any(k[1] == d for k in big)
    }
    by_kind = {
        kind: recall([k for k in big if k[2] == kind]) for kind in sorted({k[2] for k in big})
    }
    alarms = [name for i, (name, _) in enumerate(photos) if _kept(runs, config, "photos", i)]
    ms = float(np.median(np.sum([runs[run].ms for run, _ in config.parts], axis=0)))
    result: dict[str, Any] = {
        "recall_by_size": {str(s): r for s, r in by_size.items()},
        "recall_by_distortion": by_distortion,
        "recall_from_32px": recall(big),
        "recall_by_kind_from_32px": by_kind,
        "recall": recall(list(total)),
        "faces": sum(total.values()),
        "faces_from_32px": sum(total[k] for k in big),
        "missed_from_32px": sum(total[k] - found[k] for k in big),
        "false_alarm_photos": len(alarms),
        "photos": len(photos),
        "false_alarms_in": alarms,
        "scene_false_positives": stray,
        "ms_640x480": round(ms, 2),
    }
    result["meets_target"] = bool(
        (result["recall_from_32px"] or 0.0) >= TARGET_RECALL
        and len(alarms) <= TARGET_FALSE_ALARMS
        and ms <= TARGET_MS
    )
    return result


def run_faces(
    repository: ModelRepository,
    *,
    configurations: Sequence[Config] = CONFIGURATIONS,
    lfw: int = 40,
    sizes: Sequence[int] = SIZES,
    options: RuntimeOptions | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Measure ``configurations``; the report's ``default`` names the shipped one.

    Raises:
        ModelNotFoundError, NoVariantError: a detector's model is missing.
    """
    from edge_agent.privacy.faces import open_detector

    crops = face_crops(lfw)
    photos = face_free_photos()
    data = list(scenes(crops, [photo for _, photo in photos], sizes=sizes, seed=seed))
    # no spinning, one session at a time: an idle session's spinning threads would
    # take the cores from the one being timed
    options = options or RuntimeOptions(allow_spinning=False, warmup=2)
    runs = {}
    for name in sorted({run for config in configurations for run, _ in config.parts}):
        detector = open_detector(repository, RUNS[name], options)
        runs[name] = _detect_all(detector, data, photos)
        del detector
    unique = {config.label: config for config in configurations}
    results = {label: score(config, runs, data, photos) for label, config in unique.items()}
    return {
        "benchmark": "faces",
        "scenes": len(data),
        "faces": sum(len(scene.faces) for scene in data),
        "face_crops": len(crops),
        "photos": [name for name, _ in photos],
        "sizes": list(sizes),
        "distortions": list(DISTORTIONS),
        "default": label_of(DEFAULT),
        "checker": label_of(CHECK),
        "targets": {
            "recall_from_32px": TARGET_RECALL,
            "false_alarm_photos": TARGET_FALSE_ALARMS,
            "ms_640x480": TARGET_MS,
        },
        "results": results,
    }


def format_faces(report: dict[str, Any]) -> str:
    """The two tables (recall by size; recall by distortion, false alarms, time)."""
    results: dict[str, dict[str, Any]] = report["results"]
    sizes = [str(s) for s in report["sizes"]]

    def name(label: str) -> str:
        return f"{label} (default)" if label == report["default"] else label

    by_size = render_table(
        ["detector", *[f"{s} px" for s in sizes], ">= 32 px", "all"],
        [
            [
                name(label),
                *[r["recall_by_size"].get(s) for s in sizes],
                r["recall_from_32px"],
                r["recall"],
            ]
            for label, r in results.items()
        ],
    )
    distortions = report["distortions"]
    by_distortion = render_table(
        ["detector", *distortions, "photos hit", "scene FP", "ms 640x480", "target"],
        [
            [
                name(label),
                *[r["recall_by_distortion"].get(d) for d in distortions],
                f"{r['false_alarm_photos']}/{r['photos']}",
                r["scene_false_positives"],
                r["ms_640x480"],
                "met" if r["meets_target"] else "missed",
            ]
            for label, r in results.items()
        ],
    )
    return (
        f"{report['scenes']} scenes (640x480), {report['faces']} pasted faces "
        f"({report['face_crops']} faces x {len(sizes)} sizes x {len(distortions)} distortions), "
        f"{len(report['photos'])} face-free photographs\n\n"
        f"recall by face size (all distortions)\n{by_size}\n\n"
        f"recall by distortion (faces >= 32 px), false alarms, time\n{by_distortion}"
    )


def format_privacy(report: dict[str, Any]) -> str:
    """What ``python -m benchmarks privacy`` prints: the detectors, then the video."""
    from benchmarks.agent.privacy_video import format_video

    text = format_faces(report)
    text += f"\n\ndefault: {report['default']}; checker of redacted pictures: {report['checker']}"
    if "video" in report:
        text += "\n\n" + format_video(report["video"])
    return text
