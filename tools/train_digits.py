"""Train and export the sample models ``digits-light`` and ``digits-heavy``.

(Over 400 lines: one script trains both models and exports every format and
precision of each, with its measured accuracy; it runs only when the models change.)

Needs the ``convert`` extra (TensorFlow, scikit-learn, onnx); the exported
packages are committed under ``models/``, so nothing else ever needs them::

    pip install -e ".[convert]"
    python tools/train_digits.py --out models

The data is scikit-learn's bundled ``load_digits`` (8x8 grey digits, values
0..16, white on black), split 80/20 with a fixed seed; the 20% held-out split
is never trained on and every accuracy in the manifests is measured on it.

- ``digits-light``: an MLP (64 -> 32 -> 10) for devices. Variants: ONNX FP32,
  FP16, INT8 (static, calibrated through ``onnxruntime.quantization``) and
  TFLite FP32 and full-integer INT8 (TensorFlow's converter).
- ``digits-heavy``: a CNN for the cloud. The 8x8 digit is upsampled to 32x32
  and goes through six 3x3 convolutions (~152 M multiply-adds), so compute
  dominates a single request (over 1 ms at batch 1 on one x86 core), as it
  would for a real cloud model. Dynamic batch dimension. ONNX FP32 and INT8.

Both models are trained with Keras; the ONNX graphs are written from the
trained weights with ``onnx.helper`` (a handful of standard operators) and the
tool checks that ONNX Runtime reproduces Keras' outputs before writing
anything. The 1/16 input scaling is folded into the first layer's weights,
so the models take the data set's raw 0..16 values.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_core.package import ImagePreprocessing, ModelPackage, Tolerance, Variant
from edge_core.tensors import TensorSpec

SEED = 0
HELDOUT_SHARE = 0.2
GOLDEN_COUNT = 16
INPUT = "pixels"
OUTPUT = "probabilities"
LABELS = tuple(str(d) for d in range(10))
ONNX_OPSET = 17
# Floors of the golden-output tolerances: a variant's outputs may differ from
# the FP32 reference by this much on any machine (rounding of FP16, integer
# kernels that differ by one quantum across CPUs), on top of twice the
# difference measured here.
TOLERANCE_FLOOR = {"fp32": 1e-5, "fp16": 2e-3, "int8": 1.0 / 64}

Array = np.ndarray[Any, Any]


def load_split() -> tuple[Array, Array, Array, Array]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32),
        y.astype(np.int64),
        test_size=HELDOUT_SHARE,
        stratify=y,
        random_state=SEED,
    )
    return x_train, x_test, y_train, y_test


def augment(x: Array, rng: np.random.Generator) -> Array:
    """Shift each 8x8 digit by up to one pixel (more data for the CNN)."""
    images = x.reshape(-1, 8, 8)
    padded = np.pad(images, ((0, 0), (1, 1), (1, 1)))
    dy = rng.integers(0, 3, len(images))
    dx = rng.integers(0, 3, len(images))
    out = np.stack([p[a : a + 8, b : b + 8] for p, a, b in zip(padded, dy, dx, strict=True)])
    return out.reshape(-1, 64)


# -- Keras models --------------------------------------------------------------


def train_light(x: Array, y: Array) -> Any:
    import keras

    keras.utils.set_random_seed(SEED)
    model = keras.Sequential(
        [
            keras.Input((64,), name=INPUT),
            keras.layers.Dense(32, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x / 16.0, y, epochs=60, batch_size=32, verbose=0)
    return model


def train_heavy(x: Array, y: Array) -> Any:
    import keras

    keras.utils.set_random_seed(SEED)
    rng = np.random.default_rng(SEED)
    conv = {"kernel_size": 3, "padding": "same", "activation": "relu"}
    model = keras.Sequential(
        [
            keras.Input((64,), name=INPUT),
            keras.layers.Reshape((8, 8, 1)),
            keras.layers.UpSampling2D(4),
            keras.layers.Conv2D(32, **conv),
            keras.layers.Conv2D(64, **conv),
            keras.layers.MaxPooling2D(2),
            keras.layers.Conv2D(128, **conv),
            keras.layers.Conv2D(128, **conv),
            keras.layers.Conv2D(128, **conv),
            keras.layers.Conv2D(128, **conv),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    for epoch in range(30):
        if epoch == 20:
            model.optimizer.learning_rate.assign(2e-4)
        xs = np.concatenate([x, augment(x, rng)])
        ys = np.concatenate([y, y])
        model.fit(xs / 16.0, ys, epochs=1, batch_size=32, verbose=0, shuffle=True)
    return model


# -- ONNX export -----------------------------------------------------------------


class OnnxWriter:
    """Writes a Keras Sequential model of the few layer kinds used here as ONNX."""

    def __init__(self, dtype: str) -> None:
        from onnx import TensorProto

        self.np_dtype = np.float16 if dtype == "fp16" else np.float32
        self.onnx_dtype = TensorProto.FLOAT16 if dtype == "fp16" else TensorProto.FLOAT
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self.counter = 0

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}_{self.counter}"

    def const(self, prefix: str, value: Array, *, keep_dtype: bool = False) -> str:
        from onnx import numpy_helper

        name = self.name(prefix)
        array = value if keep_dtype else value.astype(self.np_dtype)
        self.initializers.append(numpy_helper.from_array(array, name))
        return name

    def node(self, op: str, inputs: list[str], **attrs: Any) -> str:
        from onnx import helper

        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def write(self, model: Any, graph_name: str) -> bytes:
        import keras
        from onnx import TensorProto, helper

        x = INPUT
        if self.onnx_dtype != TensorProto.FLOAT:
            x = self.node("Cast", [x], to=self.onnx_dtype)
        first = True
        for layer in model.layers:
            weights = [w.astype(np.float32) for w in layer.get_weights()]
            if weights and first:
                weights[0] = weights[0] / 16.0  # fold the input scaling 0..16 -> 0..1
                first = False
            if isinstance(layer, keras.layers.Reshape):
                shape = np.array([-1, 1, *layer.target_shape[:2]], dtype=np.int64)
                x = self.node("Reshape", [x, self.const("shape", shape, keep_dtype=True)])
            elif isinstance(layer, keras.layers.UpSampling2D):
                factor = float(layer.size[0])
                scales = np.array([1, 1, factor, factor], dtype=np.float32)
                x = self.node(
                    "Resize",
                    [x, "", self.const("scales", scales, keep_dtype=True)],
                    mode="nearest",
                    coordinate_transformation_mode="asymmetric",
                    nearest_mode="floor",
                )
            elif isinstance(layer, keras.layers.Conv2D):
                kernel = weights[0].transpose(3, 2, 0, 1)  # HWIO -> OIHW
                x = self.node(
                    "Conv",
                    [x, self.const("W", kernel), self.const("B", weights[1])],
                    pads=[1, 1, 1, 1],
                )
                x = self._activation(layer, x)
            elif isinstance(layer, keras.layers.MaxPooling2D):
                x = self.node("MaxPool", [x], kernel_shape=[2, 2], strides=[2, 2])
            elif isinstance(layer, keras.layers.GlobalAveragePooling2D):
                x = self.node("Flatten", [self.node("GlobalAveragePool", [x])])
            elif isinstance(layer, keras.layers.Dense):
                x = self.node("Gemm", [x, self.const("W", weights[0]), self.const("B", weights[1])])
                x = self._activation(layer, x)
            else:
                raise TypeError(f"no ONNX translation for {type(layer).__name__}")
        if self.onnx_dtype != TensorProto.FLOAT:
            x = self.node("Cast", [x], to=TensorProto.FLOAT)
        self.nodes.append(helper.make_node("Identity", [x], [OUTPUT]))
        graph = helper.make_graph(
            self.nodes,
            graph_name,
            [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, ["batch", 64])],
            [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["batch", 10])],
            self.initializers,
        )
        onnx_model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", ONNX_OPSET)],
            producer_name="edge-inference tools/train_digits.py",
        )
        onnx_model.ir_version = 9
        import onnx

        onnx.checker.check_model(onnx_model)
        return bytes(onnx_model.SerializeToString())

    def _activation(self, layer: Any, x: str) -> str:
        name = layer.activation.__name__
        if name == "relu":
            return self.node("Relu", [x])
        if name == "softmax":
            return self.node("Softmax", [x], axis=-1)
        if name == "linear":
            return x
        raise TypeError(f"no ONNX translation for activation {name}")


def quantize_onnx(fp32: bytes, calibration: Array) -> bytes:
    """Static INT8 (QDQ, per-channel weights) calibrated on ``calibration``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.items: Iterator[dict[str, Array]] = iter(
                {INPUT: calibration[i : i + 1]} for i in range(len(calibration))
            )

        def get_next(self) -> dict[str, Array] | None:
            return next(self.items, None)

    with tempfile.TemporaryDirectory() as tmp:
        src, pre, dst = (Path(tmp) / n for n in ("fp32.onnx", "pre.onnx", "int8.onnx"))
        src.write_bytes(fp32)
        quant_pre_process(str(src), str(pre))
        quantize_static(
            str(pre),
            str(dst),
            Reader(),
            quant_format=QuantFormat.QDQ,
            activation_type=QuantType.QInt8,
            weight_type=QuantType.QInt8,
            per_channel=True,
        )
        return dst.read_bytes()


