"""HTTP frontends: Prometheus metrics (:mod:`.metrics`)."""
