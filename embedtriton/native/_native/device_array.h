/* device_array.c: device memory as Python objects: DeviceArray, the holds of a request's GPU
 * inputs, GPU arrays a callable returned. */
#ifndef EMBEDTRITON_DEVICE_ARRAY_H
#define EMBEDTRITON_DEVICE_ARRAY_H

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
PyObject* py_device_array(PyObject* self, PyObject* args);

#endif
