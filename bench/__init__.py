"""The benchmarks: `python -m bench` lists them, `python -m bench NAME --help` shows one.

Bench code only: never imported by the project, never packaged (setup.cfg
names `k8s_http` and `controller` alone).
"""