# -- TFLite export ---------------------------------------------------------------


def export_tflite(model: Any, calibration: Array | None) -> bytes:
    """TFLite from a Keras MLP, with the input scaling folded in.

    With ``calibration``: full-integer INT8, INT8 input and output tensors.
    """
    import keras
    import tensorflow as tf

    # The weights become constants of a plain TensorFlow function (Keras 3
    # variables would reach the converter as resource reads it cannot freeze).
    layers = []
    for index, layer in enumerate(model.layers):
        if not isinstance(layer, keras.layers.Dense):
            raise TypeError(f"TFLite export handles Dense layers only, not {type(layer).__name__}")
        kernel, bias = layer.get_weights()
        if index == 0:
            kernel = kernel / 16.0  # fold the input scaling 0..16 -> 0..1
        layers.append((tf.constant(kernel), tf.constant(bias), layer.activation.__name__))

    @tf.function(input_signature=[tf.TensorSpec([None, 64], tf.float32, name=INPUT)])  # type: ignore[untyped-decorator]
    def serve(pixels: Any) -> dict[str, Any]:
        x = pixels
        for kernel, bias, activation in layers:
            x = tf.matmul(x, kernel) + bias
            x = tf.nn.relu(x) if activation == "relu" else tf.nn.softmax(x)
        return {OUTPUT: x}

    module = tf.Module()
    module.serve = serve  # a trackable parent gives the model a signature: pixels -> probabilities
    converter = tf.lite.TFLiteConverter.from_concrete_functions(
        [serve.get_concrete_function()], module
    )
    if calibration is not None:

        def representative() -> Iterator[list[Array]]:
            for i in range(len(calibration)):
                yield [calibration[i : i + 1]]

        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = representative
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
    return bytes(converter.convert())


