/* kserve_http.c: an HTTP/REST inference answered in C. */
#ifndef EMBEDTRITON_KSERVE_HTTP_H
#define EMBEDTRITON_KSERVE_HTTP_H

#include "common.h"

PyObject* http_fast_capsule(void);
PyObject* py_http_stats(PyObject* self, PyObject* unused);

#endif
