/* trace.c: Triton's timestamps for one request. */
#ifndef EMBEDTRITON_TRACE_H
#define EMBEDTRITON_TRACE_H

#include "common.h"

struct TraceRecord;
void trace_deliver(struct TraceRecord* r);
void trace_abandon(TRITONSERVER_InferenceTrace* trace, struct TraceRecord* r);
TRITONSERVER_InferenceTrace* trace_new(PyObject* sink, struct TraceRecord** record);

#endif
