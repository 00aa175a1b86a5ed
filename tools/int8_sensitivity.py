"""Which layers an INT8 build loses its agreement in: the FP32 model of a built package
quantized again with some convolutions kept in FP32, each way's IoU of the thresholded
maps against FP32 and its p50 at batch 1, side by side in one run.

Made for PP-OCRv4 det (MISSION P12: INT8 at an IoU of 0.79 where 0.9 is wanted), after
``make bench-ppocr``::

    python tools/int8_sensitivity.py

It asks whether a few layers carry the error (the head, the stem), which a build could
leave in FP32, or whether it is spread through the network (then only
quantization-aware training helps), and prints each picture's IoU for the build with
every layer in INT8 (which pictures lose their text). The same quantizer as
``edge-agent models build`` (static QDQ, MinMax, weights per channel, our graph
preparation); images preprocessed as ``tools/ppocr-det.preprocessing.toml`` says (BGR,
480x640, [-1, 1]).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.toolchain import convert

RESULTS = Path("bench-results")
BUILT = RESULTS / "models/ppocr-det/2/model.fp32.onnx"
Array = np.ndarray[Any, Any]


def _picture(path: Path) -> Array:
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise SystemExit(f"{path}: not a picture OpenCV reads")
    image = cv2.resize(image, (640, 480), interpolation=cv2.INTER_LINEAR)
    scaled = (image.astype(np.float32) / 255.0 - 0.5) / 0.5
    picture: Array = scaled.transpose(2, 0, 1)[None]
    return picture


def _items(folder: Path) -> list[dict[str, Array]]:
    return [{"x": _picture(path)} for path in sorted(folder.iterdir()) if path.is_file()]


def _session(data: bytes) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _p50s_ms(
    sessions: dict[str, Any], item: dict[str, Array], rounds: int = 20
) -> dict[str, float]:
    """Each session's p50 on ``item``, run round-robin (the machine's speed drifts)."""
    for session in sessions.values():
        for _ in range(3):
            session.run(None, item)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(rounds):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, item)
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) * 1e3 for name, t in times.items()}


def _iou(reference: Sequence[Array], outputs: Sequence[Array], threshold: float) -> float:
    both = either = 0
    for ref, out in zip(reference, outputs, strict=True):
        a, b = ref > threshold, out > threshold
        both += int((a & b).sum())
        either += int((a | b).sum())
    return both / max(either, 1)


def _nth(nodes: Sequence[Any], convs: Sequence[str], k: int) -> int:
    """The index in ``nodes`` of the ``k``-th convolution (1-based)."""
    return next(i for i, node in enumerate(nodes) if node.name == convs[k - 1])


def main(argv: Sequence[str] | None = None) -> int:
    import onnx

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", type=Path, default=RESULTS / "models/ppocr-det/2/model.fp32.onnx"
    )
    parser.add_argument("--data", type=Path, default=RESULTS / "ppocr-data")
    parser.add_argument("--threshold", type=float, default=0.3)
    args = parser.parse_args(argv)
    if not args.model.is_file():
        parser.error(f"{args.model} is missing: run `make bench-ppocr` first")
    data = args.model.read_bytes()
    calibration, evaluation = _items(args.data / "calibration"), _items(args.data / "eval")
    names = [path.stem for path in sorted((args.data / "eval").iterdir()) if path.is_file()]
    reference_session = _session(data)
    reference = [reference_session.run(None, item)[0] for item in evaluation]
    nodes = list(onnx.load_from_string(data).graph.node)
    convs = [n.name for n in nodes if n.op_type in ("Conv", "ConvTranspose")]
    others = [n.name for n in nodes if n.op_type not in ("Conv", "ConvTranspose")]
    ways = {
        "every layer INT8": [],
        "the last 4 convolutions FP32 (the head)": convs[-4:],
        "the last 8 convolutions FP32": convs[-8:],
        "the last 16 convolutions FP32": convs[-16:],
        "the first 2 and the last 8 FP32": convs[:2] + convs[-8:],
        **{
            f"all up to the {k}th convolution FP32": [n.name for n in nodes[: index + 1]]
            for k, index in ((4, _nth(nodes, convs, 4)), (8, _nth(nodes, convs, 8)))
        },
        "only convolutions INT8": others,
    }
    every: list[Array] = []  # the outputs with every layer in INT8
    sessions, ious = {"FP32": reference_session}, {}
    for label, excluded in ways.items():
        sessions[label] = _session(convert.int8_static(data, calibration, keep_fp32=excluded))
        outputs = [sessions[label].run(None, item)[0] for item in evaluation]
        ious[label] = _iou(reference, outputs, args.threshold)
        if not excluded:
            every = outputs
    ms = _p50s_ms(sessions, evaluation[0])
    print(
        f"{args.model}: {len(nodes)} nodes, {len(convs)} convolutions; FP32 p50 {ms['FP32']:.2f} ms"
    )
    print(f"{'INT8 build':42s} {'kept FP32':>9s} {'IoU':>7s} {'p50 ms':>7s} {'x FP32':>6s}")
    for label, excluded in ways.items():
        print(
            f"{label:42s} {len(excluded):9d} {ious[label]:7.4f} {ms[label]:7.2f} "
            f"{ms['FP32'] / ms[label]:6.2f}"
        )
    print("each picture, every layer INT8 (text pixels in FP32: IoU)")
    for name, ref, out in zip(names, reference, every, strict=True):
        pixels = int((ref > args.threshold).sum())
        if pixels:
            print(f"  {name:20s} {pixels:7d}: {_iou([ref], [out], args.threshold):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
