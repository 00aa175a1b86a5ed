"""One picture or one request must never take a server's memory (issue 29, items 1 and
2): the agent and the gateway as processes, each under a limit on its address space (so
that a regression fails here instead of taking the machine), sent what used to take
gigabytes, and every size up to their limits; their peak and kept memory are read from
``/proc``.

Before the fixes, the agent decoded a 16000 x 16000 PNG (750 KB) and ran CenterFace on
it at full size (18 GB, killed), and the gateway ran 4,096 rows of digits-heavy in one
go (1.6 GB, kept) and failed 245,760 with a 5xx.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from cloud_gateway.auth import DeviceRegistry
from tests.support.daemon import Running, start_agent
from tests.support.pictures import astronaut_jpeg, blank_png
from tests.support.replicas import Replica, start_replica

GiB = 1 << 30
PIXELS = 6_000_000  # the agent's [limits] max_image_pixels here: a 6 MP camera


def memory(pid: int) -> dict[str, int]:
    """The process's resident memory now and at its peak (``VmRSS``, ``VmHWM``), in MB."""
    out = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) // 1024
    return out


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    tmp = tmp_path_factory.mktemp("memory-agent")
    running = start_agent(
        tmp,
        models=("digits-light", "face-detection-centerface"),
        privacy=True,
        address_space=4 * GiB,
        extra=f"[limits]\nmax_image_pixels = {PIXELS}\n",
    )
    running.wait_message("READY=1", 120)
    yield running
    running.stop()


def send(agent: Running, model: str, data: bytes) -> dict[str, np.ndarray]:
    client = thttp.InferenceServerClient(
        f"127.0.0.1:{agent.http_port}", network_timeout=300, connection_timeout=300
    )
    name = "image" if model == "redact" else "input.1"
    item = thttp.InferInput(name, [1], "BYTES")
    item.set_data_from_numpy(np.array([data], dtype=object))
    try:
        result = client.infer(model, [item])
        response = result.get_response()
        return {o["name"]: result.as_numpy(o["name"]) for o in response["outputs"]}
    finally:
        client.close()


@pytest.mark.slow
def test_a_picture_past_the_limit_is_refused_at_once(agent: Running) -> None:
    huge = blank_png(16000, 16000)
    for model in ("face-detection-centerface", "redact"):
        started = time.monotonic()
        with pytest.raises(InferenceServerException, match=r"\[400\].*16000x16000") as caught:
            send(agent, model, huge)
        assert f"limit of {PIXELS:,} pixels" in str(caught.value)
        assert time.monotonic() - started < 10  # by its header: nothing decoded
    assert memory(agent.process.pid)["VmHWM"] < 700


@pytest.mark.slow
def test_pictures_up_to_the_limit_take_bounded_memory_and_give_it_back(agent: Running) -> None:
    """2 MP pictures, then 6 MP ones (JPEG, and PNG, which is decoded whole), each through
    CenterFace as a model and through the redact endpoint: answered, the model's input
    within its pixels, the peak within 1 GB, and what is kept after the 6 MP ones no
    more than after the 2 MP ones: the models' working memory, at their inputs' capped
    size, stays; the pictures' does not."""
    pid = agent.process.pid
    for _ in range(2):  # a model's working memory grows to its input's size once
        send(agent, "face-detection-centerface", astronaut_jpeg(1080, 1920))
        redacted = send(agent, "redact", astronaut_jpeg(1080, 1920))
        assert int(redacted["faces"][0]) >= 1
    small = memory(pid)["VmRSS"]
    for picture in [astronaut_jpeg(2000, 3000), blank_png(3000, 2000)] * 2:
        outputs = send(agent, "face-detection-centerface", picture)
        heat = next(v for v in outputs.values() if v.ndim == 4 and v.shape[1] == 1)
        assert heat.shape[2] * heat.shape[3] * 16 <= 1280 * 960  # a quarter of the input a side
        send(agent, "redact", picture)
    after = memory(pid)
    assert after["VmHWM"] < 1000, after
    assert after["VmRSS"] < small + 100, (small, after)


@pytest.mark.slow
def test_a_request_of_too_many_rows_is_refused(agent: Running) -> None:
    client = thttp.InferenceServerClient(f"127.0.0.1:{agent.http_port}")
    for rows, refused in ((32, False), (33, True), (4096, True)):
        pixels = thttp.InferInput("pixels", [rows, 64], "FP32")
        pixels.set_data_from_numpy(np.random.default_rng(rows).random((rows, 64), np.float32))
        if refused:
            with pytest.raises(
                InferenceServerException, match=r"\[400\].*\[limits\] max_request_rows"
            ):
                client.infer("digits-light", [pixels])
        else:
            assert client.infer("digits-light", [pixels]).as_numpy("probabilities").shape == (
                32,
                10,
            )
    client.close()


# -- the gateway --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Replica, str]]:
    import shutil

    from tests.support.paths import MODELS

    tmp = tmp_path_factory.mktemp("memory-gateway")
    repository = tmp / "repo"
    shutil.copytree(MODELS / "digits-heavy", repository / "digits-heavy")
    replica = start_replica(tmp, "gw", f'repository = "{repository}"\n', address_space=3 * GiB)
    state = tmp / "gw" / "state" / "gateway.sqlite"
    token = DeviceRegistry.add_to(f"sqlite:///{state}", "cam-01", "rpi5-int8")
    yield replica, token
    replica.stop()


@pytest.mark.slow
def test_the_gateway_refuses_more_rows_than_it_batches_and_stays_bounded(
    gateway: tuple[Replica, str],
) -> None:
    """Up to ``max_batch_size`` rows (32) are answered; more, up to what the body limit
    holds (245,760 rows of 64 floats), are a 400 / INVALID_ARGUMENT naming the limit,
    over both protocols; the memory six of the largest took is given back within a few
    seconds of the last (it was kept, and grew with their number: 274 to 396 MB)."""
    replica, token = gateway
    headers = {"authorization": f"Bearer {token}"}
    clients = (
        (thttp, thttp.InferenceServerClient(replica.http_url, network_timeout=120)),
        (tgrpc, tgrpc.InferenceServerClient(replica.grpc_url)),
    )
    before = 0
    for rows in (1, 32, 33, 4096, *[245_760] * 6):
        if rows == 245_760 and not before:
            before = memory(replica.process.pid)["VmRSS"]
        for module, client in clients:
            pixels = module.InferInput("pixels", [rows, 64], "FP32")
            pixels.set_data_from_numpy(np.zeros((rows, 64), np.float32))
            if rows <= 32:
                answer = client.infer("digits-heavy", [pixels], headers=dict(headers))
                assert answer.as_numpy("probabilities").shape == (rows, 10)
                continue
            with pytest.raises(InferenceServerException, match="max_batch_size") as caught:
                client.infer("digits-heavy", [pixels], headers=dict(headers))
            assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    peak = memory(replica.process.pid)["VmHWM"]
    assert peak < 800, peak
    kept = [memory(replica.process.pid)["VmRSS"]]
    while kept[-1] > before + 40 and len(kept) < 20:  # the gateway looks once a second
        time.sleep(0.5)
        kept.append(memory(replica.process.pid)["VmRSS"])
    assert kept[-1] <= before + 40, (before, kept)
    for _, client in clients:
        client.close()
