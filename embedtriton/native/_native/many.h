/* many.c: submit_many(): a window of calls at a time. */
#ifndef EMBEDTRITON_MANY_H
#define EMBEDTRITON_MANY_H

#include "common.h"

PyObject* py_submit_many(PyObject* self, PyObject* const* args, Py_ssize_t nargs);

#endif
