# Set-up and checks for forgive. `make test` is all a fresh Debian 12 machine needs.
SHELL := /bin/bash
PYTHON ?= /usr/bin/python3
VENV := .venv
BIN := $(VENV)/bin
# Debian packages the project needs at run time and in its tests.
APT_PACKAGES := python3-venv python3-dev gcc mininet bridge-utils iperf3 tcpdump ethtool iproute2 python3-thrift iputils-ping chromium chromium-driver tshark
# wireshark-common (tshark's) asks whether non-root users may capture; answered no, so the
# install never stops for a question (root captures either way).
APT_PRESEED := wireshark-common wireshark-common/install-setuid boolean false
STAMP_APT := $(VENV)/.apt-stamp
STAMP_PIP := $(VENV)/.pip-stamp
# The FORGIVE dissector where Wireshark and tshark load personal Lua plugins from (`tshark -G
# folders`), so `tshark -r capture` decodes the FTH with no flag (docs/protocol.md).
WIRESHARK_PLUGIN := $(HOME)/.local/lib/wireshark/plugins/forgive.lua

.PHONY: setup run test soak lint format bench bench-agent bench-bmv2 bench-switch clean p4 p4-nic p4-tna ptf

# The hot modules compiled by mypyc into build/native (common/native.py): rebuilt
# here whenever one of their sources changed, a no-op otherwise, a copy where the build cache
# (~/.cache/forgive/native, FORGIVE_NATIVE_CACHE; empty: none) has these sources' build;
# FORGIVE_PURE=1 runs without.
setup: $(STAMP_PIP) $(WIRESHARK_PLUGIN)
	@$(BIN)/python -W ignore::RuntimeWarning -c 'from common.native import build; build()'

$(STAMP_APT): Makefile
	@missing=$$(for p in $(APT_PACKAGES); do \
	    dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed$$' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:" $$missing; \
	    echo "$(APT_PRESEED)" | debconf-set-selections; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv --system-site-packages $(VENV)
	@touch $@

$(WIRESHARK_PLUGIN): wireshark/forgive.lua
	install -D -m 644 $< $@

$(STAMP_PIP): $(STAMP_APT) pyproject.toml
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,impact,native]'
	@touch $@

# The main job: the default comparison of policies on the switch model (root: Mininet).
# Options go through ARGS, e.g. make run ARGS="--switch bmv2 --seeds 1,2,3".
run: setup
	$(BIN)/forgive compare $(ARGS)

# Three pytest workers on two cores: the fabric tests and the other namespace tests each run
# one at a time on a worker of their own (tests/conftest.py) and mostly wait on the wall
# clock (measured: 170 s for 84 s of CPU, 152 s for 41 s), so the third keeps the CPU busy.
test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n 3 --dist loadgroup

# A soak (root: Mininet): forgive run for 200 steps on the switch model (and BMv2 where
# installed), every process's RSS and descriptors sampled each step; figures in docs/soak/.
SOAK_STEPS ?= 200
soak: setup
	FORGIVE_SOAK_STEPS=$(SOAK_STEPS) FORGIVE_SOAK_OUT=docs/soak \
	    nice -n 10 $(BIN)/python -m pytest -q -s -m soak tests/test_soak.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

format: setup
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

bench: setup
	$(BIN)/python benchmarks/bench_core.py

# Agent goodput on a veth pair against raw sockets and iperf3 (root: namespaces).
bench-agent: setup
	$(BIN)/python benchmarks/bench_agent.py

# BMv2 forwarding rate with forgive.p4 against a minimal program (needs root and BMv2).
bench-bmv2: setup
	$(BIN)/python benchmarks/bench_bmv2.py

# The switch model's forwarding rate against BMv2 in the same run (needs root).
bench-switch: setup
	$(BIN)/python benchmarks/bench_switch.py

