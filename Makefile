# Two commands do all set-up on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# A CPU build of torch: on this project's machines `pip install torch==2.13.0` takes a wheel
# already on disk (fast). GPU users: see docs/cli.md ("Installing").
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed

.PHONY: run test test-slow lint bench docs scoreboard clean

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[dev,plot]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/gradcheck-bi run

lint: $(STAMP)
	$(BIN)/ruff check gradcheck_bi tests benchmarks docs
	$(BIN)/mypy

# Then every slow test (~8 min on 2 cores): the mutant catalogues through the CI case, as a
# user's run loads each kernel, the statistical false-alarm runs and the CI gate on each
# single defect. A recognition change that refuses a defective kernel instead of failing it
# shows only there; slow tests left out of CI had stopped passing unnoticed.
test: $(STAMP) lint
	$(BIN)/pytest -q
	$(BIN)/pytest -q -m slow

test-slow: $(STAMP)
	$(BIN)/pytest -q -m slow

# CPU benchmarks; docs/benchmarks.md holds the numbers. Threads as the CLI
# chooses them (by chunk size and idle cores); BENCH_THREADS=N pins every op to N.
BENCH_THREADS ?=
bench: $(STAMP)
	PYTHONPATH=. $(BIN)/python benchmarks/cpu_cost.py $(if $(BENCH_THREADS),--threads $(BENCH_THREADS),)

# Re-run the commands whose output README.md and docs/*.md quote, and paste it in again
# (between <!-- docs:begin NAME --> markers; docs/make_docs.py). A few minutes on 2 cores.
docs: $(STAMP)
	PYTHONPATH=. $(BIN)/python docs/make_docs.py

# The real-library scoreboard: every norm class of torch, transformers, timm (Liger and fla:
# on a GPU, benchmarks/gpu_scoreboard_cuda.sh) through `gradcheck-bi run`, compared with benchmarks/scoreboard_expected.toml;
# totals to docs/scoreboard.md. About half an hour on 2 cores at the default shape; an interrupted run
# resumes where it stopped.
# SCOREBOARD_ARGS="--only Llama --update-expected …" (benchmarks/scoreboard.py --help).
# Versions pinned (transformers in the `scoreboard` extra, timm here). timm goes in without its
# dependencies: it requires torchvision, whose PyPI wheels are CUDA builds pinned to one torch —
# an unpinned one replaces the CPU torch, and the one for torch 2.13.0 cannot load on the CPU
# torch ("operator torchvision::nms does not exist"). Its `import torchvision` is answered by
# benchmarks/scoreboard_stand_in (see its docstring); the CPU torch stays as installed.
SCOREBOARD_ARGS ?= --jobs 2
TIMM ?= timm==1.0.31
$(VENV)/.scoreboard: $(STAMP)
	$(BIN)/pip install -q -e ".[scoreboard]"
	$(BIN)/pip install -q --no-deps "$(TIMM)"
	$(BIN)/python -c "import torch; print('scoreboard: torch', torch.__version__)"
	touch $@

scoreboard: $(VENV)/.scoreboard
	PYTHONPATH=. $(BIN)/python benchmarks/scoreboard.py $(SCOREBOARD_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
