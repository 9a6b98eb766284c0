# Two commands do all set-up on a fresh machine:  `make demo`  and  `make test`.
# CPU installs pin torch to the CPU build that lies on disk; override for a GPU box:
#   make test TORCH=torch==2.13.0+cu128   (or any pip requirement)
PYTHON ?= python3.11
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.orch-installed
export DS_BUILD_OPS ?= 0
export DS_ACCELERATOR ?= cpu
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

.PHONY: venv test test-fast demo schemas megatron-flags golden clean bench

venv: $(STAMP)

$(STAMP): setup.cfg pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	echo "$(TORCH)" > $(VENV)/constraints.txt
	$(BIN)/pip install -q -c $(VENV)/constraints.txt "$(TORCH)"
	$(BIN)/pip install -q -c $(VENV)/constraints.txt -e '.[train,plot,test]'
	touch $(STAMP)

test: venv
	$(BIN)/python -m pytest -q

test-fast: venv
	$(BIN)/python -m pytest -q -m "not integration"

demo: venv
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/python examples/demo.py

schemas: venv
	$(BIN)/python -m orchestrator.schemas_export

# Re-derive schemas/megatron_lm_args.json from Megatron-LM's arguments.py (needs ORCH_MEGATRON_LM).
megatron-flags: venv
	$(BIN)/python tests/tools/export_megatron_lm_args.py

golden: venv
	ORCH_UPDATE_GOLDEN=1 $(BIN)/python -m pytest -q tests/golden

bench: venv
	for b in benchmarks/*.py; do $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .cache
