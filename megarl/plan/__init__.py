"""The launch plan (`python -m megarl.plan`): placement of every role on the cluster and an
estimate of GPU memory per role and phase, checked before any worker starts."""
