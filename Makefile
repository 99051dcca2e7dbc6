# kloop: `make help` lists the targets. Everything runs from the project's .venv when it exists, else from the
# machine's python3 with this checkout on PYTHONPATH (the H200 image, which has torch and triton but no registry).
SHELL := /bin/bash
VENV := .venv
PY := $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3)
export PYTHONPATH := $(CURDIR)$(if $(PYTHONPATH),:$(PYTHONPATH))

# every target serves one task: TASK=<name under tasks/> or a folder holding task.json; unset, each command takes its
# default (w4a16; report and a resumed run: the run's own task)
TASK ?=
T := $(if $(TASK),--task $(TASK))
# SOLUTION defaults to the task's main (each module's own default)
SOLUTION ?=
S := $(if $(SOLUTION),--solution $(SOLUTION))
ITER ?= 20
SEED ?= 1
# PANEL=visible|smoke|FILE; unset, each command takes its default (visible on a GPU, else smoke)
PANEL ?=
P := $(if $(PANEL),--panel $(PANEL))
JSON ?=
GRID ?=
REPEATS ?= 3
# make test spreads the test files over JOBS processes where pytest-xdist is installed (make setup installs it)
JOBS ?= 2
XDIST = $(shell $(PY) -c 'import xdist' 2>/dev/null && echo yes)

.PHONY: help setup test test-gpu sweep selfcheck guard policy profile bench e2e qualify agent-run agent-status clean-workspace report promote verify gates sealed-panel

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

setup: ## create .venv with everything (a CPU torch where no GPU is present)
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	if nvidia-smi -L >/dev/null 2>&1; then \
		$(VENV)/bin/python -m pip install -q torch; \
	else \
		$(VENV)/bin/python -m pip install -q torch==2.13.0 triton==3.6.0; \
	fi
	$(VENV)/bin/python -m pip install -q -e '.[dev,cluster]'
	@echo "setup done: $$($(VENV)/bin/python -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.cuda.is_available())')"
	@command -v chromium >/dev/null || echo "optional: 'apt-get install chromium' lets make test render the HTML report in a headless browser (that test is skipped without it)"

test: ## CPU tests (without CUDA, kernels run under the Triton interpreter; tests/conftest.py chooses) [JOBS=2]
	$(PY) -m pytest -q $(if $(XDIST),-n $(JOBS) --dist loadfile)

test-gpu: ## GPU tests (pytest mark gpu); run on a CUDA machine [K=EXPR: pytest -k, to split the run]
	@$(PY) -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "make test-gpu: no CUDA GPU (torch.cuda.is_available() is False); run it on a GPU machine (make test runs the CPU tests)")'
	$(PY) -m pytest -q -m gpu $(if $(K),-k "$(K)")

selfcheck: ## correctness, latency and speedup over the baseline: [TASK=] [SOLUTION=main] PANEL=visible|smoke|FILE JSON=out.json
	$(PY) -m evals.selfcheck $(T) $(S) $(P) $(if $(JSON),--json $(JSON))

guard: ## the residency contract at its three checkpoints (tasks that declare one): [TASK=] [SOLUTION=] PANEL=visible GUARD_JOBS=1
	$(PY) -m evals.residency $(T) $(S) $(P) $(if $(GUARD_JOBS),--jobs $(GUARD_JOBS)) $(if $(JSON),--json $(JSON))

verify: ## the sealed judge, 3 roles per case: [TASK=] [SOLUTION=] PANEL=~/.kloop/panels/sealed-1.json [JSON=]
	$(PY) -m evals.verifier $(T) $(S) $(P) $(if $(JSON),--json $(JSON))

gates: ## every hard gate but timing, fast (CPU: Triton interpreter): [TASK=] [SOLUTION=] PANEL=smoke
	$(PY) -m evals.verifier $(T) $(S) $(P) --gates-only $(if $(JSON),--json $(JSON))

sealed-panel: ## draw a sealed panel outside the repository: [TASK=] SEED=1 [FILE=path]
	$(PY) -m evals.verifier make-panel $(T) --seed $(SEED) $(if $(FILE),--out $(FILE))

policy: ## the source policy on a solution's files: [TASK=] [SOLUTION=]
	$(PY) -m evals.policy $(or $(SOLUTION),$(shell $(PY) -m evals.task main $(TASK)))

