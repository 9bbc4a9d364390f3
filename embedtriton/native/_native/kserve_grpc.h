/* kserve_grpc.c: a unary gRPC ModelInfer answered in C. */
#ifndef EMBEDTRITON_KSERVE_GRPC_H
#define EMBEDTRITON_KSERVE_GRPC_H

#include "common.h"

PyObject* py_grpc_model_infer(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
PyObject* py_grpc_stats(PyObject* self, PyObject* unused);

#endif
