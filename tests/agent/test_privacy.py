"""Privacy on real images: BlazeFace through LiteRT, redaction, text PII, the exit guard."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
from skimage import data

from edge_agent.offload import ExitGuard
from edge_agent.policy import PolicyRules
from edge_agent.preprocess import tensor_to_image
from edge_agent.privacy import FaceFinder, PrivacyInspector, find_pii, mask_pii
from edge_agent.privacy.blazeface import FULL_RANGE, SHORT_RANGE, BlazeFace, anchors
from edge_agent.privacy.faces import Face, nms
from edge_agent.privacy.redact import redact_faces
from edge_core.errors import PrivacyRefusal
from edge_core.pictures import image_to_tensor
from edge_core.protocol.types import InferRequest
from edge_core.repository import ModelRepository


@pytest.fixture(scope="module")
def blazeface(fetched: ModelRepository) -> BlazeFace:
    return BlazeFace(fetched)


@pytest.fixture(scope="module")
def detector(face_detectors: tuple[FaceFinder, FaceFinder]) -> FaceFinder:
    return face_detectors[0]


def test_anchor_counts_match_the_models() -> None:
    assert len(anchors(SHORT_RANGE)) == 896
    assert len(anchors(FULL_RANGE)) == 2304
    grid = anchors(SHORT_RANGE)
    assert grid[0].tolist() == pytest.approx([1 / 32, 1 / 32])  # the first cell of the 16x16 grid


def test_nms_keeps_the_best_of_overlapping_boxes() -> None:
    boxes = [Face(0, 0, 10, 10, 0.9), Face(1, 1, 11, 11, 0.8), Face(50, 50, 60, 60, 0.7)]
    assert [f.score for f in nms(boxes)] == [0.9, 0.7]


@pytest.mark.parametrize(
    ("image", "faces"), [("astronaut", 1), ("camera", 1), ("coffee", 0), ("chelsea", 0)]
)
def test_faces_in_scikit_image_photographs(
    blazeface: BlazeFace, detector: FaceFinder, image: str, faces: int
) -> None:
    assert len(blazeface.detect(getattr(data, image)())) == faces
    assert len(detector.detect(getattr(data, image)())) == faces


def test_blazeface_finds_the_astronauts_face_where_it_is(blazeface: BlazeFace) -> None:
    (face,) = blazeface.detect(data.astronaut())
    # Eileen Collins' face: centred near (225, 125) in the 512x512 picture
    assert 200 < (face.x0 + face.x1) / 2 < 250 and 100 < (face.y0 + face.y1) / 2 < 150
    assert 60 < face.width < 140 and face.score > 0.9


def test_redaction_leaves_no_detectable_face_and_the_rest_untouched(detector: FaceFinder) -> None:
    image = data.astronaut()
    faces = detector.detect(image)
    redacted, remaining = redact_faces(image, faces, detector)
    assert remaining == [] and detector.detect(redacted) == []
    changed = np.any(redacted != image, axis=2)
    ys, xs = np.nonzero(changed)
    face = faces[0]
    assert xs.min() >= face.x0 - face.width and xs.max() <= face.x1 + face.width
    assert ys.min() >= face.y0 - face.height and ys.max() <= face.y1 + face.height
    assert changed.mean() < 0.15  # only around the face


def test_redaction_checks_the_picture_as_it_will_be_seen_where_it_goes() -> None:
    """A checker that sees a face only in what the encoding makes of the picture (the
    redacted astronaut had one at 0.06 in its JPEG, none in its pixels): checked as
    seen, that region is hidden too."""
    from edge_agent.privacy.redact import Redaction

    box = Face(40, 40, 80, 80, 0.3)

    class SeesArtefacts:
        def detect(self, rgb: np.ndarray) -> list[Face]:
            encoded = rgb[0, 0, 0] == 7  # the mark the round trip below leaves
            shown = rgb[40:80, 40:80].max() > 0
            return [box] if encoded and shown else []

    def jpeg_round_trip(rgb: np.ndarray) -> np.ndarray:
        out = rgb.copy()
        out[0, 0, 0] = 7
        return out

    picture = np.full((120, 120, 3), 128, np.uint8)
    fill = Redaction("fill", 1.0)
    as_pixels, left = redact_faces(picture, [], SeesArtefacts(), fill)
    assert left == [] and as_pixels is picture  # nothing seen, nothing hidden
    as_seen, left = redact_faces(picture, [], SeesArtefacts(), fill, seen=jpeg_round_trip)
    assert left == [] and as_seen[40:80, 40:80].max() == 0  # hidden
    assert as_seen[100:, 100:].min() == 128  # the rest untouched


def test_text_pii_is_found_and_masked() -> None:
    text = (
        "Write to jane.doe@example.com or call +44 20 7946 0958. Card 4111 1111 1111 1111, "
        "IBAN DE89 3704 0044 0532 0130 00, SSN 123-45-6789."
    )
    masked, matches = mask_pii(text)
    assert [m.kind for m in matches] == ["email", "phone", "card", "iban", "national_id"]
    assert (
        masked == "Write to [EMAIL] or call [PHONE]. Card [CARD], IBAN [IBAN], SSN [NATIONAL_ID]."
    )


@pytest.mark.parametrize(
    "text",
    [
        "Order 12345 shipped on 2024-05-06 at 10:30.",
        "The card 4111 1111 1111 1112 fails the Luhn check.",
        "Version 1.2.3, build 20240506.",
        "Temperature 23.5 C at 14:05, humidity 45%, 3 sensors online.",
    ],
)
def test_ordinary_numbers_are_not_pii(text: str) -> None:
    assert find_pii(text) == []


def test_image_tensors_map_back_to_pictures(fetched: ModelRepository) -> None:
    pre = fetched.get("ppocr-det").preprocessing
    assert pre is not None
    bgr = cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)
    tensor = image_to_tensor(bgr, pre)
    view = tensor_to_image(tensor[0], pre)
    assert view is not None
    assert np.abs(view.rgb.astype(int) - data.astronaut().astype(int)).max() <= 1
    assert np.allclose(view.encode(view.rgb), tensor[0], atol=1e-2)
    guessed = tensor_to_image(tensor[0], None)
    assert guessed is not None and guessed.rgb.shape == (512, 512, 3)
    assert tensor_to_image(np.zeros(64, np.float32), None) is None


def test_inspector_finds_and_redacts_faces_in_tensors(
    fetched: ModelRepository, detector: FaceFinder
) -> None:
    pre = fetched.get("ppocr-det").preprocessing
    inspector = PrivacyInspector(detector)
    bgr = cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR)
    inputs = {"x": image_to_tensor(bgr, pre)}
    findings = inspector.inspect(inputs, pre)
    assert findings.kinds == {"faces"} and findings.face_count == 1
    redacted, after = inspector.redact(inputs, findings, pre)
    assert after.kinds == frozenset() and after.images == 1
    assert redacted["x"].shape == inputs["x"].shape and redacted["x"].dtype == np.float32
    assert inputs["x"] is not redacted["x"]  # the original is left as it was


def test_inspector_masks_text() -> None:
    inspector = PrivacyInspector(None)
    inputs = {"text": np.array([b"mail me at a.b@example.org", b"nothing here"], dtype=object)}
    findings = inspector.inspect(inputs)
    assert findings.pii == {"text": ["email"]}
    redacted, after = inspector.redact(inputs, findings)
    assert redacted["text"].tolist() == [b"mail me at [EMAIL]", b"nothing here"]
    assert after.kinds == frozenset()


def request(inputs: dict[str, np.ndarray]) -> InferRequest:
    return InferRequest(inputs=inputs, datatypes={}, model_name="ppocr-det")


def test_exit_guard_refuses_and_counts(fetched: ModelRepository, detector: FaceFinder) -> None:
    pre = fetched.get("ppocr-det").preprocessing
    guard = ExitGuard(PrivacyInspector(detector), PolicyRules(), preprocessing=lambda model: pre)
    face = {"x": image_to_tensor(cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR), pre)}
    no_face = {"x": image_to_tensor(cv2.cvtColor(data.coffee(), cv2.COLOR_RGB2BGR), pre)}
    with pytest.raises(PrivacyRefusal, match="refused to send a 'sensitive' request"):
        guard.check(request(no_face), label="sensitive", redacted=True)
    with pytest.raises(PrivacyRefusal, match="'personal' request that was not redacted"):
        guard.check(request(face), label=None, redacted=False)  # faces make it personal
    with pytest.raises(PrivacyRefusal, match="still shows faces"):
        guard.check(request(face), label="personal", redacted=True)  # marked redacted, but is not
    guard.check(request(no_face), label=None, redacted=False)  # public and clean: allowed
    digits = {"pixels": np.zeros((1, 64), np.float32)}
    guard.check(
        InferRequest(inputs=digits, datatypes={}, model_name="digits-heavy"),
        label=None,
        redacted=False,
    )
    assert guard.refusals == {"sensitive": 1, "not_redacted": 1, "still_identifiable": 1}


def test_exit_guard_without_a_detector_refuses_pictures() -> None:
    guard = ExitGuard(PrivacyInspector(None), PolicyRules())
    picture = {"x": np.random.default_rng(0).uniform(-1, 1, (1, 3, 64, 64)).astype(np.float32)}
    with pytest.raises(PrivacyRefusal, match="cannot be searched for faces"):
        guard.check(request(picture), label=None, redacted=False)
    assert guard.refusals == {"unsearchable": 1}


def rgba(image: np.ndarray) -> np.ndarray:
    return np.concatenate([image, np.full((*image.shape[:2], 1), 255, np.uint8)], axis=2)


@pytest.mark.parametrize(
    "layout",
    [
        lambda a: a,  # one HWC picture, no batch dimension
        lambda a: a.astype(np.float32) / 255,
        lambda a: cv2.cvtColor(a, cv2.COLOR_RGB2GRAY),  # 2-D grey
        lambda a: cv2.cvtColor(a, cv2.COLOR_RGB2GRAY)[None],  # a batch of grey pictures
        lambda a: rgba(a)[None],  # with an alpha channel
        lambda a: a.transpose(2, 0, 1)[None, None].astype(np.float32),  # 5-D
    ],
)
def test_every_picture_layout_is_searched_and_redacted(detector: FaceFinder, layout) -> None:  # type: ignore[no-untyped-def]
    array = layout(data.astronaut())
    inspector = PrivacyInspector(detector)
    findings = inspector.inspect({"x": array})
    assert findings.kinds == {"faces"}
    redacted, after = inspector.redact({"x": array}, findings)
    assert after.kinds == frozenset() and after.images == 1
    assert redacted["x"].shape == array.shape and redacted["x"].dtype == array.dtype
    guard = ExitGuard(inspector, PolicyRules())
    with pytest.raises(PrivacyRefusal, match="not redacted"):
        guard.check(request({"x": array}), label=None, redacted=False)
    guard.check(request(redacted), label=None, redacted=True)


def test_a_tensor_that_may_be_a_picture_but_cannot_be_read_is_refused(
    detector: FaceFinder,
) -> None:
    two_channels = np.stack([data.camera()] * 2, axis=2)[None]
    guard = ExitGuard(PrivacyInspector(detector), PolicyRules())
    with pytest.raises(PrivacyRefusal, match="cannot be searched"):
        guard.check(request({"x": two_channels}), label=None, redacted=False)
    # unless the operator lets faces leave freely
    relaxed = ExitGuard(
        PrivacyInspector(detector),
        PolicyRules(finding_labels={"faces": "public", "pii": "sensitive"}),
    )
    relaxed.check(request({"x": two_channels}), label=None, redacted=False)
