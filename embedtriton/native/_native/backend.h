/* backend.c: the backend (TRITONBACKEND_* entry points) and its Python functions. */
#ifndef EMBEDTRITON_BACKEND_H
#define EMBEDTRITON_BACKEND_H

#include "common.h"

PyObject* py_finish_batch(PyObject* self, PyObject* args);

#endif
