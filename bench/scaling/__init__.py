"""bench/scale.py's parts: the fleet, the bare client, the arithmetic, the report."""
