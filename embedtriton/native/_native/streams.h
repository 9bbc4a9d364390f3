/* streams.c: a stream's hooks (stream_ops): responses queued for their consumer. */
#ifndef EMBEDTRITON_STREAMS_H
#define EMBEDTRITON_STREAMS_H

#include "calls.h"

extern const CallOps stream_ops;
PyObject* py_stream_next(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
int take_stream_closed(void* request);
PyObject* py_stream_close(PyObject* self, PyObject* capsule);

#endif
