# gpudra: `make up` runs the whole driver locally; `make test` runs every check.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat requirements.lock pyproject.toml | sha256sum | cut -c1-16)

.PHONY: venv up test lint fmt typecheck unit integration e2e e2e-real controlplane controlplanes \
	jaeger containerd prometheus \
	node-packages realnode helm image bench clean proto pciids

venv: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check -r requirements.lock
	$(BIN)/python -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
	@rm -f $(VENV)/.installed-* && touch $@

up: venv controlplane
	$(BIN)/gpudra up

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports --no-cache

fmt: venv
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

typecheck: venv
	$(BIN)/mypy

unit: venv helm prometheus
	$(BIN)/pytest tests/unit

integration: venv helm image
	$(BIN)/pytest tests/integration

e2e: venv controlplanes jaeger realnode helm image prometheus
	$(BIN)/pytest tests/e2e

# Only the e2e tests on real nodes (real kubelet, containerd, runc, containers).
e2e-real: venv controlplane realnode helm image
	$(BIN)/pytest tests/e2e -m realnode

# The Go control plane for e2e (cached outside the repo, keyed by its inputs): Kubernetes
# 1.37, the default.
controlplane:
	services/local/controlplane/build.sh

# The compatibility tier's control planes, 1.34, 1.35 and 1.36 (cached the same way), which
# tests/e2e/local/test_kube_versions.py and the 1.35 differential tests run.
KUBE_COMPAT ?= 1.34 1.35 1.36
controlplanes: controlplane
	@for v in $(KUBE_COMPAT); do services/local/controlplane/build.sh --version $$v || exit 1; done

# Jaeger v2 for the traced e2e test and `gpudra up --jaeger` (cached the same way).
jaeger:
	services/local/jaeger/build.sh

# helm v3, which the chart tests lint, render and install the chart with (cached the same way).
helm:
	services/local/helm/build.sh

# Debian's Prometheus (prometheus and promtool, from its package, unpacked into the cache;
# nothing installed): the alert rule tests check and evaluate the chart's alerts with it.
# Best effort, like pciids: without apt-get those tests skip, saying so.
prometheus:
	@services/local/prometheus/build.sh >/dev/null \
		|| echo "Debian's prometheus package not available: the alert tests skip"

# The gpudra container image (OCI archive for `ctr images import`) from Debian packages and
# the locked wheels, cached in layers (services/local/image.py). As root, mmdebstrap is
# installed when missing; elsewhere the image tests say why they skip.
image: venv
	@command -v mmdebstrap >/dev/null || test "$$(id -u)" != 0 || ! command -v apt-get >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq mmdebstrap; } >/dev/null 2>&1 \
		|| echo "mmdebstrap not installed: the image tests skip"
	@test "$$(id -u)" != 0 || ! command -v mmdebstrap >/dev/null || $(BIN)/python -m services.local.image build >/dev/null

# What a real node needs (services/local/node.py, `gpudra up --real-nodes`):
# containerd, ctr and its runc shim (cached the same way; the kubelet and
# NVIDIA's nvidia-cdi-hook come with the control plane), and Debian's runc and
# busybox-static.
realnode: containerd node-packages

containerd:
	services/local/containerd/build.sh

# Best effort, like pciids: as root with apt-get; without them the real-node
# tests skip and `gpudra up --real-nodes` falls back to kubelet-dra, saying why.
node-packages:
	@command -v runc >/dev/null && dpkg -s busybox-static >/dev/null 2>&1 || test "$$(id -u)" != 0 \
		|| ! command -v apt-get >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq runc busybox-static; } >/dev/null 2>&1 \
		|| echo "runc/busybox-static not installed: the real-node tests skip"

# Two workers (pytest-xdist): most tests wait on the processes they start, so two
# at once nearly halve the wall time on two cores; tests/conftest.py says what runs together.
TEST_WORKERS ?= 2

test: lint typecheck controlplanes jaeger realnode helm image pciids prometheus
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile tests

# Debian's PCI ID database, which tests/unit/discovery/test_pciids.py checks the built-in subset
# against (best effort: as root with apt-get; the test says so when it has none).
pciids:
	@test -f /usr/share/misc/pci.ids || test "$$(id -u)" != 0 || ! command -v apt-get >/dev/null \
		|| { apt-get update -qq && apt-get install -y -qq pci.ids; } >/dev/null 2>&1 \
		|| echo "pci.ids not installed: tests/unit/discovery/test_pciids.py skips its system comparison"

proto: venv
	$(BIN)/python proto/generate.py

bench: venv
	$(BIN)/python bench/publish.py
	$(BIN)/python bench/allocate.py
	$(BIN)/python bench/prepare.py
	$(BIN)/python bench/trail.py
	$(BIN)/python bench/domains.py
	$(BIN)/python bench/domains.py --pods
	$(BIN)/python bench/podstart.py
	$(BIN)/python bench/scale.py

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
