"""GPU benchmark tooling, outside the installed package: the correctness and timing checks, launch
configuration sweeps and timing helpers that tools/gpu_check.py runs, and the SASS instruction-count
probe (`python tools/gpu_lab/sass_probe.py`). Results of runs on lent GPUs are in results/.
"""
