"""k8s_http: a Kubernetes operator runtime on the Python standard library."""
