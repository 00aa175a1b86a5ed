from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edge_core.cli import run_command
from edge_core.repository import ModelRepository
from tests.support.packages import low_and_high_confidence
from tests.support.roots import make_root


def cli(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "edge_agent", *args], capture_output=True, text=True, timeout=120
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def assert_one_line_error(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("edge-agent: error:")]
    assert len(lines) == 1, result.stderr
    assert text in lines[0]
    assert "Traceback" not in result.stderr


def test_profile_detect_prints_json(tmp_path: Path) -> None:
    root = make_root(tmp_path, model="Raspberry Pi 5 Model B Rev 1.0")
    result = cli("profile", "detect", "--root", str(root), check=True)
    data = json.loads(result.stdout)
    assert data["profile"] == "raspberry-pi-5"
    assert data["reason"] == "device-tree model contains 'Raspberry Pi 5'"


def test_profile_show_and_list() -> None:
    data = json.loads(cli("profile", "show", "jetson-orin-nano", check=True).stdout)
    assert data["runtime"]["onnx"]["providers"][0] == "TensorrtExecutionProvider"
    assert "raspberry-pi-4" in cli("profile", "list", check=True).stdout


def test_profile_apply_dry_run_writes_nothing(tmp_path: Path) -> None:
    root = make_root(tmp_path, cpus=2)
    result = cli(
        "profile",
        "apply",
        "raspberry-pi-5",
        "--mode",
        "performance",
        "--root",
        str(root),
        "--dry-run",
        check=True,
    )
    assert "would write 'performance' to" in result.stdout
    assert (
        root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
    ).read_text() == "ondemand\n"
    cli(
        "profile",
        "apply",
        "raspberry-pi-5",
        "--mode",
        "performance",
        "--root",
        str(root),
        check=True,
    )
    assert (
        root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
    ).read_text() == "performance\n"


def test_models_list() -> None:
    out = cli("models", "list", check=True).stdout
    assert "digits-light" in out and "tflite-int8" in out and "digits-heavy" in out


def digit_png(repository: ModelRepository, tmp_path: Path, index: int) -> tuple[Path, int]:
    """A held-out digit drawn white on black and upscaled to 64x64, as a user would save it."""
    import cv2

    inputs, labels = repository.get("digits-light").evaluation()
    image = (inputs[index].reshape(8, 8).astype(np.float32) * 255.0 / 16.0).astype(np.uint8)
    big = cv2.resize(image, (64, 64), interpolation=cv2.INTER_NEAREST)
    path = tmp_path / f"digit-{index}.png"
    cv2.imwrite(str(path), big)
    return path, int(labels[index])


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["onnx-int8", "tflite-int8", "onnx-fp16"])
def test_infer_on_an_image(repository: ModelRepository, tmp_path: Path, variant: str) -> None:
    for index in (0, 1, 2):
        path, label = digit_png(repository, tmp_path, index)
        result = cli(
            "infer",
            "--model",
            "digits-light",
            "--variant",
            variant,
            "--input",
            str(path),
            check=True,
        )
        data = json.loads(result.stdout)
        assert data["variant"] == variant
        assert data["top_k"][0][0]["label"] == str(label)
        assert data["latency_ms"] > 0


def test_infer_with_profile_chooses_its_variant(
    repository: ModelRepository, tmp_path: Path
) -> None:
    path = tmp_path / "batch.npy"
    inputs, labels = repository.get("digits-light").evaluation()
    np.save(path, inputs[:5].astype(np.float32))
    data = json.loads(
        cli(
            "infer",
            "--model",
            "digits-light",
            "--profile",
            "raspberry-pi-5",
            "--input",
            str(path),
            check=True,
        ).stdout
    )
    assert data["variant"] == "tflite-int8"
    assert data["backend"] == "litert"
    assert "outputs" not in data  # the top labels are what a classifier's answer says
    assert [item[0]["label"] for item in data["top_k"]] == [str(v) for v in labels[:5]]


@pytest.mark.slow
def test_infer_single_item_npy_gets_a_batch_dimension(
    repository: ModelRepository, tmp_path: Path
) -> None:
    path = tmp_path / "one.npy"
    np.save(path, repository.get("digits-heavy").evaluation()[0][3])
    args = ["infer", "--input", str(path), "--profile", "generic-x86_64"]
    data = json.loads(cli(*args, "--model", "digits-light", "--raw", check=True).stdout)
    assert data["outputs"]["probabilities"]["shape"] == [1, 10] and len(data["top_k"]) == 1
    assert data["decision"] == "LOCAL" and data["where"] == "device"
    # the default policy keeps digits-heavy in the cloud: with no gateway, a clear refusal
    assert_one_line_error(
        cli(*args, "--model", "digits-heavy"),
        "no_gateway: digits-heavy runs in the cloud only, but this device has no gateway",
    )
    data = json.loads(
        cli(*args, "--model", "digits-heavy", "--variant", "onnx-int8", check=True).stdout
    )
    assert data["reason"] == "variant_requested" and data["variant"] == "onnx-int8"


