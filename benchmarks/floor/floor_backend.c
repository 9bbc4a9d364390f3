/* The floor's model: a Triton backend in C with no Python anywhere. For each request it reads
 * FP32 inputs "a" and "b" (any shape, one buffer each) and answers "add" = a + b and
 * "sub" = a - b. Built by benchmarks/bench_floor.py, never shipped. Triton finds it as
 * libtriton_floor.so in the model's folder. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct TRITONSERVER_Error TRITONSERVER_Error;
typedef struct TRITONBACKEND_ModelInstance TRITONBACKEND_ModelInstance;
typedef struct TRITONBACKEND_Request TRITONBACKEND_Request;
typedef struct TRITONBACKEND_Response TRITONBACKEND_Response;
typedef struct TRITONBACKEND_Input TRITONBACKEND_Input;
typedef struct TRITONBACKEND_Output TRITONBACKEND_Output;
typedef int TRITONSERVER_DataType;
typedef int TRITONSERVER_MemoryType;
enum { FP32 = 11, CPU = 0, ERROR_INVALID_ARG = 3, RESPONSE_COMPLETE_FINAL = 1, RELEASE_ALL = 1 };

extern TRITONSERVER_Error* TRITONSERVER_ErrorNew(int code, const char* msg);
extern TRITONSERVER_Error* TRITONBACKEND_RequestInput(TRITONBACKEND_Request*, const char*,
                                                      TRITONBACKEND_Input**);
extern TRITONSERVER_Error* TRITONBACKEND_InputProperties(TRITONBACKEND_Input*, const char**,
                                                         TRITONSERVER_DataType*, const int64_t**,
                                                         uint32_t*, uint64_t*, uint32_t*);
extern TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input*, uint32_t, const void**,
                                                     uint64_t*, TRITONSERVER_MemoryType*, int64_t*);
extern TRITONSERVER_Error* TRITONBACKEND_ResponseNew(TRITONBACKEND_Response**,
                                                     TRITONBACKEND_Request*);
extern TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response*,
                                                        TRITONBACKEND_Output**, const char*,
                                                        TRITONSERVER_DataType, const int64_t*,
                                                        uint32_t);
extern TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output*, void**, uint64_t,
                                                      TRITONSERVER_MemoryType*, int64_t*);
extern TRITONSERVER_Error* TRITONBACKEND_ResponseSend(TRITONBACKEND_Response*, uint32_t,
                                                      TRITONSERVER_Error*);
extern TRITONSERVER_Error* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request*, uint32_t);
extern TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(TRITONBACKEND_ModelInstance*,
                                                                       TRITONBACKEND_Request*, bool,
                                                                       uint64_t, uint64_t, uint64_t,
                                                                       uint64_t);
extern TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(
    TRITONBACKEND_ModelInstance*, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

/* Triton's statistics clock (steady_clock: CLOCK_MONOTONIC) */
static uint64_t now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static TRITONSERVER_Error* answer(TRITONBACKEND_Request* request, TRITONBACKEND_Response* response)
{
  const float* in[2];
  const int64_t* shape = NULL;
  uint32_t dims = 0;
  uint64_t bytes = 0;
  const char* names[2] = {"a", "b"};
  for (int i = 0; i < 2; i++) {
    TRITONBACKEND_Input* input;
    TRITONSERVER_DataType dtype;
    uint32_t buffers;
    TRITONSERVER_MemoryType memory = CPU;
    int64_t memory_id = 0;
    uint64_t size;
    TRITONSERVER_Error* err = TRITONBACKEND_RequestInput(request, names[i], &input);
    if (!err)
      err = TRITONBACKEND_InputProperties(input, NULL, &dtype, &shape, &dims, &bytes, &buffers);
    if (!err && (dtype != FP32 || buffers != 1))
      err = TRITONSERVER_ErrorNew(ERROR_INVALID_ARG, "floor: FP32, 1 buffer");
    if (!err)
      err = TRITONBACKEND_InputBuffer(input, 0, (const void**)&in[i], &size, &memory, &memory_id);
    if (err) return err;
  }
  const char* outs[2] = {"add", "sub"};
  for (int o = 0; o < 2; o++) {
    TRITONBACKEND_Output* output;
    float* out;
    TRITONSERVER_MemoryType memory = CPU;
    int64_t memory_id = 0;
    TRITONSERVER_Error* err =
        TRITONBACKEND_ResponseOutput(response, &output, outs[o], FP32, shape, dims);
    if (!err) err = TRITONBACKEND_OutputBuffer(output, (void**)&out, bytes, &memory, &memory_id);
    if (err) return err;
    for (uint64_t k = 0; k < bytes / sizeof(float); k++)
      out[k] = o == 0 ? in[0][k] + in[1][k] : in[0][k] - in[1][k];
  }
  return NULL;
}

/* Reports statistics as a real backend does (the stage table of bench_floor.py reads them):
 * compute_input = the responses made, compute_infer = inputs read, added, outputs written,
 * compute_output = the responses sent. */
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests,
                                                       const uint32_t count)
{
  enum { MOST = 64 };
  TRITONBACKEND_Response* responses[MOST];
  TRITONSERVER_Error* errors[MOST];
  uint64_t exec_start = now_ns();
  uint32_t n = count < MOST ? count : MOST; /* (the floor's models batch at most 8) */
  for (uint32_t r = 0; r < n; r++)
    if (TRITONBACKEND_ResponseNew(&responses[r], requests[r]) != NULL) responses[r] = NULL;
  uint64_t compute_start = now_ns();
  for (uint32_t r = 0; r < n; r++)
    errors[r] = responses[r] ? answer(requests[r], responses[r]) : NULL;
  uint64_t compute_end = now_ns();
  for (uint32_t r = 0; r < n; r++)
    if (responses[r] != NULL)
      TRITONBACKEND_ResponseSend(responses[r], RESPONSE_COMPLETE_FINAL, errors[r]);
  uint64_t exec_end = now_ns();
  for (uint32_t r = 0; r < n; r++) {
    TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[r], responses[r] && !errors[r],
                                                exec_start, compute_start, compute_end, exec_end);
    TRITONBACKEND_RequestRelease(requests[r], RELEASE_ALL);
  }
  TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, n, exec_start, compute_start,
                                                   compute_end, exec_end);
  return NULL;
}
