"""bench/shards.py's parts: the arithmetic (analysis) and the report."""