@pytest.mark.slow
def test_errors_are_one_clear_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.npy"
    np.save(bad, np.zeros((2, 65), np.float32))
    assert_one_line_error(
        cli("infer", "--model", "digits-light", "--input", str(bad), "--profile", "generic-x86_64"),
        "input 'pixels': wrong shape: got shape [2, 65], expected [?, 64]",
    )
    assert_one_line_error(
        cli("infer", "--model", "nope", "--input", str(bad)), "unknown model 'nope'"
    )
    assert_one_line_error(
        cli("infer", "--model", "digits-light", "--input", str(tmp_path / "missing.npy")),
        "does not exist",
    )
    assert_one_line_error(cli("profile", "show", "pi9"), "unknown profile 'pi9'")
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert_one_line_error(
        cli("infer", "--model", "digits-light", "--input", str(text)),
        "unsupported input file notes.txt",
    )
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"not a png")
    assert_one_line_error(
        cli("infer", "--model", "digits-light", "--input", str(broken)), "cannot decode the image"
    )


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    result = cli("--debug", "profile", "show", "pi9")
    assert result.returncode == 1
    assert "Traceback" in result.stderr


def test_usage_errors_exit_2() -> None:
    result = cli("infer", "--model", "digits-light")
    assert result.returncode == 2
    assert "--input" in result.stderr


@pytest.mark.slow
def test_bench_prints_a_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = cli(
        "bench",
        "--model",
        "digits-light",
        "--variant",
        "onnx-fp32",
        "--variant",
        "tflite-int8",
        "--rounds",
        "1",
        "--seconds",
        "0.02",
        "--no-rss",
        "--profile",
        "generic-x86_64",
        "--json",
        str(out),
        check=True,
    )
    assert "session overhead over the raw runtime call" in result.stdout
    report = json.loads(out.read_text())
    assert [v["variant"] for v in report["variants"]] == ["onnx-fp32", "tflite-int8"]
    for entry in report["variants"]:
        assert entry["p50_ms"] > 0 and entry["overhead"]["raw_p50_us"] > 0
        assert entry["accuracy"] == pytest.approx(entry["manifest_accuracy"], abs=0.003)
    assert "agent_path" not in report  # variants chosen by hand: not what the agent runs
    # every variant: then the whole Agent.infer path too, on the variant the profile picks
    result = cli("bench", "--model", "digits-light", "--rounds", "1", "--seconds", "0.02",
                 "--no-rss", "--profile", "generic-x86_64", "--json", str(out), check=True)  # fmt: skip
    path = json.loads(out.read_text())["agent_path"]
    assert path["variant"] == "onnx-int8"  # generic-x86_64 prefers INT8, then ONNX
    assert path["samples"] > 0 and 0 < path["raw_p50_us"] < path["agent_p50_us"]
    assert "Agent.infer (onnx-int8, the profile's choice, under the shipped policy)" in (
        result.stdout
    )
    assert path["policy"] == "the shipped policy"  # digits-light may run on the device


