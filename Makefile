# The two commands of the README. Both are idempotent on a fresh machine: `make demo`, `make test`.
.PHONY: setup demo test bench

setup:
	bash .ci/setup-host

demo: setup
	bash examples/demo/run.sh

test: setup
	RECONCILER_REQUIRE_DOCKER=1 python3 -m pytest -q -p no:cacheprovider tests

bench: setup
	python3 tests/bench/bench_plan.py
