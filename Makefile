# The two commands of the README. Both are idempotent on a fresh Debian machine, as root: `make demo`, `make test`.
# `make setup` installs the Debian packages the tests need and creates .venv/ (the project's own virtual
# environment); `make demo` installs only what the demo needs (the engine, the venv, curl, jq). Everything else runs
# .venv's Python.
.PHONY: setup setup-demo demo test bench fresh soak schemas host-install

PY := .venv/bin/python

setup:
	bash .ci/setup-host

setup-demo:
	bash .ci/setup-host --demo

demo: setup-demo
	PYTHON=$(PY) bash examples/demo/run.sh

test: setup
	RECONCILER_REQUIRE_DOCKER=1 $(PY) -m pytest -q -p no:cacheprovider tests

# The simulated host for a long budget: SOAK_STEPS in all (default 1,000,000), SOAK_SEED to replay, SOAK_WORKERS
# processes; SOAK_SEEDS="1 2 3" (or a count, SOAK_SEEDS=8) for independent runs, one line per seed and a total.
soak: setup
	$(PY) tests/sim/soak.py

bench: setup
	status=0; for b in tests/bench/bench_*.py; do echo "== $$b"; $(PY) $$b || status=1; done; exit $$status

# The published JSON Schemas of the operator's files (schemas/), regenerated from the model after a change to it;
# tests/contract/test_schemas.py fails while they differ.
schemas:
	for k in host recipe manifest; do $(PY) -m reconciler schema $$k > schemas/$$k.schema.json; done

# The README's two commands on a stock Debian container (Docker in Docker): see tests/fresh/run.sh.
fresh: setup
	bash tests/fresh/run.sh

# README's "On your own GPU host" on a stock Debian 12 container: the wheel installed with pipx and with uv, init,
# the loop as the unit starts it, converged, uninstalled (minutes, and PyPI's network): see tests/fresh/host.sh.
host-install: setup
	PYTHON=$(PY) bash tests/fresh/host.sh
