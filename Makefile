# Quick start targets. Both set the machine up first (tools/bootstrap.sh is idempotent).
.PHONY: setup demo test

setup:
	@tools/bootstrap.sh

demo: setup
	.venv/bin/edge-runtime voice --demo --config cpu-dev \
		--system-prompt configs/voice/home-actions.yaml --events demo-events.jsonl

# The suite runs in TEST_WORKERS processes (pytest-xdist; tests are handed out one by one, so a long
# file does not hold one worker), then the `serial` tests alone: they read machine-wide memory that
# the other workers would move.
TEST_WORKERS ?= 2

test: setup
	.venv/bin/pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not serial"
	.venv/bin/pytest -q -m serial