profile: ## roofline and profiler summary per case: [TASK=] [SOLUTION=] PANEL=visible [NCU=1 (Nsight Compute)] [JSON=]
	$(PY) -m evals.profile $(T) $(S) $(P) $(if $(NCU),--ncu) $(if $(JSON),--json $(JSON))

sweep: ## tuning overrides of a solution on the GPU, checked then timed in child processes: [TASK=] SOLUTION= [GRID=FILE (default: the task's sweep_grid)] [JSON=]
	$(PY) -m evals.sweep $(T) $(S) $(if $(GRID),--grid $(GRID)) $(P) $(if $(JSON),--json $(JSON))

bench: ## the baseline, main and the task's peers against the host and GPU floors, host us/call (needs CUDA) [TASK=] [NO_PEERS=1] [JSON=]
	$(PY) -m evals.bench $(T) $(P) $(if $(NO_PEERS),--no-peers) $(if $(JSON),--json $(JSON))

# make e2e: W4A16="DIR ..." the W4A16 solution folders it serves (default: the task's v0 and main);
# W4A16_CONFIG='{"KEY": value}' serves each of them again built with those tuning overrides;
# PROFILE=batch profiles that batch's step (CUDA)
W4A16 ?=
W4A16_CONFIG ?=
BATCHES ?=
LAYERS ?=
STEPS ?=
GLUE ?=
PROFILE ?=
OUT ?=

e2e: ## decode tokens/s of a Llama-3-8B-shaped model, its linear layers per backend (timing needs CUDA; CPU: a tiny model, correctness only): [TASK=w4a16|llgemm] [W4A16="DIR ..."] [BATCHES=1,8,16,24,32] [LAYERS=32] [STEPS=200] [GLUE=compiled|eager] [W4A16_CONFIG=JSON] [PROFILE=batch] [JSON=] [OUT=dir]
	$(PY) -m evals.e2e $(T) $(if $(W4A16),--w4a16 $(W4A16)) $(if $(BATCHES),--batches $(BATCHES)) $(if $(LAYERS),--layers $(LAYERS)) $(if $(STEPS),--steps $(STEPS)) $(if $(GLUE),--glue $(GLUE)) $(if $(W4A16_CONFIG),--w4a16-config '$(W4A16_CONFIG)') $(if $(PROFILE),--profile $(PROFILE)) $(if $(JSON),--json $(JSON)) $(if $(OUT),--out $(OUT))

qualify: ## host cost, GPU time and the verifier's timed vectors per plan (needs CUDA): [TASK=] SOLUTION= [PANEL=] [QGRID=FILE] [REPEATS=3] [JSON=]
	$(PY) -m evals.qualify $(T) $(S) $(P) $(if $(QGRID),--grid $(QGRID)) --repeats $(REPEATS) $(if $(JSON),--json $(JSON))

agent-run: ## the optimization loop: [TASK=] ITER=20 [BACKEND=auto|offline|openai] [MODEL=] [PANEL=visible|smoke|FILE] [FROM=main|vN] [TIME=MIN] [GPUS=0,1|all] [WORKERS=N] [CLUSTER=tcp://HOST:8786] [RESUME=RUN_ID]
	$(PY) -m agent run --iters $(ITER) $(T) $(if $(RESUME),--resume $(RESUME),$(if $(BACKEND),--backend $(BACKEND)) $(if $(MODEL),--model $(MODEL)) $(P) $(if $(FROM),--from $(FROM)) $(if $(TIME),--time-limit $(TIME)) $(if $(GPUS),--gpus $(GPUS)) $(if $(WORKERS),--workers $(WORKERS)) $(if $(CLUSTER),--cluster $(CLUSTER)))

agent-status: ## runs by task; the task's best kept versions and last ledger rows [TASK=]
	$(PY) -m agent status $(T)

clean-workspace: ## remove the worktrees of the task's finished runs (branches, versions and rows stay) [TASK=]
	$(PY) -m agent clean-workspace $(T)

report: ## regenerate a run's report (the run records its task): RUN=<run-id>
	$(PY) -m agent report $(RUN) $(T)

promote: ## check vN of the task again and copy it into its main: [TASK=] V=N [VERIFY=1 (full verifier, GPU)] [FORCE=1] [NOTE="why"]
	$(PY) -m agent promote $(T) v$(V) $(if $(VERIFY),--verify) $(if $(FORCE),--force) $(if $(NOTE),--note "$(NOTE)")
