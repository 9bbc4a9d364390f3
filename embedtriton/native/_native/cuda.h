/* cuda.c: the CUDA runtime (loaded by cuda_init), copies and device allocations, CUDA IPC. */
#ifndef EMBEDTRITON_CUDA_H
#define EMBEDTRITON_CUDA_H

#include "common.h"

int cuda_ready(void);
const char* cuda_copy(void* dst, const void* src, size_t n);
const char* cuda_alloc(void** ptr, size_t n, int device);
void cuda_free(void* ptr);
PyObject* py_cuda_init(PyObject* self, PyObject* arg);
PyObject* py_cuda_ipc_open(PyObject* self, PyObject* args);
PyObject* py_cuda_ipc_close(PyObject* self, PyObject* args);
PyObject* py_cuda_allocation_size(PyObject* self, PyObject* args);

#endif
