"""The HTTP frontends: the KServe-v2 REST endpoint (:mod:`.rest`, its connections served in C by
``embedtriton._h2.HttpServer`` in :mod:`.endpoint`; its answers :mod:`.answers`, the extensions
besides inference :mod:`.extensions`, the generate extension :mod:`.generate`), its options
(:mod:`.options`), Triton's Vertex AI endpoint (:mod:`.vertex_ai`) and Prometheus metrics
(:mod:`.metrics`)."""
