# Two commands do all set-up on a fresh machine:  `make demo`  and  `make test`.
# TORCH is the pip requirement for torch (see README, "What gets installed"): `torch==2.13.0` gives the CPU
# build on this project's CI machines (their pip index holds it) but the CUDA build from PyPI on a normal Linux
# machine. For the CPU build elsewhere:  make demo PIP_EXTRA="--index-url https://download.pytorch.org/whl/cpu"
# PYTHON: the interpreter that creates .venv, the first Python >= 3.10 found (override: make PYTHON=python3.12).
PYTHON ?= $(shell for p in python3.11 python3.12 python3.10 python3.13 python3; do \
            command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
            2>/dev/null && { echo $$p; break; }; done)
PIP_EXTRA ?=
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.orch-installed
export DS_BUILD_OPS ?= 0
export DS_ACCELERATOR ?= cpu
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

.PHONY: venv test test-fast demo demo-script ops schemas readme docs megatron-flags megatron-lm golden clean bench

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml Makefile
	@test -x $(BIN)/python || test -n "$(PYTHON)" || { echo "no Python >= 3.10 on PATH (tried python3.11," \
	  "python3.12, python3.10, python3.13, python3): install one, or run make PYTHON=/path/to/python3.x" >&2; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	echo "$(TORCH)" > $(VENV)/constraints.txt
	$(BIN)/pip install -q $(PIP_EXTRA) -c $(VENV)/constraints.txt "$(TORCH)"
	$(BIN)/pip install -q -c $(VENV)/constraints.txt -e '.[train,plot,test,docs]'
	touch $(STAMP)

test: venv
	$(BIN)/python -m pytest -q

test-fast: venv
	$(BIN)/python -m pytest -q -m "not integration"

# DeepSpeed compiles its CPU communication op on its first start (~30-60 s, once per cache): build it here,
# saying so, rather than in the middle of the first training launch. Cached in TORCH_EXTENSIONS_DIR.
ops: venv
	$(BIN)/python -m orchestrator.train.ops

demo: venv ops
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python examples/demo.py

# The same chain for a user's own program: a DeepSpeed tutorial-style script (examples/programs/ds_minimal.py)
# under orch's telemetry wrapper (demo-runs/ds-script-cpu: metrics.jsonl, W&B offline run).
demo-script: venv ops
	$(BIN)/orch generate examples/ds-script-cpu.yaml -o demo-runs/ds-script-cpu --force --discard-outputs
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/orch launch demo-runs/ds-script-cpu --wait

# The JSON Schemas from the typed records, then docs/spec.md from the spec's schema (tests fail when stale).
schemas: venv
	$(BIN)/python -m orchestrator.schemas_export
	$(BIN)/python tests/tools/spec_reference.py

# Rewrite the README's marked console blocks with what the commands print today (tests/unit/test_readme.py).
readme: venv
	$(BIN)/python tests/tools/readme_outputs.py

# The docs site (mkdocs.yml, docs/) into site/; --strict: a broken link, a missing page or any warning fails.
docs: venv
	$(BIN)/python -m mkdocs build --strict --site-dir site

# Re-derive schemas/megatron_lm_args.json from Megatron-LM's arguments.py (needs ORCH_MEGATRON_LM).
megatron-flags: venv
	$(BIN)/python tests/tools/export_megatron_lm_args.py

# Megatron-LM's own validate_args checks (tests/integration/test_megatron_real.py, `orch validate` of Megatron
# args) skip unless ORCH_MEGATRON_LM names a prepared megatron/ tree. Prepare one from a local clone:
#   make megatron-lm MEGATRON_LM_GIT=~/src/Megatron-LM && export ORCH_MEGATRON_LM=$(CURDIR)/.cache/megatron-lm
MEGATRON_LM_TREE ?= $(CURDIR)/.cache/megatron-lm
megatron-lm: venv
	MEGATRON_LM_GIT="$(MEGATRON_LM_GIT)" PYTHON=$(CURDIR)/$(BIN)/python \
	  bash tests/tools/prepare_megatron_lm.sh $(MEGATRON_LM_TREE)

golden: venv
	ORCH_UPDATE_GOLDEN=1 $(BIN)/python -m pytest -q tests/golden

bench: venv
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .cache