# -- running the exports (directly on the libraries, independent of edge_agent) ---


def onnx_runner(data: bytes) -> Callable[[Array], Array]:
    import onnxruntime as ort

    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return lambda x: session.run([OUTPUT], {INPUT: x.astype(np.float32)})[0]


def tflite_runner(data: bytes) -> Callable[[Array], Array]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=data)
    runner = interpreter.get_signature_runner()
    inp = runner.get_input_details()[INPUT]
    out = runner.get_output_details()[OUTPUT]

    def run(x: Array) -> Array:
        rows = []
        for row in x.astype(np.float32):
            item = row[None, :]
            if inp["dtype"] != np.float32:
                scale, zero = inp["quantization"]
                item = np.clip(np.round(item / scale) + zero, -128, 127).astype(inp["dtype"])
            y = runner(**{INPUT: item})[OUTPUT]
            if out["dtype"] != np.float32:
                scale, zero = out["quantization"]
                y = (y.astype(np.float32) - zero) * scale
            rows.append(y[0])
        return np.stack(rows)

    return run


# -- packages --------------------------------------------------------------------


def write_package(
    out: Path,
    name: str,
    description: str,
    exports: dict[tuple[str, str], bytes],
    x_test: Array,
    y_test: Array,
) -> ModelPackage:
    root = out / name / "1"
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    golden_inputs = x_test[:GOLDEN_COUNT]
    runners = {
        key: (onnx_runner if key[0] == "onnx" else tflite_runner)(data)
        for key, data in exports.items()
    }
    reference = runners[("onnx", "fp32")](golden_inputs)
    variants = []
    for (fmt, precision), data in exports.items():
        run = runners[(fmt, precision)]
        accuracy = float(np.mean(np.argmax(run(x_test), axis=1) == y_test))
        worst = float(np.max(np.abs(run(golden_inputs) - reference)))
        atol = max(TOLERANCE_FLOOR[precision], round(2 * worst, 6))
        file = f"model.{precision}.{fmt}"
        (root / file).write_bytes(data)
        variants.append(
            Variant(
                id=f"{fmt}-{precision}",
                format=fmt,
                precision=precision,
                file=file,
                sha256=hashlib.sha256(data).hexdigest(),
                size=len(data),
                accuracy=round(accuracy, 4),
                tolerance=Tolerance(atol=atol, rtol=0.0),
            )
        )
        print(f"{name:13} {fmt}-{precision:5} accuracy {accuracy:.4f}  size {len(data):>8}")
    golden: dict[str, Any] = {f"input:{INPUT}": golden_inputs, f"output:{OUTPUT}": reference}
    np.savez_compressed(root / "golden.npz", **golden)
    np.savez_compressed(root / "heldout.npz", inputs=x_test.astype(np.uint8), labels=y_test)
    package = ModelPackage(
        root=root,
        name=name,
        version=1,
        task="classification",
        description=description,
        inputs=(TensorSpec(INPUT, "FP32", (-1, 64)),),
        outputs=(TensorSpec(OUTPUT, "FP32", (-1, 10)),),
        variants=tuple(variants),
        labels=LABELS,
        preprocessing=ImagePreprocessing(
            input=INPUT,
            color="gray",
            size=(8, 8),
            interpolation="area",
            value_range=(0.0, 16.0),
            layout="NF",
            fit="box",
        ),
        golden_file="golden.npz",
        evaluation_file="heldout.npz",
        source="tools/train_digits.py (scikit-learn load_digits)",
        license="Apache-2.0",
        extra={
            "evaluation": {
                "dataset": "sklearn.datasets.load_digits",
                "split": f"held-out {HELDOUT_SHARE:.0%}, stratified, random_state={SEED}",
                "metric": "top-1 accuracy",
                "samples": len(y_test),
            }
        },
    )
    package.write_manifest()
    return package


