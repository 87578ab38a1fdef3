# The two commands of the README. Both are idempotent on a fresh machine: `make demo`, `make test`.
.PHONY: setup demo test bench

setup:
	bash .ci/setup-host

demo: setup
	bash examples/demo/run.sh

test: setup
	RECONCILER_REQUIRE_DOCKER=1 python3 -m pytest -q -p no:cacheprovider tests

bench: setup
	status=0; for b in tests/bench/bench_*.py; do echo "== $$b"; python3 $$b || status=1; done; exit $$status
