# The two commands of a fresh machine: `make verify` (the main job) and `make test`.
# Both bootstrap .venv themselves; `make venv` bootstraps only (idempotent).
PYTHON ?= python3
VENV := .venv
STAMP := $(VENV)/.shardcheck-bootstrapped
UV := $(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(VENV)/bin/python
REQS := requirements/bootstrap.txt requirements/base.txt requirements/native.txt requirements/lmcache.txt pyproject.toml \
	requirements/install-lmcache.sh requirements/docs.txt requirements/vllm.txt requirements/install-vllm.sh \
	requirements/mooncake.txt requirements/install-mooncake.sh requirements/sglang.txt requirements/install-sglang.sh
# The compiled hot paths (checking/native.py): rebuilt when a compiled module's source changes. A failed build says so in
# one line and leaves pure Python running; it never fails the set-up.
NATIVE := $(VENV)/.shardcheck-native-built
NATIVE_SRC := tools/build_native.py checking/native.py $(wildcard checking/linearizability/*.py) $(wildcard checking/explore/*.py)

.PHONY: venv verify test clean

venv: $(STAMP) $(NATIVE)

$(STAMP): $(REQS)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements/bootstrap.txt
	$(UV) -r requirements/base.txt -r requirements/native.txt
	bash requirements/install-lmcache.sh $(VENV)
	$(UV) -r requirements/docs.txt
	bash requirements/install-vllm.sh $(VENV)
	bash requirements/install-mooncake.sh $(VENV)
	bash requirements/install-sglang.sh $(VENV)
	$(UV) --no-deps --no-build-isolation -e .
	touch $(STAMP)

$(NATIVE): $(STAMP) $(NATIVE_SRC)
	$(VENV)/bin/python tools/build_native.py
	touch $(NATIVE)

verify: venv
	$(VENV)/bin/shardcheck verify

# The ci Hypothesis profile is derandomized: the same examples on every run. Four workers on the two cores: most of a
# test's time is a bound or a budget running out, not CPU. Every timing is judged in the machine's time (docs/timing.md),
# so the verdicts hold beside each other (three workers once failed tight bounds judged by the wall clock); the main
# pass went from 9 min 11 s on two workers to 5 min 54 s on four, and passed whole beside two CPU hogs (8 min 22 s).
# The load tests (`-m load`) run alone after the rest: their CPU hogs would slow every test beside them. So do the
# vLLM tests (`-m vllm`, one vLLM process: its start is a minute of both cores; beside the rest, four timing-judged
# tests were starved in one run), and the SGLang tests (`-m sglang`: rank processes judged against 1-2 s bounds). The
# compiled modules' own tests run a second time on their pure Python source
# (SHARDCHECK_PURE=1).
PURE_TESTS := tests/test_linearizability.py tests/test_linearizability_sweep.py tests/test_explore.py tests/test_native.py
test: venv
	$(VENV)/bin/lint-imports
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(VENV)/bin/python -m pytest -n 4 --dist worksteal -m "not load and not vllm and not sglang"
	SHARDCHECK_PURE=1 HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(VENV)/bin/python -m pytest -n 2 --dist worksteal \
		-m "not load and not vllm and not sglang" $(PURE_TESTS)
	$(VENV)/bin/python -m pytest -m vllm tests/test_vllm_stack.py tests/test_mooncake.py
	$(VENV)/bin/python -m pytest -m sglang tests/test_sglang_stack.py
	HYPOTHESIS_PROFILE=$${HYPOTHESIS_PROFILE:-ci} $(VENV)/bin/python -m pytest -m load tests/test_under_load.py

clean:
	rm -rf $(VENV) .pytest_cache out
