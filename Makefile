# fs3 — the README's two commands are `make run` and `make test`; each sets up everything it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# python3-venv, python3-dev and gcc: the venv, and pyfuse3, which pip builds from source
SYSTEM_PACKAGES := python3-venv python3-dev gcc fuse3 libfuse3-dev pkg-config fio rsync git e2fsprogs xfsprogs
PROTOS := $(wildcard proto/*.proto)
RUN_DIR ?= $(HOME)/.local/share/fs3/local
MOUNT ?= /mnt/fs3
PYTEST_ARGS ?=
# test processes (pytest-xdist); each test module runs whole in one of them (its module-scoped
# clusters are started once). Most tests wait on daemons' timers, so two on two cores halve the run.
PYTEST_WORKERS ?= 2

.PHONY: install system-packages venv bytecode test lint format proto run down clean

install: system-packages $(VENV)/.installed

# apt-get only what is missing, so a machine that has everything needs no root and no network.
system-packages:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  SUDO=""; [ "$$(id -u)" = 0 ] || SUDO=sudo; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

$(VENV)/.installed: pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $@

# fs3's own sources are installed editable, so pip compiled none of them. Where
# PYTHONDONTWRITEBYTECODE is set (as in many container images) every daemon, mount and fs3 command
# would otherwise compile what it imports again as it starts: ~0.4 s of CPU per process, a sixth
# of the CPU of the tests that start clusters. compileall writes only what changed.
bytecode: install
	@$(BIN)/python -m compileall -q -j 0 fs3 client meta storage

test: install rdma bytecode
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadscope --durations=15 $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Generated modules are committed (so an install needs no protoc); tests/test_proto.py fails when stale.
proto: $(VENV)/.installed
	$(BIN)/python -m fs3.proto.generate

run: install bytecode
	$(BIN)/fs3 local up --dir $(RUN_DIR) --mount $(MOUNT)

down: install
	$(BIN)/fs3 local down --dir $(RUN_DIR)

clean:
	rm -rf build dist *.egg-info .pytest_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# RDMA: Debian's pyverbs (python3-pyverbs, built for Debian's python3) made importable from the venv
# by a symlink in its site-packages; the extension ABI tag must match the venv's Python. Works without
# a device too: the last line says which devices fs3 would use, or why none.
RDMA_PACKAGES := python3-pyverbs rdma-core ibverbs-providers
PYVERBS_DIR := /usr/lib/python3/dist-packages/pyverbs
.PHONY: rdma
rdma: $(VENV)/.installed
	@$(MAKE) --no-print-directory system-packages SYSTEM_PACKAGES="$(RDMA_PACKAGES)"
	@site=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
	tag=$$($(BIN)/python -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))'); \
	test -e $(PYVERBS_DIR)/device$$tag || { echo "$(PYVERBS_DIR) has no device$$tag: pyverbs is built for another Python than $(BIN)/python"; exit 1; }; \
	ln -sfn $(PYVERBS_DIR) $$site/pyverbs
	@$(BIN)/python -c 'import pyverbs.device, pyverbs.cq, pyverbs.qp; print("pyverbs importable from $(VENV)")'
	@$(BIN)/python -c 'from fs3.net.rdma import discover; inv = discover(); print("rdma devices:", ", ".join(n.name for n in inv.nics) or "none (" + inv.reason() + ")")'
