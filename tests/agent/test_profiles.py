from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from edge_agent.profiles import ProfileStore, detect_profile, load_profile, read_facts
from edge_core.errors import ProfileError
from tests.support.paths import PROFILES
from tests.support.roots import X86_CPUINFO, make_root

EXPECTED = {
    "raspberry-pi-4",
    "raspberry-pi-5",
    "jetson-orin-nano",
    "jetson-agx-orin",
    "rk3588",
    "imx8mp",
    "coral-dev-board",
    "generic-arm64",
    "generic-x86_64",
    "raspberry-pi-3-32bit",
    "raspberry-pi-4-32bit",
    "generic-armv7l",
}


def test_every_profile_loads(profiles: ProfileStore) -> None:
    assert set(profiles.names()) == EXPECTED
    for profile in profiles:
        assert profile.precisions and profile.formats and profile.power_modes
        assert profile.power_mode().name == profile.default_power_mode
        assert profile.runtime.providers[-1] == "CPUExecutionProvider"


@pytest.mark.parametrize(
    ("facts", "expected"),
    [
        (
            {
                "model": "Raspberry Pi 4 Model B Rev 1.4",
                "compatible": ["raspberrypi,4-model-b", "brcm,bcm2711"],
            },
            "raspberry-pi-4",
        ),
        (
            {
                "model": "Raspberry Pi 5 Model B Rev 1.0",
                "compatible": ["raspberrypi,5-model-b", "brcm,bcm2712"],
            },
            "raspberry-pi-5",
        ),
        (
            {
                "model": "NVIDIA Jetson Orin Nano Developer Kit",
                "compatible": ["nvidia,p3768-0000+p3767-0005", "nvidia,tegra234"],
                "tegra": "# R36 (release), REVISION: 3.0, GCID: 36923193, BOARD: generic, EABI: aarch64",
            },
            "jetson-orin-nano",
        ),
        (
            {
                "model": "Jetson AGX Orin Developer Kit",
                "compatible": ["nvidia,p3737-0000+p3701-0005", "nvidia,tegra234"],
                "tegra": "# R35 (release), REVISION: 4.1, GCID: 33958178, BOARD: t186ref, EABI: aarch64",
            },
            "jetson-agx-orin",
        ),
        ({"model": "Radxa ROCK 5B", "compatible": ["radxa,rock-5b", "rockchip,rk3588"]}, "rk3588"),
        (
            {
                "model": "Orange Pi 5",
                "compatible": ["rockchip,rk3588s-orangepi-5", "rockchip,rk3588s"],
            },
            "rk3588",
        ),
        (
            {"model": "NXP i.MX8MPlus EVK board", "compatible": ["fsl,imx8mp-evk", "fsl,imx8mp"]},
            "imx8mp",
        ),
        (
            {
                "model": "Freescale i.MX8MQ Phanbell",
                "compatible": ["fsl,imx8mq-phanbell", "fsl,imx8mq"],
            },
            "coral-dev-board",
        ),
    ],
)
def test_each_board_is_detected_from_a_fake_root(
    profiles: ProfileStore,
    tmp_path: Path,
    facts: dict,
    expected: str,  # type: ignore[type-arg]
) -> None:
    root = make_root(tmp_path, **facts)
    detection = detect_profile(list(profiles), root)
    assert detection.profile.id == expected
    assert not detection.generic
    assert detection.warnings == []
    assert detection.to_dict()["profile"] == expected


def test_jetson_without_l4t_is_not_a_jetson(profiles: ProfileStore, tmp_path: Path) -> None:
    root = make_root(tmp_path, model="NVIDIA Jetson Orin Nano Developer Kit")
    assert detect_profile(list(profiles), root).profile.id == "generic-arm64"


def test_unknown_arm_board_falls_back_to_generic_with_a_warning(
    profiles: ProfileStore, tmp_path: Path
) -> None:
    root = make_root(
        tmp_path, model="Pine64 RockPro64", compatible=["pine64,rockpro64", "rockchip,rk3399"]
    )
    detection = detect_profile(list(profiles), root)
    assert detection.profile.id == "generic-arm64"
    assert detection.generic
    assert "unknown hardware (Pine64 RockPro64)" in detection.warnings[0]


def test_x86_machine_gets_the_generic_x86_profile(profiles: ProfileStore, tmp_path: Path) -> None:
    root = make_root(tmp_path, cpuinfo=X86_CPUINFO)
    detection = detect_profile(list(profiles), root)
    assert detection.profile.id == "generic-x86_64"
    assert "avx512_vnni" in detection.to_dict()["int8_features"]


