/* cancel.c: a caller's cancel; stop()'s cancel_all, fail_pending, abort_pending. */
#ifndef EMBEDTRITON_CANCEL_H
#define EMBEDTRITON_CANCEL_H

#include "calls.h"

void call_cancel(Call* c);
PyObject* py_cancel_all(PyObject* self, PyObject* arg);
PyObject* py_fail_pending(PyObject* self, PyObject* arg);
PyObject* py_abort_pending(PyObject* self, PyObject* arg);

#endif
