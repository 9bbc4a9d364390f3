/* kserve.c: a unary gRPC ModelInfer or HTTP/REST inference answered in C. */
#ifndef EMBEDTRITON_KSERVE_H
#define EMBEDTRITON_KSERVE_H

#include "common.h"

PyObject* py_grpc_model_infer(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* py_grpc_stats(PyObject* self, PyObject* unused);
PyObject* py_http_stats(PyObject* self, PyObject* unused);
PyObject* http_fast_capsule(void);
PyObject* py_grpc_release(PyObject* self, PyObject* unused);

#endif
