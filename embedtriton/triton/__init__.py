"""The only Python that touches Triton's C API: finding and loading the runtime
(:mod:`.runtime`), its declarations (:mod:`.capi`), server options (:mod:`.options`), the
control plane (:mod:`.control`), its log (:mod:`.log`), the guard of the python backend's stub
processes (:mod:`.stubs`) and the CUDA probe (:mod:`.devices`)."""
