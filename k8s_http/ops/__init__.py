"""Operations: what a process exposes and how it is run.

Metrics (`metrics`), logging (`log`), the standard flags and the command line's
end (`flags`, `cli`), the /healthz, /readyz and /metrics server (`probes`) and
its authorization (`authn`), and the allocator and garbage-collector tuning
(`allocator`, `gctuning`). Imports only `core` and `config`, so the wire, the
cache and control can all count and log.
"""
