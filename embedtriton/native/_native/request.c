/* A request's inputs added to Triton from C descriptors (InputDesc): see request.h. */
#include "request.h"

/* in[0..n) on req, each its declaration and its one buffer; Triton's error for the first one
 * it refuses (those before it stay on req, which the caller deletes). Needs no GIL. */
TRITONSERVER_Error* request_add_inputs(TRITONSERVER_InferenceRequest* req, const InputDesc* in,
                                       int n)
{
  for (int i = 0; i < n; i++) {
    TRITONSERVER_Error* err = api.TRITONSERVER_InferenceRequestAddInput(
        req, in[i].name, in[i].dtype, in[i].shape, (uint64_t)in[i].ndim);
    if (err == NULL)
      err = api.TRITONSERVER_InferenceRequestAppendInputData(
          req, in[i].name, in[i].data, in[i].nbytes, in[i].memory, in[i].device);
    if (err != NULL) return err;
  }
  return NULL;
}