def test_bench_says_where_the_projects_benchmarks_went() -> None:
    """0.2.0's benchmarks, with their own options, are told where they went (before the
    parser refuses those options); 0.2.0's default suite is `bench --model`."""
    result = cli("bench", "ota", "--sizes", "50")
    assert result.returncode == 2
    assert "it is `python -m benchmarks ota --sizes 50` in a checkout" in result.stderr
    result = cli("bench")
    assert result.returncode == 1 and "needs --model NAME" in result.stderr
    result = cli("bench", "runtime", "--model", "nope")
    assert result.returncode == 1 and "nope" in result.stderr  # run as `bench --model nope`
    gateway = subprocess.run(
        [sys.executable, "-m", "cloud_gateway", "bench", "--peers", "triton", "--rounds", "2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert gateway.returncode == 2
    assert "`python -m benchmarks peers --peers triton --rounds 2`" in gateway.stderr


@pytest.mark.slow
def test_policy_explain_show_and_check(repository: ModelRepository, tmp_path: Path) -> None:
    import cv2
    from skimage import data

    photo = tmp_path / "astronaut.png"
    cv2.imwrite(str(photo), cv2.cvtColor(data.astronaut(), cv2.COLOR_RGB2BGR))
    args = [
        "policy",
        "explain",
        "--model",
        "ppocr-det",
        "--input",
        str(photo),
        "--profile",
        "generic-x86_64",
    ]
    explained = json.loads(cli(*args, check=True).stdout)
    # a local-only device (no gateway configured): a face makes it personal, and it cannot go anywhere
    assert explained["decision"] == "REJECT" and explained["reason"] == "no_gateway"
    assert explained["findings"]["faces"] == 1 and explained["label"] == "personal"
    gateway_config = tmp_path / "agent.toml"
    token = tmp_path / "device.token"
    token.write_text("cam-01.secret")
    token.chmod(0o600)
    gateway_config.write_text('[gateway]\naddress = "127.0.0.1:1"\ntoken_file = "device.token"\n')
    explained = json.loads(cli(*args, "--config", str(gateway_config), check=True).stdout)
    assert explained["decision"] == "OFFLOAD_REDACTED" and explained["reason"] == "cloud_only"
    explained = json.loads(
        cli(*args, "--config", str(gateway_config), "--label", "sensitive", check=True).stdout
    )
    assert explained["decision"] == "REJECT" and explained["reason"] == "may_not_leave"
    shown = json.loads(cli("policy", "show", check=True).stdout)
    assert shown["models"]["digits-light"]["escalate_to"] == "digits-heavy"
    broken = tmp_path / "policy.toml"
    broken.write_text('[sensitivity]\npublic = "share"\n')
    assert_one_line_error(
        cli("policy", "check", str(broken)), "sensitivity.public: expected one of"
    )
    token.chmod(0o644)
    assert_one_line_error(cli(*args, "--config", str(gateway_config)), "readable by others")


@pytest.mark.slow
def test_infer_with_a_gateway_config_escalates(gateway, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]

    token = tmp_path / "device.token"
    token.write_text(gateway.device_token)
    token.chmod(0o600)
    config = tmp_path / "agent.toml"
    root = make_root(tmp_path / "root")  # no proc/loadavg: this machine's load plays no part
    config.write_text(
        f'profile = "generic-x86_64"\nroot = "{root}"\n'
        f'[gateway]\naddress = "{gateway.grpc_url}"\ntoken_file = "device.token"\n'
    )
    low, _ = low_and_high_confidence()
    path = tmp_path / "low.npy"
    np.save(path, low)
    data = json.loads(
        cli(
            "infer",
            "--model",
            "digits-light",
            "--input",
            str(path),
            "--config",
            str(config),
            "--label",
            "personal",
            check=True,
        ).stdout
    )
    assert data["where"] == "cloud" and data["escalated"] and data["model"] == "digits-heavy"
    assert data["decision"] == "OFFLOAD_REDACTED" and data["reason"] == "low_confidence"
    assert data["label"] == "personal"


def _boom(args: argparse.Namespace) -> int:
    raise RuntimeError("the disk fell off")


def test_an_unexpected_error_is_one_line_without_debug(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = argparse.Namespace(command="profile", debug=False, run=_boom)
    assert run_command(args, prog="edge-agent") == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "edge-agent: error: profile failed unexpectedly: RuntimeError: the disk fell off "
        "(run with --debug for the traceback)"
    ]
    assert (
        run_command(argparse.Namespace(command="profile", debug=True, run=_boom), prog="edge-agent")
        == 1
    )
    err = capsys.readouterr().err
    assert "Traceback" in err and "the disk fell off" in err


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """`edge-agent profile show raspberry-pi-5 | head -1`: no BrokenPipeError traceback."""
    process = subprocess.Popen(
        [sys.executable, "-m", "edge_agent", "profile", "show", "raspberry-pi-5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # before the command writes: its every write hits a closed pipe
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 1
    assert stderr == ""


def test_profile_detect_under_a_missing_root_fails(tmp_path: Path) -> None:
    assert_one_line_error(
        cli("profile", "detect", "--root", str(tmp_path / "nonexistent")),
        f"cannot detect the device under {tmp_path / 'nonexistent'}: the root does not exist",
    )


def test_profile_detect_under_a_device_tree_alone_is_the_board(tmp_path: Path) -> None:
    (tmp_path / "proc/device-tree").mkdir(parents=True)
    (tmp_path / "proc/device-tree/model").write_bytes(b"Raspberry Pi 5 Model B Rev 1.0\x00")
    data = json.loads(cli("profile", "detect", "--root", str(tmp_path), check=True).stdout)
    assert data["profile"] == "raspberry-pi-5" and data["arch"] == "aarch64"


@pytest.mark.slow
def test_a_missing_model_folder_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    assert_one_line_error(
        cli("models", "list", "--model-dir", str(missing)),
        f"model folder {missing} does not exist",
    )
    npy = tmp_path / "x.npy"
    np.save(npy, np.zeros((1, 64), np.float32))
    for variant in ([], ["--variant", "onnx-fp32"]):
        assert_one_line_error(
            cli(
                "infer",
                "--model",
                "digits-light",
                "--model-dir",
                str(missing),
                "--profile",
                "generic-x86_64",
                "--input",
                str(npy),
                *variant,
            ),
            f"model folder {missing} does not exist",
        )
    (tmp_path / "empty").mkdir()
    assert cli("models", "list", "--model-dir", str(tmp_path / "empty"), check=True).stdout == (
        f"no models in {tmp_path / 'empty'}\n"
    )
