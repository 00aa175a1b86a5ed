"""``edge-agent infer``: run one model on one input file and print the result as JSON."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.agent import Agent
from edge_agent.assemble import create_agent
from edge_agent.cli.common import (
    CliError,
    add_model_dir,
    add_profiles_dir,
    agent_settings,
    print_json,
)
from edge_agent.config import AgentConfig
from edge_agent.policy.rules import LABELS
from edge_agent.profiles import DeviceProfile
from edge_agent.results import describe_outputs
from edge_core.errors import InputError
from edge_core.images import MAX_IMAGE_PIXELS, probe
from edge_core.package import ModelPackage
from edge_core.repository import ModelRepository
from edge_core.runtime import open_variant

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff"}


def register(commands: Any) -> None:
    parser = commands.add_parser("infer", help="run a model on an input file")
    parser.add_argument("--model", required=True, help="model name")
    parser.add_argument("--version", type=int, help="model version (default: the newest)")
    parser.add_argument(
        "--variant", help="variant id, e.g. onnx-int8 (default: chosen by the profile)"
    )
    parser.add_argument("--profile", help="device profile (default: detected)")
    parser.add_argument(
        "--input",
        required=True,
        type=Path,
        help=".npy (one item or a batch), .npz (one array per input name) or an image file",
    )
    parser.add_argument(
        "--top-k", type=int, default=3, help="labels to report per item (classification)"
    )
    parser.add_argument(
        "--raw", action="store_true", help="print the output tensors too (large ones summarised)"
    )
    parser.add_argument(
        "--full", action="store_true", help="print the output tensors in full (implies --raw)"
    )
    parser.add_argument("--config", type=Path, help="agent configuration (gateway, token, policy)")
    parser.add_argument(
        "--label", choices=LABELS, help="the data's sensitivity (default: the policy's default)"
    )
    parser.add_argument("--deadline-ms", type=float, help="the request's deadline")
    add_model_dir(parser)
    add_profiles_dir(parser)
    parser.set_defaults(run=_infer)


def read_input(
    package: ModelPackage, path: Path, *, max_pixels: int = MAX_IMAGE_PIXELS
) -> dict[str, np.ndarray[Any, Any]]:
    """The model's inputs from a ``.npy``/``.npz``/image file.

    A ``.npy`` array with one dimension fewer than the model's input is one
    item: a batch dimension is added. A picture over ``max_pixels`` is refused
    before it is decoded.

    Raises:
        InputError: the file is missing, unreadable, or of a kind the model cannot take.
    """
    if not path.is_file():
        raise InputError(f"input file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".npy", ".npz"):
        try:
            loaded = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InputError(f"cannot read {path} as a NumPy file: {exc}") from exc
        if suffix == ".npz":
            with loaded:
                return {name: loaded[name] for name in loaded.files}
        if len(package.inputs) != 1:
            names = ", ".join(spec.name for spec in package.inputs)
            raise InputError(f"{package.name} takes several inputs ({names}); pass an .npz file")
        spec = package.inputs[0]
        array = loaded[None] if loaded.ndim == len(spec.shape) - 1 else loaded
        return {spec.name: array}
    if suffix in IMAGE_SUFFIXES:
        if package.preprocessing is None:
            raise InputError(
                f"{package.name} does not take images (its manifest has no preprocessing); "
                "pass a .npy file"
            )
        from edge_core.pictures import picture_to_tensor

        pre = package.preprocessing
        tensor, _ = picture_to_tensor(path.read_bytes(), pre, max_pixels=max_pixels)
        return {pre.input: tensor}
    raise InputError(
        f"unsupported input file {path.name}: expected .npy, .npz or an image "
        f"({', '.join(sorted(IMAGE_SUFFIXES))})"
    )


def picture_hw(path: Path) -> tuple[int, int] | None:
    """The height and width of an image file (``None``: not an image), for boxes in its
    pixels."""
    if path.suffix.lower() not in IMAGE_SUFFIXES:
        return None
    header = probe(path.read_bytes())
    return (header.height, header.width) if header is not None else None


def _described(args: argparse.Namespace, package: ModelPackage, outputs: Any) -> dict[str, Any]:
    return describe_outputs(
        package, outputs, top=args.top_k, full=args.full, raw=args.raw,
        image_hw=picture_hw(args.input),
    )  # fmt: skip


def agent_input(agent: Agent, args: argparse.Namespace) -> dict[str, np.ndarray[Any, Any]]:
    """The ``--input`` file read for ``--model`` as the agent's repository describes it."""
    package = agent.package(args.model)
    if package is None:
        raise CliError(
            f"unknown model {args.model!r}: its manifest is needed to read the input file"
        )
    return read_input(package, args.input, max_pixels=agent.max_pixels)


def _infer(args: argparse.Namespace) -> int:
    if args.top_k < 1:
        raise CliError("--top-k must be at least 1")
    config, profile = agent_settings(args)
    if args.variant:
        return _infer_variant(args, config, profile)
    if args.version is not None:
        raise CliError("--version needs --variant (the agent serves the newest version)")
    agent = create_agent(config, profile=profile)
    try:
        inputs = agent_input(agent, args)
        result = agent.infer(args.model, inputs, label=args.label, deadline_ms=args.deadline_ms)
        answered = agent.package(result.model) or agent.package(args.model)
        assert answered is not None
        backend = agent.backend_of(result.model) if result.where == "device" else None
        print_json(
            {
                **result.to_dict(),
                "profile": agent.profile.id,
                "backend": backend,
                **_described(args, answered, result.outputs),
            }
        )
    finally:
        agent.close()
    return 0


def _infer_variant(args: argparse.Namespace, config: AgentConfig, profile: DeviceProfile) -> int:
    """An explicit variant: run it on this device, no policy."""
    package = ModelRepository(config.model_dir).get(args.model, args.version)
    inputs = read_input(package, args.input, max_pixels=config.limits.max_image_pixels)
    session = open_variant(package, package.variant(args.variant), profile.runtime)
    start = time.perf_counter()
    outputs = session.run(inputs)
    latency_ms = (time.perf_counter() - start) * 1000
    print_json(
        {
            "model": package.name,
            "version": package.version,
            "variant": args.variant,
            "profile": profile.id,
            "backend": session.backend,
            "device": session.device,
            "where": "device",
            "decision": "LOCAL",
            "reason": "variant_requested",
            "latency_ms": round(latency_ms, 4),
            **_described(args, package, outputs),
        }
    )
    return 0
