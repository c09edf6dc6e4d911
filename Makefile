# Quick start targets. Both set the machine up first (tools/bootstrap.sh is idempotent).
.PHONY: setup demo test

setup:
	@tools/bootstrap.sh

demo: setup
	.venv/bin/edge-runtime voice --demo --config cpu-dev \
		--system-prompt configs/voice/home-actions.yaml --events demo-events.jsonl

test: setup
	.venv/bin/pytest -q
