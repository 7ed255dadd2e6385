"""Pieces of bench/converge.py: the control plane and write counting (cluster),
what the apiserver shows (observer), the operators under test (operators) and
the report (report). Bench code only: never imported by the project."""
