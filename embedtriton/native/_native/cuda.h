/* cuda.c: GPU memory: the CUDA runtime, DeviceArray, the holds of a request's GPU inputs, GPU
 * arrays a callable returned, CUDA IPC. */
#ifndef EMBEDTRITON_CUDA_H
#define EMBEDTRITON_CUDA_H

#include "common.h"

extern PyTypeObject DeviceArrayType, HoldType;

/* An array in GPU memory that a callable returned, read through DLPack. */
typedef struct {
  PyObject* holder;         /* a DeviceArray, or NULL */
  DLManagedTensor* managed; /* or the consumed DLPack tensor */
  const void* data;
  size_t nbytes;
  int ndim;
  int64_t shape[MAX_DIMS];
  TRITONSERVER_DataType dtype;
  int device;
} GpuValue;

int cuda_ready(void);
const char* cuda_copy(void* dst, const void* src, size_t n);
const char* cuda_alloc(void** ptr, size_t n, int device);
void cuda_free(void* ptr);
TRITONSERVER_DataType dl_dtype(DLDataType t);
int is_device_array(PyObject* o);
PyObject* device_array_new(void* ptr, size_t nbytes, int ndim, const int64_t* shape,
                           TRITONSERVER_DataType dtype, int device, int owns, PyObject* owner);
PyObject* device_array_alloc(size_t nbytes, int ndim, const int64_t* shape,
                             TRITONSERVER_DataType dtype, int device);
void* device_array_ptr(PyObject* o);
size_t device_array_nbytes(PyObject* o);
int device_array_device(PyObject* o);
PyObject* hold_new(TRITONBACKEND_Request* request);
int is_hold(PyObject* o);
TRITONBACKEND_Request* hold_drop(PyObject* o);
int gpu_value(PyObject* value, GpuValue* g, const char* name, TRITONSERVER_Error** err);
void gpu_value_done(GpuValue* g);
PyObject* py_cuda_init(PyObject* self, PyObject* arg);
PyObject* py_device_array(PyObject* self, PyObject* args);
PyObject* py_cuda_ipc_open(PyObject* self, PyObject* args);
PyObject* py_cuda_ipc_close(PyObject* self, PyObject* args);
PyObject* py_cuda_allocation_size(PyObject* self, PyObject* args);

#endif
