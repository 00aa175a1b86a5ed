"""``edge-agent models build``: a SiLU model whose FP16 variant would overflow, the
refusal of a variant out of tolerance, determinism, digits-heavy rebuilt from its FP32
ONNX, BlazeFace from TFLite, PP-OCRv4 det; a built package served by the gateway and
run by the agent."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edge_agent.toolchain.build import BuildRequest, build_package
from edge_agent.toolchain.data import Dataset
from edge_agent.toolchain.measure import MeasureSettings
from edge_core.manifest import load_package
from edge_core.repository import ModelRepository
from edge_core.runtime import open_variant

SKIMAGE_PHOTOS = ("astronaut.png", "camera.png", "coffee.png", "chelsea.png")
SKIMAGE_TEXT = ("text.png", "page.png", "rocket.jpg", "motorcycle_left.png")
QUICK = MeasureSettings(rounds=2, seconds_per_round=0.05, batches=False)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edge_agent", *args], capture_output=True, text=True, timeout=600
    )


def silu_model(path: Path) -> Path:
    """x (16) -> MatMul (large weights) -> SiLU (x * sigmoid(x)) -> MatMul (small) -> y (4):
    pre-activations of ~10^5, past FP16's 65504, and outputs of a few units."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 10000, (16, 16)).astype(np.float32)
    w2 = rng.normal(0, 1e-5, (16, 4)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["pre"], name="dense1"),
        helper.make_node("Sigmoid", ["pre"], ["gate"], name="sigmoid"),
        helper.make_node("Mul", ["pre", "gate"], ["silu"], name="silu"),
        helper.make_node("MatMul", ["silu", "w2"], ["y"], name="dense2"),
    ]
    graph = helper.make_graph(
        nodes,
        "silu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def silu(tmp_path: Path) -> tuple[Path, Path]:
    rng = np.random.default_rng(1)
    data = tmp_path / "calibration.npz"
    np.savez(data, x=rng.normal(0, 1, (48, 16)).astype(np.float32))
    return silu_model(tmp_path / "silu.onnx"), data


def test_fp16_overflow_is_found_and_kept_in_fp32(tmp_path: Path, silu: tuple[Path, Path]) -> None:
    source, data = silu
    request = BuildRequest(
        source=source, name="silu", version=1, out=tmp_path / "repo", calibration=data,
        precisions=("fp32", "fp16"), bench=QUICK,
    )  # fmt: skip
    report = build_package(request, say=lambda _: None)
    risky = {r["tensor"] for r in report["build"]["fp16"]["near_fp16_range"]}
    assert {"pre", "silu"} <= risky  # ~10^5: past the FP16 range
    assert {"dense1", "sigmoid", "silu", "dense2"} <= set(report["build"]["fp16"]["kept_fp32"])
    package = load_package(tmp_path / "repo" / "silu" / "1")
    assert [v.id for v in package.variants] == ["onnx-fp32", "onnx-fp16"]
    fp16 = package.variant("onnx-fp16")
    assert fp16.verification is not None and fp16.verification["finite"] is True
    assert fp16.verification["relative_error"] < 0.05
    assert fp16.benchmark is not None and fp16.benchmark["machine"]["cpus"] >= 1
    golden = package.golden()
    session = open_variant(package, fp16)
    out = session.run(golden.inputs)["y"]
    assert fp16.tolerance.allclose(out, golden.outputs["y"])


def test_a_model_too_slow_for_a_larger_batch_is_measured_at_batch_1(
    silu: tuple[Path, Path],
) -> None:
    from edge_agent.toolchain.measure import measure

    data = silu[0].read_bytes()
    settings = MeasureSettings(rounds=1, seconds_per_round=0.01, call_limit_s=1e-9)
    item = {"x": np.ones((1, 16), np.float32)}
    (result,) = measure({"fp32": ("onnx", data)}, item, settings=settings).values()
    assert result["best_batch"] == 1 and result["items_per_s"] > 0
    wide = measure({"fp32": ("onnx", data)}, item, settings=replace(settings, call_limit_s=1.0))
    assert wide["fp32"]["best_batch"] > 1


@pytest.mark.slow
def test_a_variant_out_of_tolerance_is_left_out_with_its_reason(
    tmp_path: Path, silu: tuple[Path, Path]
) -> None:
    source, data = silu
    out = tmp_path / "repo"
    args = ["models", "build", str(source), "--name", "silu", "--out", str(out),
            "--calibration", str(data), "--precision", "fp32", "--precision", "fp16",
            "--no-fp16-guard", "--no-bench"]  # fmt: skip
    done = cli(*args)
    assert done.returncode == 0, done.stderr
    # this CPU computes FP16 MatMuls in FP32, so the outputs here are fine: the range
    # check on the calibration data is what finds the overflow a GPU would hit
    assert "onnx-fp16: LEFT OUT: FP16 overflow: tensor pre reaches" in done.stdout
    assert "left out onnx-fp16" in done.stdout  # in the closing table too
    package = load_package(out / "silu" / "1")
    assert [v.id for v in package.variants] == ["onnx-fp32"]
    assert not (out / "silu" / "1" / "model.fp16.onnx").exists()
    again = cli(*args)
    assert again.returncode == 1 and "exists already (--force replaces it)" in again.stderr


def test_the_same_inputs_give_the_same_files(tmp_path: Path, silu: tuple[Path, Path]) -> None:
    source, data = silu

    def files(out: Path) -> dict[str, str]:
        request = BuildRequest(
            source=source, name="silu", version=1, out=out, calibration=data, bench=None,
            methods=("MinMax", "Entropy"),
        )  # fmt: skip
        build_package(request, say=lambda _: None)
        root = out / "silu" / "1"
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in root.iterdir()}

    first, second = files(tmp_path / "a"), files(tmp_path / "b")
    assert first == second
    assert {"manifest.json", "golden.npz", "model.fp32.onnx", "model.int8.onnx"} <= set(first)