def test_facts_are_read_under_the_root(tmp_path: Path) -> None:
    facts = read_facts(make_root(tmp_path, model="Raspberry Pi 5 Model B Rev 1.0"))
    assert facts.arch == "aarch64"
    assert facts.device_tree_model == "Raspberry Pi 5 Model B Rev 1.0"
    assert facts.cpu_count == 2
    assert "asimddp" in facts.cpu_features
    assert facts.memory_mb == 7812


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"proc/device-tree/model": b"Raspberry Pi 5 Model B Rev 1.0\x00"}, "raspberry-pi-5"),
        (
            {
                "proc/device-tree/model": b"NVIDIA Jetson Orin Nano Developer Kit\x00",
                "etc/nv_tegra_release": b"# R36 (release), REVISION: 3.0\n",
            },
            "jetson-orin-nano",
        ),
        ({"proc/device-tree/model": b"Pine64 RockPro64\x00"}, "generic-arm64"),
    ],
)
def test_a_root_without_cpuinfo_never_takes_the_hosts_architecture(
    profiles: ProfileStore, tmp_path: Path, files: dict[str, bytes], expected: str
) -> None:
    """A device tree (or L4T) alone means an ARM board, whatever this machine is."""
    for name, content in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    detection = detect_profile(list(profiles), tmp_path)
    assert detection.facts.arch == "aarch64"
    assert detection.profile.id == expected


def test_a_root_that_tells_nothing_is_an_error(profiles: ProfileStore, tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    with pytest.raises(ProfileError, match=r"cannot tell the architecture of the device under "):
        detect_profile(list(profiles), tmp_path)


def test_a_missing_root_is_an_error(profiles: ProfileStore, tmp_path: Path) -> None:
    with pytest.raises(
        ProfileError, match=r"cannot detect the device under .*/nope: the root does not exist"
    ):
        detect_profile(list(profiles), tmp_path / "nope")
    (tmp_path / "file").write_text("")
    with pytest.raises(ProfileError, match=r"the root is not a directory"):
        read_facts(tmp_path / "file")


def test_this_machines_root_still_detects_something(profiles: ProfileStore) -> None:
    assert detect_profile(list(profiles), Path("/")).facts.arch in ("x86_64", "aarch64")


def write_profile(tmp_path: Path, text: str, name: str = "raspberry-pi-5") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def pi5_with(old: str, new: str) -> str:
    text = (PROFILES / "raspberry-pi-5.toml").read_text()
    assert old in text
    return text.replace(old, new)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("threads = 4\n", "threads = 0\n", r"runtime.threads: expected an integer >= 1, got 0"),
        (
            "threads = 4\n",
            'threads = "four"\n',
            r"runtime.threads: expected an integer >= 1, got 'four'",
        ),
        ('arch = "aarch64"\n', "", r"arch: missing \(required\)"),
        (
            'arch = "aarch64"',
            'arch = "arm"',
            r"arch: expected one of 'aarch64', 'x86_64', 'armv7l', got 'arm'",
        ),
        (
            'precisions = ["int8", "fp32"]',
            'precisions = ["int4"]',
            r"runtime.precisions: expected a list of strings from 'fp32', 'fp16', 'int8'",
        ),
        (
            "throttle_c = 80.0",
            "throttle_c = 90.0",
            r"thermal.zones\[0\].critical_c: expected a temperature above throttle_c \(90.0\)",
        ),
        ("warmup = 5\n", "warmup = 5\nwarm_up = 3\n", r"runtime.warm_up: unknown field"),
        (
            'default = "balanced"',
            'default = "turbo"',
            r"power.default: expected one of 'performance', 'balanced', 'powersave', got 'turbo'",
        ),
        (
            "[runtime.onnx.provider_options.XnnpackExecutionProvider]",
            "[runtime.onnx.provider_options.CUDAExecutionProvider]",
            r"provider_options.CUDAExecutionProvider: options for a provider not in providers",
        ),
        (
            'id = "raspberry-pi-5"',
            'id = "pi5"',
            r"id: expected the file's name 'raspberry-pi-5', got 'pi5'",
        ),
        ("[detect]\n", "[detect]\nbogus = 1\n", r"detect.bogus: unknown field"),
        ("warmup = 5\n", "", r"runtime.warmup: missing \(required\)"),
        ('prefer = "local"\n', "", r"offload.prefer: missing \(required\)"),
        ("offload_when_throttled = true\n", "", r"offload.offload_when_throttled: missing"),
        ('[offload]\nprefer = "local"\noffload_when_throttled = true\n', "", r"offload: missing"),
    ],
)
def test_profile_errors_name_file_field_and_expectation(
    tmp_path: Path, old: str, new: str, message: str
) -> None:
    path = write_profile(tmp_path, pi5_with(old, new))
    with pytest.raises(ProfileError, match=message) as info:
        load_profile(path)
    assert str(info.value).startswith(str(path))


def test_invalid_toml_is_reported(tmp_path: Path) -> None:
    path = write_profile(tmp_path, "id = \n")
    with pytest.raises(ProfileError, match="invalid TOML"):
        load_profile(path)


def test_unknown_profile_lists_the_known_ones(profiles: ProfileStore) -> None:
    with pytest.raises(
        ProfileError, match=r"unknown profile 'pi6'.*known profiles: coral-dev-board"
    ):
        profiles.get("pi6")


def test_a_store_in_another_directory(tmp_path: Path) -> None:
    shutil.copy(PROFILES / "generic-arm64.toml", tmp_path)
    assert ProfileStore(tmp_path).names() == ["generic-arm64"]
