# Quick start targets. Both set the machine up first (tools/bootstrap.sh is idempotent).
.PHONY: setup demo test

setup:
	@tools/bootstrap.sh

demo: setup
	.venv/bin/edge-runtime voice --demo --config cpu-dev

test: setup
	.venv/bin/python -m pytest -q
