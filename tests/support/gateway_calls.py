"""Calls to a gateway under test: a small repository, the held-out digits and the
answers ONNX Runtime gives for them, requests over both protocols, its metrics."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from edge_core.repository import ModelRepository

from .gateway import GatewayHandle
from .paths import MODELS


def heldout(n: int = 8) -> np.ndarray:
    return ModelRepository(MODELS).get("digits-heavy").evaluation()[0][:n].astype(np.float32)


def direct(model: str, x: np.ndarray) -> np.ndarray:
    """The same model run straight on ONNX Runtime, no gateway involved."""
    package = ModelRepository(MODELS).get(model)
    session = ort.InferenceSession(str(package.path_of(package.variant("onnx-fp32"))))
    return session.run(None, {"pixels": x})[0]


def http_request(
    url: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any] | bytes]:
    request = urllib.request.Request(f"http://{url}{path}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            content = response.read()
            status = response.status
    except urllib.error.HTTPError as error:
        content = error.read()
        status = error.code
    try:
        return status, json.loads(content)
    except ValueError:
        return status, content


def http_infer(
    handle: GatewayHandle, model: str, x: np.ndarray, *, binary: bool = True, **kwargs: Any
) -> np.ndarray:
    client = thttp.InferenceServerClient(handle.http_url)
    tensor = thttp.InferInput("pixels", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    outputs = [thttp.InferRequestedOutput("probabilities", binary_data=binary)]
    result = client.infer(model, [tensor], outputs=outputs, headers=handle.headers(), **kwargs)
    return result.as_numpy("probabilities")


def grpc_infer(handle: GatewayHandle, model: str, x: np.ndarray, **kwargs: Any) -> np.ndarray:
    client = tgrpc.InferenceServerClient(handle.grpc_url)
    tensor = tgrpc.InferInput("pixels", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor], headers=handle.headers(), **kwargs).as_numpy(
        "probabilities"
    )


def ocr_repository(tmp_path: Path, fetched: ModelRepository) -> Path:
    """PP-OCR's text detector (fetched) and the light digits model; not the heavy one."""
    repository = tmp_path / "repo"
    shutil.copytree(fetched.root / "ppocr-det", repository / "ppocr-det")
    shutil.copytree(MODELS / "digits-light", repository / "digits-light")
    return repository


def small_repository(tmp_path: Path) -> Path:
    repository = tmp_path / "repo"
    shutil.copytree(MODELS / "digits-light", repository / "digits-light")
    return repository


def metrics_text(handle: GatewayHandle) -> str:
    status, body = http_request(
        handle.http_url, "/metrics", headers=handle.headers(handle.admin_token)
    )
    assert status == 200, body
    return body.decode() if isinstance(body, bytes) else json.dumps(body)


def metric(handle: GatewayHandle, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    wanted = {f'{k}="{v}"' for k, v in labels.items()}
    total = 0.0
    for line in metrics_text(handle).splitlines():
        if line.startswith((name + "{", name + " ")):
            head, _, value = line.rpartition(" ")
            found = set(head[head.find("{") + 1 : head.rfind("}")].split(","))
            if wanted <= found:
                total += float(value)
    return total


def metric_lines(handle: GatewayHandle, name: str) -> str:
    return "\n".join(line for line in metrics_text(handle).splitlines() if line.startswith(name))