def check_onnx_matches_keras(model: Any, onnx_fp32: bytes, x: Array) -> None:
    expected = model.predict(x / 16.0, verbose=0)
    actual = onnx_runner(onnx_fp32)(x)
    worst = float(np.max(np.abs(expected - actual)))
    if worst > 1e-4:
        raise SystemExit(f"ONNX export differs from Keras by {worst}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("models"), help="model repository")
    parser.add_argument("--only", choices=["light", "heavy"], help="export one model only")
    args = parser.parse_args(argv)

    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()
    x_train, x_test, y_train, y_test = load_split()
    calibration = x_train[:200]

    if args.only in (None, "light"):
        light = train_light(x_train, y_train)
        fp32 = OnnxWriter("fp32").write(light, "digits_light")
        check_onnx_matches_keras(light, fp32, x_test)
        write_package(
            args.out,
            "digits-light",
            "A small MLP (64-32-10) that classifies 8x8 digits on the device.",
            {
                ("onnx", "fp32"): fp32,
                ("onnx", "fp16"): OnnxWriter("fp16").write(light, "digits_light"),
                ("onnx", "int8"): quantize_onnx(fp32, calibration),
                ("tflite", "fp32"): export_tflite(light, None),
                ("tflite", "int8"): export_tflite(light, calibration),
            },
            x_test,
            y_test,
        )
    if args.only in (None, "heavy"):
        heavy = train_heavy(x_train, y_train)
        fp32 = OnnxWriter("fp32").write(heavy, "digits_heavy")
        check_onnx_matches_keras(heavy, fp32, x_test)
        write_package(
            args.out,
            "digits-heavy",
            "A CNN (digits upsampled to 32x32, six 3x3 convolutions) that classifies "
            "8x8 digits in the cloud; compute dominates a single request.",
            {
                ("onnx", "fp32"): fp32,
                ("onnx", "int8"): quantize_onnx(fp32, calibration),
            },
            x_test,
            y_test,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
