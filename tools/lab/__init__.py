"""Lab harnesses, outside the installed package: the memory-pressure episode's load and cgroup
(tools/pressure_episode.py), the random-weight checkpoints the model checks build
(tools/gpu_model_check.py, and the tests through tests/model_helpers.py), and the tiny Llama and
its int4 checkpoint the back-end checks score (tools/backend_agreement.py,
tests/backend_helpers.py).
Scripts in tools/ import them as `lab.<module>` (tools/ is their sys.path[0]).
"""
