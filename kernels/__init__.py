"""Triton kernels and their torch references; installed as edge_runtime.kernels."""