@pytest.mark.slow
def test_digits_heavy_rebuilt_from_its_fp32_onnx(
    repository: ModelRepository, tmp_path: Path
) -> None:
    committed = repository.get("digits-heavy")
    inputs, labels = committed.evaluation()
    calibration = Dataset(
        tuple({"pixels": inputs[i : i + 1].astype(np.float32)} for i in range(0, 360, 6)), None
    )  # 60 of the held-out digits: ranges only (the training split is not in the package)
    request = BuildRequest(
        source=committed.root, name="digits-heavy", version=7, out=tmp_path, calibration=calibration,
        precisions=("fp32", "int8"), methods=("MinMax",), bench=QUICK,
    )  # fmt: skip
    report = build_package(request, say=lambda _: None)
    package = load_package(tmp_path / "digits-heavy" / "7")
    int8 = package.variant("onnx-int8")
    assert int8.accuracy is not None
    assert abs(int8.accuracy - committed.variant("onnx-int8").accuracy) <= 0.005
    assert int8.verification is not None and int8.verification["agreement"] >= 0.99
    assert set(int8.verification["class_agreement"]) == {str(d) for d in range(10)}
    assert package.labels == committed.labels and package.evaluation_file == "heldout.npz"
    assert np.array_equal(package.evaluation()[1], labels)
    nodes = report["build"]["optimization"]["nodes"]
    assert nodes["after"] <= nodes["before"]
    assert int8.cost is not None and int8.cost.flops["int8"] > 2e8
    fp32 = next(v for v in report["variants"] if v["variant"] == "onnx-fp32")
    assert fp32["predicted_ms"] is None  # no profile asked for


def _photos(folder: Path, names: tuple[str, ...]) -> Path:
    import skimage

    folder.mkdir()
    for name in names:
        shutil.copy(Path(skimage.data.data_dir) / name, folder / name)
    return folder