# The P4 program's compiled artifacts are committed; `make p4` rebuilds them
# (p4c names P4Info files by suffix, hence the rename to .txtpb).
P4C ?= p4c-bm2-ss
P4_OUT ?= p4src/build
p4:
	@mkdir -p $(P4_OUT)
	$(P4C) --arch v1model --std p4-16 -o $(P4_OUT)/forgive.json \
	    --p4runtime-files $(P4_OUT)/forgive.p4info.txt p4src/forgive.p4
	mv $(P4_OUT)/forgive.p4info.txt $(P4_OUT)/forgive.p4info.txtpb

# The NIC program (p4src/pna/forgive_nic.p4) through p4c's BMv2 PNA backend, for
# BMv2's pna_nic; its JSON and P4Info are committed the same way (docs/nic.md).
P4C_PNA ?= p4c-bm2-pna
NIC_OUT ?= p4src/pna/build
p4-nic:
	@mkdir -p $(NIC_OUT)
	$(P4C_PNA) --std p4-16 -o $(NIC_OUT)/forgive_nic.json \
	    --p4runtime-files $(NIC_OUT)/forgive_nic.p4info.txt p4src/pna/forgive_nic.p4
	mv $(NIC_OUT)/forgive_nic.p4info.txt $(NIC_OUT)/forgive_nic.p4info.txtpb

# The Tofino program (p4src/tna/forgive.p4) through bf-p4c, the open Tofino backend
# of p4c, for Tofino 1 and 2. Each target's full output (tofino.bin, context.json,
# bf-rt.json) and the P4Runtime device config packed from it (what bf_switchd
# loads) stay in $(TNA_OUT)/TARGET/compiler, untracked; the P4Info and the
# compiler's resource summaries (mau.resources.log: stages, SRAM, TCAM per stage;
# pa.results.log: PHV) are copied beside it and committed.
BF_P4C ?= bf-p4c
# The driver's own assembler step fails in bf-p4c 1.2.5.16 (p4c_src/barefoot.py,
# checkAndRunCmd, calls str.find on a pathlib.Path), so the driver compiles (-S)
# and the two steps it would run next are run here: the assembler (bfas: the
# binary and context.json) and the log summariser (p4c-build-logs: the
# resource summaries), both installed beside the driver.
BF_P4C_BIN = $(dir $(realpath $(shell command -v $(BF_P4C))))
TNA_OUT ?= p4src/tna/build
TNA_TARGETS ?= tofino tofino2
p4-tna: setup
	@set -e; for target in $(TNA_TARGETS); do \
	    case $$target in tofino) arch=tna ;; tofino2) arch=t2na ;; \
	        *) echo "p4-tna: unknown target $$target" >&2; exit 1 ;; esac; \
	    out=$(TNA_OUT)/$$target; rm -rf $$out/compiler; mkdir -p $$out/compiler; \
	    echo "bf-p4c --target $$target --arch $$arch -> $$out"; \
	    $(BF_P4C) --target $$target --arch $$arch --std p4-16 --verbose 1 -S \
	        -o $$out/compiler --bf-rt-schema $$out/compiler/bf-rt.json \
	        --p4runtime-files $$out/compiler/forgive.p4info.txt --p4runtime-force-std-externs \
	        p4src/tna/forgive.p4; \
	    pipe=$$out/compiler/pipe; \
	    $(BF_P4C_BIN)bfas --no-warn --target $$target -o $$pipe $$pipe/forgive.bfa; \
	    $(BF_P4C_BIN)p4c-build-logs $$pipe/context.json -r $$pipe/logs/resources.json \
	        -p $$pipe/logs/power.json -m $$out/compiler/manifest.json \
	        -o $$pipe/logs --disable-phv-json; \
	    cp $$out/compiler/forgive.p4info.txt $$out/forgive.p4info.txtpb; \
	    cp $$pipe/logs/mau.resources.log $$out/mau.resources.log; \
	    cp $$pipe/logs/pa.results.log $$out/pa.results.log; \
	    $(BIN)/python -m controller.tofino_pipeline $(TNA_OUT) $$target >/dev/null; \
	done

# The PTF suite against BMv2 alone (needs root and simple_switch_grpc).
ptf: setup
	$(BIN)/python -m ptf_tests.harness --target bmv2

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache .hypothesis
