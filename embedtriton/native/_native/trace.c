/* Traces: Triton's timestamps for one request (TIMESTAMPS level), handed to
 * the sink Python gave submit() once the request is released. */
#include "native.h"

/* ---- traces: Triton's timestamps for one request, handed to Python ------- */

typedef struct TraceRecord {
  atomic_int refs; /* the call's and the trace's */
  PyObject* sink;  /* called once with (trace id, timestamps tuple) */
  uint64_t id;
  uint64_t ts[TRITONSERVER_TRACE_ACTIVITIES];
} TraceRecord;

static void trace_activity(TRITONSERVER_InferenceTrace* trace, int activity, uint64_t timestamp_ns,
                           void* userp)
{
  (void)trace;
  TraceRecord* r = (TraceRecord*)userp;
  if (activity >= 0 && activity < TRITONSERVER_TRACE_ACTIVITIES) r->ts[activity] = timestamp_ns;
}

/* With the GIL: hand the timestamps to the sink (once), drop one reference. */
void trace_deliver(TraceRecord* r)
{
  if (r->sink != NULL) {
    PyObject* stamps = PyTuple_New(TRITONSERVER_TRACE_ACTIVITIES);
    for (int i = 0; stamps && i < TRITONSERVER_TRACE_ACTIVITIES; i++)
      PyTuple_SET_ITEM(stamps, i, PyLong_FromUnsignedLongLong(r->ts[i]));
    PyObject* res =
        stamps ? PyObject_CallFunction(r->sink, "KN", (unsigned long long)r->id, stamps) : NULL;
    if (res == NULL) PyErr_WriteUnraisable(r->sink);
    Py_XDECREF(res);
    Py_CLEAR(r->sink);
  }
  if (atomic_fetch_sub(&r->refs, 1) == 1) free(r);
}

/* Triton lets go of the trace when it deletes the request, which we do late
 * (see bury()); the timestamps are delivered earlier, when the request is
 * released (release_cb), and REQUEST_END is recorded by then. */
static void trace_release(TRITONSERVER_InferenceTrace* trace, void* userp)
{
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceTraceDelete(trace);
  if (err) api.TRITONSERVER_ErrorDelete(err);
  int entered = gil_enter();
  trace_deliver((TraceRecord*)userp);
  gil_leave(entered);
}

/* With the GIL: a trace whose timestamps go to sink, or NULL with an error. */
TRITONSERVER_InferenceTrace* trace_new(PyObject* sink, TraceRecord** record)
{
  TraceRecord* r = calloc(1, sizeof(TraceRecord));
  if (r == NULL) return (TRITONSERVER_InferenceTrace*)PyErr_NoMemory();
  atomic_init(&r->refs, 1);
  TRITONSERVER_InferenceTrace* trace = NULL;
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceTraceNew(
      &trace, TRITONSERVER_TRACE_LEVEL_TIMESTAMPS, 0, trace_activity, trace_release, r);
  if (err != NULL) {
    free(r);
    raise_from(err, 1);
    return NULL;
  }
  atomic_fetch_add(&r->refs, 1); /* the call's */
  *record = r;
  err = api.TRITONSERVER_InferenceTraceId(trace, &r->id);
  if (err) api.TRITONSERVER_ErrorDelete(err);
  r->sink = Py_NewRef(sink);
  return trace;
}
