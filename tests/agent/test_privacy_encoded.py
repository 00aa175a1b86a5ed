"""Encoded image files in byte tensors: searched, refused or redacted, never let through.

A picture can travel as its file's bytes (a ``BYTES`` element, or a flat
``uint8`` tensor) instead of a pixel tensor. These tests send scikit-image's
astronaut that way, with EXIF naming the person, through the inspector, the exit
guard and the whole agent (recording what reaches the transport, our seam).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pytest
from PIL import Image
from skimage import data

from edge_agent.agent import DEFAULT_POLICY, Agent
from edge_agent.offload import ExitGuard, OffloadClient, Transport
from edge_agent.policy import Action, PolicyRules, load_policy
from edge_agent.privacy import FaceFinder, PrivacyInspector, encoded_images
from edge_agent.privacy.encoded import carries_metadata, decode
from edge_agent.profiles import ProfileStore
from edge_agent.profiles.state import DeviceState
from edge_core.errors import PolicyRejected, PrivacyRefusal
from edge_core.images import image_format
from edge_core.protocol.types import InferRequest, InferResponse
from edge_core.repository import ModelRepository
from tests.support.paths import MODELS, PROFILES

ARTIST = 0x013B  # the EXIF tag that names who took (or is in) the picture


@pytest.fixture(scope="module")
def detector(face_detectors: tuple[FaceFinder, FaceFinder]) -> FaceFinder:
    return face_detectors[0]


def image_file(rgb: np.ndarray, fmt: str = "JPEG", **options: Any) -> bytes:
    exif = Image.Exif()
    exif[ARTIST] = "Eileen Collins"
    buffer = io.BytesIO()
    Image.fromarray(rgb).save(buffer, fmt, exif=exif, **options)
    return buffer.getvalue()


def exif_of(blob: bytes) -> dict[int, Any]:
    return dict(Image.open(io.BytesIO(blob)).getexif())


def as_bytes_tensor(blob: bytes) -> np.ndarray:
    array = np.empty(1, dtype=object)
    array[0] = blob
    return array


def as_uint8_tensor(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, np.uint8).copy()


def the_file(array: np.ndarray) -> bytes:
    """The (first) image file an input carries, as the gateway would read it."""
    return bytes(array.ravel()[0]) if array.dtype == object else array.tobytes()


ASTRONAUT_JPEG = image_file(data.astronaut())
TENSORS = pytest.mark.parametrize(
    "wrap", [as_bytes_tensor, as_uint8_tensor], ids=["BYTES", "uint8"]
)


def request(inputs: dict[str, np.ndarray], model: str = "ppocr-det") -> InferRequest:
    return InferRequest(inputs=inputs, datatypes={}, model_name=model)


def test_image_signatures_and_metadata() -> None:
    rgb = data.astronaut()[:64, :64].copy()
    assert exif_of(ASTRONAUT_JPEG) == {ARTIST: "Eileen Collins"}
    for fmt, name in [("JPEG", "jpeg"), ("PNG", "png"), ("WEBP", "webp"), ("TIFF", "tiff")]:
        blob = image_file(rgb, fmt)
        assert image_format(blob) == name and carries_metadata(blob), fmt
        assert decode(blob) is not None
    for fmt, name in [("BMP", "bmp"), ("GIF", "gif")]:
        buffer = io.BytesIO()
        Image.fromarray(rgb).save(buffer, fmt)
        assert image_format(buffer.getvalue()) == name
    plain = io.BytesIO()
    Image.fromarray(rgb).save(plain, "PNG")
    assert not carries_metadata(plain.getvalue())
    for text in [b"BMW makes cars", b"hello", b"RIFF....WAVE", b""]:
        assert image_format(text) is None
    assert decode(b"\xff\xd8\xff\xe0 not really a JPEG") is None


@TENSORS
def test_an_encoded_image_is_searched_for_faces(detector: FaceFinder, wrap: Any) -> None:
    inspector = PrivacyInspector(detector)
    findings = inspector.inspect({"image": wrap(ASTRONAUT_JPEG)})
    assert findings.kinds == {"faces"} and findings.face_count == 1 and findings.images == 1
    assert findings.metadata == ["image"]
    coffee = image_file(data.coffee())
    clean = inspector.inspect({"image": wrap(coffee)})
    assert clean.kinds == frozenset() and clean.images == 1


@TENSORS
def test_an_encoded_sensitive_image_is_refused_at_the_exit(detector: FaceFinder, wrap: Any) -> None:
    guard = ExitGuard(PrivacyInspector(detector), PolicyRules())
    face = request({"image": wrap(ASTRONAUT_JPEG)})
    with pytest.raises(PrivacyRefusal, match="refused to send a 'sensitive' request"):
        guard.check(face, label="sensitive", redacted=True)
    with pytest.raises(PrivacyRefusal, match="'personal' request that was not redacted"):
        guard.check(face, label=None, redacted=False)  # the face makes it personal
    with pytest.raises(PrivacyRefusal, match="still shows faces, image metadata"):
        guard.check(face, label="personal", redacted=True)  # claimed, not done
    assert guard.refusals == {"sensitive": 1, "not_redacted": 1, "still_identifiable": 1}


@TENSORS
def test_redacting_an_encoded_image_leaves_no_face_and_no_exif(
    detector: FaceFinder, wrap: Any
) -> None:
    inspector = PrivacyInspector(detector)
    inputs = {"image": wrap(ASTRONAUT_JPEG)}
    redacted, after = inspector.redact(inputs, inspector.inspect(inputs))
    assert after.kinds == frozenset() and after.images == 1 and after.metadata == []
    assert redacted["image"].dtype == inputs["image"].dtype
    blob = the_file(redacted["image"])
    assert image_format(blob) == "jpeg" and exif_of(blob) == {}
    rgb = decode(blob)
    assert rgb is not None and rgb.shape == (512, 512, 3)
    assert detector.detect(rgb) == []
    # the rest of the picture is still there
    original = decode(ASTRONAUT_JPEG)
    assert original is not None
    assert np.mean(np.abs(rgb.astype(int) - original.astype(int)).max(axis=2) < 24) > 0.85
    ExitGuard(inspector, PolicyRules()).check(request(redacted), label=None, redacted=True)


def test_text_and_images_in_one_bytes_tensor_are_handled_each_as_it_is(
    detector: FaceFinder,
) -> None:
    inspector = PrivacyInspector(detector)
    array = np.empty(2, dtype=object)
    array[:] = [b"write to jane.doe@example.com", ASTRONAUT_JPEG]
    findings = inspector.inspect({"mixed": array})
    assert findings.kinds == {"faces", "pii"} and findings.pii == {"mixed": ["email"]}
    redacted, after = inspector.redact({"mixed": array}, findings)
    assert after.kinds == frozenset()
    assert redacted["mixed"][0] == b"write to [EMAIL]"
    assert exif_of(redacted["mixed"][1]) == {} and decode(redacted["mixed"][1]) is not None


@pytest.mark.parametrize(
    "blob",
    [
        b"\xff\xd8\xff\xe0" + bytes(range(256)) * 4,  # a JPEG header, then garbage
        ASTRONAUT_JPEG[: len(ASTRONAUT_JPEG) // 50],  # cut short
        "animated",  # several frames: one cannot be redacted and re-encoded as the rest
    ],
    ids=["garbage", "truncated", "animated"],
)
@TENSORS
def test_an_image_that_cannot_be_decoded_is_refused(
    detector: FaceFinder, wrap: Any, blob: Any
) -> None:
    if blob == "animated":
        frames = [Image.fromarray(data.coffee()), Image.fromarray(data.astronaut())]
        buffer = io.BytesIO()
        frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
        blob = buffer.getvalue()
    inspector = PrivacyInspector(detector)
    findings = inspector.inspect({"image": wrap(blob)})
    assert findings.unsearchable == ["image"]
    guard = ExitGuard(inspector, PolicyRules())
    with pytest.raises(PrivacyRefusal, match="cannot be searched for faces"):
        guard.check(request({"image": wrap(blob)}), label=None, redacted=False)
    assert guard.refusals == {"unsearchable": 1}
    # redaction cannot make it searchable either
    redacted, after = inspector.redact({"image": wrap(blob)}, findings)
    assert after.unsearchable == ["image"] and the_file(redacted["image"]) == blob
    # where the operator lets faces leave freely, it may go
    relaxed = PolicyRules(finding_labels={"faces": "public", "pii": "sensitive"})
    ExitGuard(inspector, relaxed).check(request({"image": wrap(blob)}), label=None, redacted=False)


@TENSORS
def test_without_a_face_detector_an_encoded_image_is_refused(wrap: Any) -> None:
    guard = ExitGuard(PrivacyInspector(None), PolicyRules())
    with pytest.raises(PrivacyRefusal, match="cannot be searched for faces"):
        guard.check(request({"image": wrap(ASTRONAUT_JPEG)}), label=None, redacted=False)


def test_other_bytes_are_not_taken_for_images(detector: FaceFinder) -> None:
    inspector = PrivacyInspector(detector)
    text = np.array([b"BMW and RIFF are words", b"GIF is a format"], dtype=object)
    raw = np.arange(64, dtype=np.uint8)
    findings = inspector.inspect({"text": text, "raw": raw})
    assert findings.unsearchable == [] and findings.images == 0
    assert encoded_images(text) == {} and encoded_images(raw) == {}
    # a fixed-width bytes array keeps a BMP's trailing zero bytes
    buffer = io.BytesIO()
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(buffer, "BMP")
    fixed = np.array([buffer.getvalue()], dtype=bytes)
    assert encoded_images(fixed) == {0: buffer.getvalue()}


class RecordingTransport(Transport):
    """Our transport seam: keeps what would have left the device."""

    name = "recording"

    def __init__(self) -> None:
        self.sent: list[InferRequest] = []

    def infer(
        self, request: InferRequest, *, timeout: float, request_id: str = ""
    ) -> InferResponse:
        self.sent.append(request)
        return InferResponse(request.model_name, "1", {"y": np.zeros((1, 1), np.float32)})


@TENSORS
def test_through_the_agent_what_leaves_shows_no_face_and_no_exif(
    fetched: ModelRepository, detector: FaceFinder, wrap: Any
) -> None:
    rules = load_policy(DEFAULT_POLICY)
    inspector = PrivacyInspector(detector)
    transport = RecordingTransport()
    agent = Agent(
        profile=ProfileStore(PROFILES).get("generic-x86_64"),
        repository=ModelRepository(MODELS),
        rules=rules,
        offload=OffloadClient(transport, guard=ExitGuard(inspector, rules)),
        inspector=inspector,
        device_state=lambda: DeviceState(),
    )
    try:
        # a model the device does not hold: its picture leaves as the file it came as
        result = agent.infer("cloud-ocr", {"image": wrap(ASTRONAUT_JPEG)})
        assert result.decision.action == Action.OFFLOAD_REDACTED and result.where == "cloud"
        assert result.findings is not None and result.findings.face_count == 1
        (sent,) = transport.sent
        blob = the_file(sent.inputs["image"])
        assert exif_of(blob) == {} and not carries_metadata(blob)
        rgb = decode(blob)
        assert rgb is not None and detector.detect(rgb) == []
        with pytest.raises(PolicyRejected, match="may_not_leave"):
            agent.infer("cloud-ocr", {"image": wrap(ASTRONAUT_JPEG)}, label="sensitive")
        assert len(transport.sent) == 1  # the sensitive one never reached the transport
    finally:
        agent.close()


def test_a_flat_uint8_picture_is_still_searched_as_a_picture(
    fetched: ModelRepository, detector: FaceFinder
) -> None:
    """Only file bytes take the encoded path: a row of raw pixels is a picture."""
    from edge_core.package import ImagePreprocessing

    grey = np.asarray(Image.fromarray(data.astronaut()).convert("L"))
    pre = ImagePreprocessing(
        input="pixels", layout="NF", color="gray", size=(512, 512), value_range=(0.0, 255.0)
    )
    flat = grey.reshape(1, -1)
    findings = PrivacyInspector(detector).inspect({"pixels": flat}, pre)
    assert findings.kinds == {"faces"} and findings.unsearchable == []


@pytest.mark.parametrize(
    "prefix", [b"data:image/jpeg;base64,", b""], ids=["data-url", "bare-base64"]
)
def test_a_picture_sent_as_base64_text_is_searched_and_redacted(
    detector: FaceFinder, prefix: bytes
) -> None:
    import base64

    inspector = PrivacyInspector(detector)
    array = np.empty(2, dtype=object)
    array[:] = [b"a caption", (prefix + base64.b64encode(ASTRONAUT_JPEG)).decode()]
    findings = inspector.inspect({"json": array})
    assert findings.kinds == {"faces"} and findings.face_count == 1
    guard = ExitGuard(inspector, PolicyRules())
    with pytest.raises(PrivacyRefusal, match="not redacted"):
        guard.check(request({"json": array}), label=None, redacted=False)
    redacted, after = inspector.redact({"json": array}, findings)
    assert after.kinds == frozenset() and after.metadata == []
    sent = redacted["json"][1]
    assert sent.startswith(prefix)
    blob = base64.b64decode(sent[len(prefix) :])
    rgb = decode(blob)
    assert exif_of(blob) == {} and rgb is not None and detector.detect(rgb) == []
    guard.check(request(redacted), label=None, redacted=True)


def test_a_data_url_that_does_not_decode_is_refused(detector: FaceFinder) -> None:
    inspector = PrivacyInspector(detector)
    array = np.array(["data:image/png;base64,not really a picture!"], dtype=object)
    assert inspector.inspect({"json": array}).unsearchable == ["json"]
    with pytest.raises(PrivacyRefusal, match="cannot be searched for faces"):
        ExitGuard(inspector, PolicyRules()).check(
            request({"json": array}), label=None, redacted=False
        )


@pytest.mark.parametrize("variant", ["unpadded", "url-safe", "wrapped"])
def test_base64_in_its_other_spellings_is_searched_too(detector: FaceFinder, variant: str) -> None:
    import base64

    text = base64.b64encode(ASTRONAUT_JPEG)
    if variant == "unpadded":
        padded = next(  # trailing zeros after a JPEG's end are ignored by decoders
            base64.b64encode(ASTRONAUT_JPEG + b"\0" * n)
            for n in range(3)
            if len(ASTRONAUT_JPEG + b"\0" * n) % 3
        )
        text = padded.rstrip(b"=")
        assert len(text) % 4
    elif variant == "url-safe":
        text = base64.urlsafe_b64encode(ASTRONAUT_JPEG)
        assert b"-" in text or b"_" in text
    else:
        text = b"\n".join(text[i : i + 76] for i in range(0, len(text), 76))  # MIME lines
    inspector = PrivacyInspector(detector)
    findings = inspector.inspect({"json": np.array([text], dtype=object)})
    assert findings.kinds == {"faces"} and findings.face_count == 1


def test_bare_base64_that_says_picture_but_does_not_decode_is_refused(
    detector: FaceFinder,
) -> None:
    inspector = PrivacyInspector(detector)
    array = np.array([b"/9j/" + b"A" * 40 + b"!!"], dtype=object)  # a JPEG's start, then junk
    assert inspector.inspect({"json": array}).unsearchable == ["json"]
    plain = np.array([b"Qk is how a word may start", b"hello"], dtype=object)
    assert inspector.inspect({"json": plain}).unsearchable == []


def test_a_batch_of_image_files_in_uint8_rows_is_searched_and_redacted(
    detector: FaceFinder,
) -> None:
    coffee = image_file(data.coffee())
    width = max(len(ASTRONAUT_JPEG), len(coffee)) + 100
    rows = np.zeros((2, width), np.uint8)  # each file padded with zeros to one width
    for i, blob in enumerate((ASTRONAUT_JPEG, coffee)):
        rows[i, : len(blob)] = np.frombuffer(blob, np.uint8)
    inspector = PrivacyInspector(detector)
    findings = inspector.inspect({"files": rows})
    assert findings.images == 2 and findings.face_count == 1 and findings.metadata == ["files"]
    guard = ExitGuard(inspector, PolicyRules())
    with pytest.raises(PrivacyRefusal, match="not redacted"):
        guard.check(request({"files": rows}), label=None, redacted=False)
    redacted, after = inspector.redact({"files": rows}, findings)
    assert after.kinds == frozenset() and after.metadata == [] and after.images == 2
    out = redacted["files"]
    assert out.dtype == np.uint8 and out.shape[0] == 2
    for row in out:
        blob = row.tobytes()
        rgb = decode(blob)
        assert rgb is not None and detector.detect(rgb) == [] and exif_of(blob) == {}
    guard.check(request(redacted), label=None, redacted=True)


def test_a_picture_whose_pixels_spell_a_signature_is_still_a_picture(
    detector: FaceFinder,
) -> None:
    """A pixel of (255, 216, 255) reads like a JPEG's first bytes: the picture is still
    searched as one, not taken for files that do not decode."""
    rgb = data.astronaut().copy()
    rgb[0, 0] = (255, 216, 255)
    inspector = PrivacyInspector(detector)
    findings = inspector.inspect({"image": rgb[None]})
    assert findings.unsearchable == [] and findings.face_count == 1
    grey = np.full((64, 64), 200, np.uint8)  # 2-D, rows of 64 bytes: one may spell a JPEG
    grey[5, :3] = (0xFF, 0xD8, 0xFF)
    assert inspector.inspect({"grey": grey}).unsearchable == ["grey"]  # refused, not passed
