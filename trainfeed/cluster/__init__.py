"""Running trainfeed jobs on Kubernetes: what a job is made of (spec, objects) and the CLI's
calls to the cluster (submit, scale, status, delete)."""
