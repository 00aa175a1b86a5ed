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
  FP16, INT8 (``edge-agent models build``: static, calibrated through
  ``onnxruntime.quantization``) and TFLite FP32 and full-integer INT8
  (TensorFlow's converter; verified and measured by the same build).
- ``digits-heavy``: a CNN for the cloud. The 8x8 digit is upsampled to 32x32
  and goes through six 3x3 convolutions (~152 M multiply-adds), so compute
  dominates a single request (over 1 ms at batch 1 on one x86 core), as it
  would for a real cloud model. Dynamic batch dimension. ONNX FP32 and INT8.

Both models are trained with Keras; the FP32 ONNX graphs are written from the
trained weights with ``onnx.helper`` (a handful of standard operators) and the
tool checks that ONNX Runtime reproduces Keras' outputs before the toolchain
(:mod:`edge_agent.toolchain.build`) makes the package: the same steps as for
any model brought by a user. The 1/16 input scaling is folded into the first layer's weights,
so the models take the data set's raw 0..16 values.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from edge_core.package import ImagePreprocessing

SEED = 0
HELDOUT_SHARE = 0.2
GOLDEN_COUNT = 16
INPUT = "pixels"
OUTPUT = "probabilities"
LABELS = tuple(str(d) for d in range(10))
ONNX_OPSET = 17
PREPROCESSING = ImagePreprocessing(
    input=INPUT,
    color="gray",
    size=(8, 8),
    interpolation="area",
    value_range=(0.0, 16.0),
    layout="NF",
    fit="box",
)

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
    """Writes a Keras Sequential model of the few layer kinds used here as ONNX (the
    packages take the FP32 export; the toolchain converts it to FP16)."""

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


# -- packages: through the toolchain (`edge-agent models build`) --------------------


def package(
    out: Path,
    name: str,
    description: str,
    fp32: bytes,
    extra: dict[tuple[str, str], bytes],
    precisions: tuple[str, ...],
    split: tuple[Array, Array, Array, Array],
) -> None:
    """Build ``name`` from its FP32 ONNX export as any model author would: ``models
    build`` optimizes, converts and quantizes (calibrated on 200 training digits),
    verifies every variant (the TFLite exports too) against FP32 on the held-out split,
    measures, and writes the package."""
    from edge_agent.toolchain.build import BuildRequest, build_package
    from edge_agent.toolchain.data import Dataset

    x_train, x_test, _, y_test = split

    def items(x: Array) -> tuple[dict[str, Array], ...]:
        return tuple({INPUT: x[i : i + 1].astype(np.float32)} for i in range(len(x)))

    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "model.fp32.onnx"
        source.write_bytes(fp32)
        build_package(
            BuildRequest(
                source=source,
                name=name,
                version=1,
                out=out,
                calibration=Dataset(items(x_train[:200]), None, "200 training digits"),
                evaluation=Dataset(items(x_test), y_test, f"{len(y_test)} held-out digits"),
                preprocessing=PREPROCESSING,
                task="classification",
                labels=LABELS,
                precisions=precisions,
                golden_count=GOLDEN_COUNT,
                description=description,
                license="Apache-2.0",
                source_note="tools/train_digits.py (scikit-learn load_digits)",
                evaluation_note={
                    "dataset": "sklearn.datasets.load_digits",
                    "split": f"held-out {HELDOUT_SHARE:.0%}, stratified, random_state={SEED}",
                    "metric": "top-1 accuracy",
                    "samples": len(y_test),
                },
                extra_variants=tuple((fmt, p, data) for (fmt, p), data in extra.items()),
                force=True,
            )
        )


def check_onnx_matches_keras(model: Any, onnx_fp32: bytes, x: Array) -> None:
    from edge_core.runtime import open_model

    expected = model.predict(x / 16.0, verbose=0)
    actual = open_model("onnx", onnx_fp32).run({INPUT: x.astype(np.float32)})[OUTPUT]
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
    split = load_split()
    x_train, x_test, y_train, _ = split
    calibration = x_train[:200]

    if args.only in (None, "light"):
        light = train_light(x_train, y_train)
        fp32 = OnnxWriter("fp32").write(light, "digits_light")
        check_onnx_matches_keras(light, fp32, x_test)
        package(
            args.out,
            "digits-light",
            "A small MLP (64-32-10) that classifies 8x8 digits on the device.",
            fp32,
            {
                ("tflite", "fp32"): export_tflite(light, None),
                ("tflite", "int8"): export_tflite(light, calibration),
            },
            ("fp32", "fp16", "int8"),
            split,
        )
    if args.only in (None, "heavy"):
        heavy = train_heavy(x_train, y_train)
        fp32 = OnnxWriter("fp32").write(heavy, "digits_heavy")
        check_onnx_matches_keras(heavy, fp32, x_test)
        package(
            args.out,
            "digits-heavy",
            "A CNN (digits upsampled to 32x32, six 3x3 convolutions) that classifies "
            "8x8 digits in the cloud; compute dominates a single request.",
            fp32,
            {},
            ("fp32", "int8"),
            split,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
