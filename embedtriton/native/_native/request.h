/* request.c: a request's inputs added to Triton from C descriptors (InputDesc), the one place
 * every builder ends: submit() (inputs.c reads Python's arrays and DLPack tensors into them),
 * submit_many's deferred inputs (many.c, without the GIL) and the KServe decoders' messages
 * (kserve.c). */
#ifndef EMBEDTRITON_REQUEST_H
#define EMBEDTRITON_REQUEST_H

#include "common.h"

/* One input as Triton takes it: its name (NUL-terminated; Triton copies it), dtype, shape and
 * one buffer, host or device. Whoever fills it keeps the name, shape and buffer alive until
 * Triton releases the request. */
typedef struct InputDesc {
  const char* name;
  TRITONSERVER_DataType dtype;
  uint32_t ndim;
  const int64_t* shape;
  const void* data;
  size_t nbytes;
  TRITONSERVER_MemoryType memory; /* TRITONSERVER_MEMORY_CPU (0) unless said */
  int64_t device;                 /* the GPU's id for TRITONSERVER_MEMORY_GPU */
} InputDesc;

TRITONSERVER_Error* request_add_inputs(TRITONSERVER_InferenceRequest* req, const InputDesc* in,
                                       int n);

#endif
