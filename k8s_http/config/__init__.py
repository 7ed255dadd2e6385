"""Configuration and credentials: where the apiserver is, how to trust it, who we are.

`cluster.load_config()` (kubeconfig, in-cluster, `$KUBECONFIG`) gives a
`ClusterConfig`; `kubeconfig`, `credentials`, `tls` and `urls` are its parts,
and every failure is one `configerror.ConfigError` line. Imports only `core`.
"""
