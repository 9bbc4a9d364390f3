"""The HTTP frontends: the KServe-v2 REST endpoint (:mod:`.rest`; its connections
:mod:`.connection` and :mod:`.listener`, the extensions besides inference :mod:`.extensions`,
the generate extension :mod:`.generate`), its options (:mod:`.options`), Triton's Vertex AI
endpoint (:mod:`.vertex_ai`) and Prometheus metrics (:mod:`.metrics`). The REST endpoints need
``pip install "embedtriton[http]"``."""
