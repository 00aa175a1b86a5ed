"""CenterFace, the stronger check, redaction of the whole head, and video redaction,
on real models and real scikit-image photographs."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import pytest
from skimage import data

from benchmarks.agent.face_scenes import face_crops
from benchmarks.agent.faces import _config, run_faces
from benchmarks.agent.privacy_video import run_video, write_clip
from edge_agent.config import DETECTORS
from edge_agent.privacy import PrivacyInspector, Redaction
from edge_agent.privacy.centerface import CenterFace, decode, nms_boxes
from edge_agent.privacy.faces import DEFAULT, Face, FaceFinder, open_detectors
from edge_agent.privacy.redact import hidden_area, redact_faces
from edge_agent.privacy.video import carried, redact_video
from edge_core.errors import InputError
from edge_core.repository import ModelRepository

# Eileen Collins' face in astronaut.png (brows to chin), and her whole head with hair
ASTRONAUT_FACE = (181, 58, 270, 178)
ASTRONAUT_HEAD = (150, 18, 302, 185)


@pytest.fixture(scope="module")
def detector(face_detectors: tuple[FaceFinder, FaceFinder]) -> FaceFinder:
    return face_detectors[0]


@pytest.fixture(scope="module")
def checker(face_detectors: tuple[FaceFinder, FaceFinder]) -> FaceFinder:
    return face_detectors[1]


def test_decode_turns_a_peak_into_its_box() -> None:
    heat = np.zeros((30, 40), np.float32)
    heat[10, 20], heat[10, 21], heat[25, 5] = 0.9, 0.6, 0.3  # a peak, its neighbour, a weak one
    sizes = np.zeros((2, 30, 40), np.float32)
    sizes[0, 10, 20], sizes[1, 10, 20] = np.log(12.0), np.log(8.0)  # 48 px high, 32 px wide
    offsets = np.zeros((2, 30, 40), np.float32)
    offsets[:, 10, 20] = 0.25, -0.5  # y, x in cells
    (box,) = decode(heat, sizes, offsets, threshold=0.5)
    cx, cy = (20 - 0.5 + 0.5) * 4, (10 + 0.25 + 0.5) * 4
    assert box.tolist() == pytest.approx([cx - 16, cy - 24, cx + 16, cy + 24, 0.9])
    assert len(decode(heat, sizes, offsets, threshold=0.2)) == 2  # the weak one too


def test_nms_keeps_the_best_of_overlapping_boxes() -> None:
    boxes = np.array([[0, 0, 10, 10, 0.8], [1, 1, 11, 11, 0.9], [50, 50, 60, 60, 0.7]])
    assert nms_boxes(boxes)[:, 4].tolist() == [0.9, 0.7]


def test_centerface_finds_the_astronauts_face_where_it_is(detector: FaceFinder) -> None:
    (face,) = detector.detect(data.astronaut())
    assert [face.x0, face.y0, face.x1, face.y1] == pytest.approx(ASTRONAUT_FACE, abs=8)
    assert face.score > 0.9
    assert isinstance(detector, CenterFace) and detector.scale == DEFAULT.scale


@pytest.mark.slow
def test_a_large_picture_is_searched_in_tiles_and_still_finds_a_small_face(
    detector: FaceFinder,
) -> None:
    big = cv2.resize(data.coffee(), (2400, 1600))  # over MAX_PIXELS: tiles at full size
    head = data.astronaut()[20:230, 130:320]
    small = cv2.resize(head, (head.shape[1] // 2, head.shape[0] // 2))  # a face of ~60 px
    big[900 : 900 + small.shape[0], 1700 : 1700 + small.shape[1]] = small
    (face,) = detector.detect(big)
    assert 1700 < (face.x0 + face.x1) / 2 < 1700 + small.shape[1]


@pytest.mark.slow
def test_the_default_meets_the_targets_on_a_reduced_eval(fetched: ModelRepository) -> None:
    """The eval of ``python -m benchmarks privacy`` on 6 faces (both heads, 4 LFW crops) at
    3 sizes under every distortion. Met here: at most one false alarm in the 20
    face-free photographs, recall >= 0.98 from 64 px. Not met (P8 asks 0.98 from 32
    px): at 32 px motion blur hides faces (the full eval's figures: docs/policy.md),
    so from 32 px the floor is 0.9, a regression guard."""
    report = run_faces(fetched, configurations=[_config(DEFAULT)], lfw=4, sizes=(32, 64, 192))
    result = report["results"][report["default"]]
    assert result["false_alarm_photos"] <= 1 and result["photos"] == 20
    assert result["recall_by_size"]["64"] >= 0.98 and result["recall_by_size"]["192"] >= 0.98
    assert result["recall_from_32px"] >= 0.9
    assert set(result["recall_by_distortion"]) == set(report["distortions"])


def test_the_configuration_knows_every_detector() -> None:
    from edge_agent.privacy.faces import spec_for

    assert {spec_for(name).model for name in DETECTORS} == set(DETECTORS)


def test_the_hidden_area_is_the_whole_head_with_a_margin(detector: FaceFinder) -> None:
    (face,) = detector.detect(data.astronaut())
    area = hidden_area(face, Redaction().mask_scale)
    x0, y0, x1, y1 = ASTRONAUT_HEAD
    assert area.x0 <= x0 and area.y0 <= y0 and area.x1 >= x1 and area.y1 >= y1


@pytest.mark.parametrize("mode", ["pixelate", "blur", "fill"])
def test_a_redacted_picture_passes_the_stronger_check(
    detector: FaceFinder, checker: FaceFinder, mode: str
) -> None:
    image = data.astronaut()
    redaction = Redaction(mode)
    redacted, remaining = redact_faces(image, detector.detect(image), checker, redaction)
    assert remaining == [] and checker.detect(redacted) == []
    x0, y0, x1, y1 = ASTRONAUT_HEAD  # the whole head is hidden, the rest left alone
    head = redacted[y0:y1, x0:x1].astype(int)
    assert np.abs(head - image[y0:y1, x0:x1]).mean() > 20
    assert np.mean(np.all(redacted == image, axis=2)) > 0.8
    if mode == "pixelate":  # blocks of a third of the face: few colours across the face
        fx0, fy0, fx1, fy1 = ASTRONAUT_FACE
        row = redacted[(fy0 + fy1) // 2, fx0:fx1]
        assert len(np.unique(row, axis=0)) <= 5


def test_the_checker_also_hides_a_face_the_detector_was_not_told_about(
    checker: FaceFinder,
) -> None:
    """Redaction with no boxes at all: the stronger eye still finds the face and hides it."""
    inspector = PrivacyInspector(checker, checker=checker)
    redacted, remaining = redact_faces(data.astronaut(), [], checker, inspector.redaction)
    assert remaining == [] and checker.detect(redacted) == []
    assert not np.array_equal(redacted, data.astronaut())


def test_boxes_are_carried_over_k_frames_each_way() -> None:
    face = Face(0, 0, 10, 10, 0.9)
    frames = [(i, [face] if i == 5 else []) for i in range(10)]
    hidden = dict(carried(frames, keep=2))
    assert [i for i, faces in hidden.items() if faces] == [3, 4, 5, 6, 7]
    assert list(hidden) == list(range(10))  # every frame comes out, in order


@pytest.mark.slow
def test_a_video_redaction_hides_a_moving_face_in_every_frame(
    tmp_path: Path, detector: FaceFinder, checker: FaceFinder
) -> None:
    report = run_video(detector, checker, seconds=0.6)
    for run in report["runs"]:
        assert run["frames"] == 15
        assert run["frames_left_visible"] == 0, run


def test_a_video_is_written_frame_for_frame_without_sound(
    tmp_path: Path, detector: FaceFinder, checker: FaceFinder
) -> None:
    source = tmp_path / "clip.mp4"
    truth = write_clip(source, seconds=0.4, faces=1)
    result = redact_video(source, tmp_path / "out.mp4", detector, checker, Redaction("fill"))
    assert result.frames == len(truth) == 10 and result.left_visible == 0
    assert result.frames_with_faces >= 9
    assert "audio is not carried" in result.to_dict()["note"]
    with pytest.raises(InputError, match="cannot read"):
        redact_video(tmp_path / "missing.mp4", tmp_path / "x.mp4", detector, None, Redaction())


def test_detector_and_checker_share_one_model(fetched: ModelRepository) -> None:
    detector, checker = open_detectors(fetched)
    assert isinstance(detector, CenterFace) and isinstance(checker, CenterFace)
    assert detector.session is checker.session and checker.threshold < detector.threshold


def test_the_faces_of_the_eval_are_real_faces(detector: FaceFinder) -> None:
    """Each head crop's face box is where CenterFace finds the face in it."""
    for crop in face_crops(0):
        (face,) = [f for f in detector.detect(crop.pixels) if f.score > 0.5]
        x0, y0, x1, y1 = crop.face
        assert abs((face.x0 + face.x1) / 2 - (x0 + x1) / 2) < 10, crop.name
        assert abs((face.y0 + face.y1) / 2 - (y0 + y1) / 2) < 12, crop.name


def test_the_configuration_and_the_profile_choose_the_detector(
    tmp_path: Path, fetched: ModelRepository
) -> None:
    from edge_agent.assemble import create_inspector
    from edge_agent.config import load_agent_config
    from edge_agent.policy.rules import parse_policy
    from edge_agent.privacy.blazeface import BlazeFace
    from edge_agent.profiles import ProfileStore
    from edge_core.errors import ConfigError
    from tests.support.paths import PROFILES

    profiles = ProfileStore(PROFILES)
    fill = parse_policy({"version": 1, "redaction": {"mode": "fill", "mask_scale": 2.0}})
    path = tmp_path / "agent.toml"
    path.write_text('[privacy]\ndetector = "blazeface"\ncheck_threshold = 0.3\n')
    chosen = create_inspector(
        load_agent_config(path), profiles.get("generic-x86_64"), fetched, fill
    )
    assert isinstance(chosen.detector, BlazeFace) and isinstance(chosen.checker, CenterFace)
    assert chosen.checker.threshold == 0.3 and chosen.redaction == Redaction("fill", 2.0)
    path.write_text("")  # the profile's choice: a Pi 4 searches at a lower scale
    pi4 = create_inspector(load_agent_config(path), profiles.get("raspberry-pi-4"), fetched, fill)
    assert isinstance(pi4.detector, CenterFace) and pi4.detector.scale == 0.75
    assert isinstance(pi4.checker, CenterFace) and pi4.checker.scale == 1.0
    path.write_text('[privacy]\ndetector = "haar"\n')
    with pytest.raises(ConfigError, match=r"privacy\.detector"):
        load_agent_config(path)


def test_the_exit_guard_checks_a_redacted_request_with_the_stronger_eye(
    detector: FaceFinder, checker: FaceFinder, fetched: ModelRepository
) -> None:
    """A picture whose face only the checker sees: the detector would let it pass as
    redacted; the guard does not."""
    from edge_agent.offload import ExitGuard
    from edge_agent.policy import PolicyRules
    from edge_core.errors import PrivacyRefusal
    from edge_core.protocol.types import InferRequest

    class Blind:
        def detect(self, rgb: np.ndarray) -> list[Face]:
            return []

    guard = ExitGuard(PrivacyInspector(Blind(), checker=checker), PolicyRules())
    request = InferRequest(inputs={"x": data.astronaut()}, datatypes={}, model_name="m")
    with pytest.raises(PrivacyRefusal, match="still shows faces"):
        guard.check(request, label="personal", redacted=True)
    guard.check(request, label=None, redacted=False)  # the blind detector: public, free


@pytest.mark.slow
@pytest.mark.parametrize(
    "picture", [data.astronaut(), data.coffee(), np.tile(data.astronaut(), (3, 4, 1))],
    ids=["astronaut", "coffee", "tiled-1536x2048"],
)  # fmt: skip
def test_centerface_finds_the_same_faces_in_onnx_and_tflite(
    fetched: ModelRepository, picture: np.ndarray
) -> None:
    """The TFLite variant (converted once from the ONNX file, for LiteRT-only devices)
    is the same detector: the same boxes within a pixel, the same scores within 1e-3,
    whole pictures and tiled ones alike."""
    found = {}
    for formats in (("onnx",), ("tflite",)):
        detector, _ = open_detectors(fetched, formats=formats)
        assert isinstance(detector, CenterFace)
        assert detector.session.backend == ("onnxruntime" if formats == ("onnx",) else "litert")
        found[formats[0]] = detector.detect(picture)
    assert len(found["onnx"]) == len(found["tflite"])
    for a, b in zip(found["onnx"], found["tflite"], strict=True):
        assert [a.x0, a.y0, a.x1, a.y1] == pytest.approx([b.x0, b.y0, b.x1, b.y1], abs=1.0)
        assert a.score == pytest.approx(b.score, abs=1e-3)