@pytest.mark.slow
def test_blazeface_from_tflite_runs_on_the_agent(fetched: ModelRepository, tmp_path: Path) -> None:
    source = fetched.get("face-detection-short-range")
    photos = _photos(tmp_path / "photos", SKIMAGE_PHOTOS)
    out = tmp_path / "repo"
    done = cli("models", "build", str(source.root), "--name", "faces", "--out", str(out),
               "--eval", str(photos), "--bench-seconds", "0.2", "--profile", "generic-x86_64",
               "--json", str(tmp_path / "build.json"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    package = load_package(out / "faces" / "1")
    (variant,) = package.variants
    assert variant.id == "tflite-fp16" and variant.sha256 == source.variants[0].sha256
    cost = variant.cost
    assert cost is not None and cost.flops["fp32"] + cost.depthwise["fp32"] > 6e7
    assert 0 < cost.depthwise["fp32"] < cost.flops["fp32"]  # BlazeFace's depthwise blocks
    golden = package.golden()
    assert golden.inputs["input"].shape == (4, 128, 128, 3)
    report = json.loads((tmp_path / "build.json").read_text())
    assert report["variants"][0]["predicted_ms"] > 0
    result = cli("infer", "--model-dir", str(out), "--model", "faces", "--profile",
                 "generic-x86_64", "--input", str(photos / "astronaut.png"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["variant"] == "tflite-fp16" and answer["where"] == "device"


@pytest.mark.slow
def test_ppocr_det_int8_against_fp32(fetched: ModelRepository, tmp_path: Path) -> None:
    source = fetched.get("ppocr-det")
    calibration = _photos(tmp_path / "calibration", SKIMAGE_PHOTOS)
    evaluation = _photos(tmp_path / "evaluation", SKIMAGE_TEXT)
    pre = tmp_path / "pre.toml"
    pre.write_text('color = "bgr"\nsize = [256, 320]\ninterpolation = "linear"\n'
                   "mean = [0.5, 0.5, 0.5]\nstd = [0.5, 0.5, 0.5]\nlayout = \"NCHW\"\n")  # fmt: skip
    out = tmp_path / "repo"
    done = cli("models", "build", str(source.root), "--name", "ppocr", "--out", str(out),
               "--calibration", str(calibration), "--eval", str(evaluation), "--preprocessing",
               str(pre), "--precision", "fp32", "--precision", "int8", "--method", "MinMax",
               "--min-iou", "0", "--bench-seconds", "1", "--json", str(tmp_path / "b.json"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads((tmp_path / "b.json").read_text())
    variants = {v["variant"]: v for v in report["variants"]}
    assert report["build"]["optimization"]["nodes"]["after"] < 672  # constants folded
    assert 0.0 <= variants["onnx-int8"]["verification"]["iou"] <= 1.0
    assert variants["onnx-int8"]["benchmark"]["speedup_vs_fp32"] > 0
    package = load_package(out / "ppocr" / "1")
    assert package.task == "segmentation" and package.preprocessing is not None


@pytest.mark.slow
def test_a_built_package_is_served_published_and_run(
    repository: ModelRepository, tmp_path: Path
) -> None:
    """digits-light rebuilt (its TFLite INT8 export verified beside the built variants):
    the gateway serves it, `cloud-gateway models publish` takes it as it is, and the
    agent runs it."""
    import tritonclient.http as thttp

    from tests.support.gateway import start_gateway

    light = repository.get("digits-light")
    tflite = light.read_variant(light.variant("tflite-int8"))
    repo = tmp_path / "repo"
    inputs, labels = light.evaluation()
    calibration = Dataset(
        tuple({"pixels": inputs[i : i + 1].astype(np.float32)} for i in range(40))
    )
    request = BuildRequest(
        source=light.root, name="digits", version=3, out=repo, calibration=calibration,
        methods=("MinMax",), bench=QUICK, extra_variants=(("tflite", "int8", tflite),),
    )  # fmt: skip
    report = build_package(request, say=lambda _: None)
    built = load_package(repo / "digits" / "3")
    assert [v.id for v in built.variants] == ["onnx-fp32", "onnx-fp16", "onnx-int8", "tflite-int8"]
    assert built.variant("tflite-int8").sha256 == light.variant("tflite-int8").sha256
    assert all((v.accuracy or 0) >= 0.9 for v in built.variants), report["variants"]
    assert np.array_equal(built.evaluation()[1], labels)

    handle = start_gateway(tmp_path / "gateway", repo, poll_interval_s=0.0)
    try:
        client = thttp.InferenceServerClient(handle.http_url.removeprefix("http://"))
        item = thttp.InferInput("pixels", [4, 64], "FP32")
        item.set_data_from_numpy(inputs[:4].astype(np.float32))
        answer = client.infer("digits", [item], headers=handle.headers())
        scores = answer.as_numpy("probabilities")
        assert list(np.argmax(scores, axis=1)) == list(
            built.golden().outputs["probabilities"][:4].argmax(1)
        )
    finally:
        handle.thread.stop()

    keys, ota, state = tmp_path / "keys", tmp_path / "ota", tmp_path / "state"
    gateway = [sys.executable, "-m", "cloud_gateway", "--state-dir", str(state)]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*gateway, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    run("keys", "init", "--dir", str(keys))
    run("ota", "init", "--repository", str(ota), "--keys", str(keys))
    run("device", "add", "cam-01", "--group", "cams", "--repository", str(ota))
    published = run(
        "models", "publish", "--repository", str(ota), "--keys", str(keys), "--name", "digits",
        "--version", "3", "--file", str(repo / "digits" / "3" / "model.int8.onnx"), "--group", "cams",
    )  # fmt: skip
    assert "published digits v3" in published.stdout
    np.save(tmp_path / "row.npy", inputs[7].astype(np.float32))
    result = cli("infer", "--model-dir", str(repo), "--model", "digits", "--profile",
                 "generic-x86_64", "--input", str(tmp_path / "row.npy"))  # fmt: skip
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert answer["variant"] == "onnx-int8" and answer["top_k"][0][0]["label"] == str(labels[7])
