/* batch_io.c: the model side's shared state (a bound model's ModelState) and a batch's
 * inputs to Python, its outputs to Triton. */
#ifndef EMBEDTRITON_BATCH_IO_H
#define EMBEDTRITON_BATCH_IO_H

#include "common.h"

typedef struct {
  char* name;
  PyObject* name_obj;
  TRITONSERVER_DataType dtype;
  int ndims;
  int64_t dims[MAX_DIMS];
  int gpu; /* Tensor(device="gpu"): ask Triton for GPU memory even for a host array */
} OutputSpec;

typedef struct {
  PyObject* binding;
  PyObject* execute;
  char* name;
  int64_t max_batch_size;
  int decoupled;
  int sequence;      /* sequence batcher: control inputs become Request attributes */
  int with_batcher;  /* Triton's dynamic or sequence batcher hands requests to the instances */
  PyObject* include; /* custom batching: binding._include(batch, candidate), or NULL */
  PyObject* iterate; /* iterative sequences: binding._iterate(step), or NULL */
  Py_ssize_t n_outputs;
  OutputSpec* outputs;
  PyObject* gpu_wrap; /* GPU inputs for the callable: DeviceArray -> cupy/torch; NULL: as is */
  char** gpu_inputs;  /* inputs declared Tensor(device="gpu") */
  Py_ssize_t n_gpu_inputs;
  /* Warm-up: the executions left before the model serves (binding.warmup_runs), and whether one
   * failed. Triton 2.51 crashes when a warm-up request fails, so a warm-up failure is recorded
   * (binding.warmup_error) and answered as a success; the server then fails the load itself. */
  atomic_int warmup_left;
  atomic_int warmup_failed;
  struct Gate* gate; /* queue policies and priorities (binding.queue_gate), or NULL */
  /* A plain @batch function that fast_batch.c calls itself (binding.fast_batch), or NULL: the
   * function, whether it takes parameters, runner.failed, split_outputs, and the parameters
   * that send a request's batch the general way (a span key, a deadline). */
  PyObject* fast_func;
  int fast_parameters;
  PyObject *fast_failed, *fast_split;
  char* fast_declines[2];
} ModelState;

/* The model whose warm-up this thread is running, or NULL (send_final records its errors). */
extern __thread ModelState* t_warmup;

PyObject* read_parameters(TRITONBACKEND_Request* request, TRITONSERVER_Error** err);
int input_wants_gpu(ModelState* ms, const char* name);
TRITONSERVER_Error* gather_input(TRITONBACKEND_Input* input, const char* name, uint32_t n_buffers,
                                 char* dst, uint64_t byte_size, int dst_gpu);
PyObject* host_view(const void* data, TRITONSERVER_DataType dtype, int typenum, int ndim,
                    npy_intp* dims);
PyObject* host_copy(TRITONBACKEND_Input* input, const char* name, uint32_t n_buffers, int typenum,
                    int ndim, npy_intp* dims, TRITONSERVER_Error** err);

PyObject* build_request(TRITONBACKEND_Request* request, ModelState* ms, int device,
                        PyObject** views, Py_ssize_t* n_views, uint64_t* batch_size,
                        TRITONSERVER_Error** err);
TRITONSERVER_Error* fill_response(ModelState* ms, TRITONBACKEND_Request* request,
                                  TRITONBACKEND_Response* response, PyObject* out,
                                  uint64_t batch_size, size_t index);
TRITONBACKEND_Response* respond(ModelState* ms, TRITONBACKEND_Request* request, PyObject* out,
                                uint64_t batch_size, size_t index, TRITONSERVER_Error** error);
void send_final(TRITONBACKEND_Response* response, TRITONSERVER_Error* err);
void detach_view(PyArrayObject* arr);

#endif
