/* Traces: Triton's timestamps for one request (TIMESTAMPS level), handed to
 * the sink Python gave submit() once the request is released.
 *
 * A request to an ensemble spawns a child trace per step request (and so on,
 * for nested ensembles). Triton reports every child's activity and release to
 * the root's callbacks with the root's userp, so both tell the traces apart:
 * the root's timestamps go to the record itself, each child's to an entry of
 * record->children. A child holds a reference on the record from its first
 * activity to its release; children are found by trace pointer in a global
 * table, so that the release of a child that never reported anything (and so
 * holds no reference) never touches a record that may be gone. */
#include "trace.h"

#include "threads.h"

#include <pthread.h>
#include <stdio.h>

#define MAX_CHILDREN 64 /* step requests traced per request; more are not reported */

typedef struct {
  TRITONSERVER_InferenceTrace* trace;
  uint64_t id, parent_id;
  char model[256];
  uint64_t ts[TRITONSERVER_TRACE_ACTIVITIES];
} ChildTrace;

typedef struct TraceRecord {
  atomic_int refs; /* the call's, the root trace's, and one per live child trace */
  PyObject* sink;  /* called once with (trace id, timestamps, children) */
  TRITONSERVER_InferenceTrace* root;
  uint64_t id;
  uint64_t ts[TRITONSERVER_TRACE_ACTIVITIES];
  int n_children;       /* under g_mu */
  ChildTrace* children; /* MAX_CHILDREN of them, allocated at the first child */
} TraceRecord;

/* live child traces -> their record (under g_mu) */
static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  TRITONSERVER_InferenceTrace* trace;
  TraceRecord* record;
} g_live[4 * MAX_CHILDREN];
static int g_n_live;

static void record_unref(TraceRecord* r)
{
  if (atomic_fetch_sub(&r->refs, 1) == 1) {
    free(r->children);
    free(r);
  }
}

/* Under g_mu: the entry of a child trace, created at its first activity (NULL when full). */
static ChildTrace* child_of(TraceRecord* r, TRITONSERVER_InferenceTrace* trace)
{
  for (int i = 0; i < r->n_children; i++)
    if (r->children[i].trace == trace) return &r->children[i];
  if (r->n_children == MAX_CHILDREN || g_n_live == (int)(sizeof g_live / sizeof g_live[0]))
    return NULL;
  if (r->children == NULL && (r->children = calloc(MAX_CHILDREN, sizeof(ChildTrace))) == NULL)
    return NULL;
  ChildTrace* c = &r->children[r->n_children++];
  memset(c, 0, sizeof *c);
  c->trace = trace;
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceTraceId(trace, &c->id);
  if (err) api.TRITONSERVER_ErrorDelete(err);
  err = api.TRITONSERVER_InferenceTraceParentId(trace, &c->parent_id);
  if (err) api.TRITONSERVER_ErrorDelete(err);
  const char* model = NULL;
  err = api.TRITONSERVER_InferenceTraceModelName(trace, &model);
  if (err) api.TRITONSERVER_ErrorDelete(err);
  snprintf(c->model, sizeof c->model, "%s", model ? model : "?");
  g_live[g_n_live].trace = trace;
  g_live[g_n_live++].record = r;
  atomic_fetch_add(&r->refs, 1);
  return c;
}

static void trace_activity(TRITONSERVER_InferenceTrace* trace, int activity, uint64_t timestamp_ns,
                           void* userp)
{
  TraceRecord* r = (TraceRecord*)userp;
  if (activity < 0 || activity >= TRITONSERVER_TRACE_ACTIVITIES) return;
  if (trace == r->root) {
    r->ts[activity] = timestamp_ns;
    return;
  }
  pthread_mutex_lock(&g_mu);
  ChildTrace* c = child_of(r, trace);
  if (c != NULL) c->ts[activity] = timestamp_ns;
  pthread_mutex_unlock(&g_mu);
}

/* With the GIL: the children's timestamps as a list of (model, trace id, parent id, stamps). */
static PyObject* children_list(TraceRecord* r)
{
  pthread_mutex_lock(&g_mu);
  int n = r->n_children;
  ChildTrace* copy = n ? malloc((size_t)n * sizeof *copy) : NULL;
  if (copy) memcpy(copy, r->children, (size_t)n * sizeof *copy);
  pthread_mutex_unlock(&g_mu);
  PyObject* list = PyList_New(0);
  for (int i = 0; copy && list && i < n; i++) {
    PyObject* stamps = PyTuple_New(TRITONSERVER_TRACE_ACTIVITIES);
    for (int k = 0; stamps && k < TRITONSERVER_TRACE_ACTIVITIES; k++)
      PyTuple_SET_ITEM(stamps, k, PyLong_FromUnsignedLongLong(copy[i].ts[k]));
    PyObject* item = stamps ? Py_BuildValue("(sKKN)", copy[i].model, (unsigned long long)copy[i].id,
                                            (unsigned long long)copy[i].parent_id, stamps)
                            : NULL;
    if (item == NULL || PyList_Append(list, item) < 0) Py_CLEAR(list);
    Py_XDECREF(item);
  }
  free(copy);
  return list;
}

/* With the GIL: hand the timestamps to the sink (once), drop one reference. */
void trace_deliver(TraceRecord* r)
{
  if (r->sink != NULL) {
    PyObject* stamps = PyTuple_New(TRITONSERVER_TRACE_ACTIVITIES);
    for (int i = 0; stamps && i < TRITONSERVER_TRACE_ACTIVITIES; i++)
      PyTuple_SET_ITEM(stamps, i, PyLong_FromUnsignedLongLong(r->ts[i]));
    PyObject* children = stamps ? children_list(r) : NULL;
    PyObject* res = children ? PyObject_CallFunction(r->sink, "KNN", (unsigned long long)r->id,
                                                     stamps, children)
                             : NULL;
    if (children == NULL) Py_XDECREF(stamps);
    if (res == NULL) PyErr_WriteUnraisable(r->sink);
    Py_XDECREF(res);
    Py_CLEAR(r->sink);
  }
  record_unref(r);
}

/* With the GIL: a trace Triton never took (its request was never handed over, see queues.c):
 * delete it; its record r (if any) goes to the sink and loses the root's reference too. */
void trace_abandon(TRITONSERVER_InferenceTrace* trace, TraceRecord* r)
{
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceTraceDelete(trace);
  if (err) api.TRITONSERVER_ErrorDelete(err);
  if (r != NULL) {
    trace_deliver(r);
    record_unref(r);
  }
}

/* Triton lets go of the trace when it deletes the request, which we do late
 * (see bury()); the timestamps are delivered earlier, when the request is
 * released (release_cb), and REQUEST_END is recorded by then. A child trace
 * is released when its step request is. */
static void trace_release(TRITONSERVER_InferenceTrace* trace, void* userp)
{
  TraceRecord* child_of_record = NULL;
  pthread_mutex_lock(&g_mu);
  for (int i = 0; i < g_n_live; i++)
    if (g_live[i].trace == trace) {
      child_of_record = g_live[i].record;
      g_live[i] = g_live[--g_n_live];
      break;
    }
  pthread_mutex_unlock(&g_mu);
  uint64_t parent = 0;
  TRITONSERVER_Error* err =
      child_of_record ? NULL : api.TRITONSERVER_InferenceTraceParentId(trace, &parent);
  if (err) api.TRITONSERVER_ErrorDelete(err), parent = 1; /* unknown: leave the record alone */
  err = api.TRITONSERVER_InferenceTraceDelete(trace);
  if (err) api.TRITONSERVER_ErrorDelete(err);
  if (child_of_record != NULL) { /* a child that reported: drop its reference */
    int entered = gil_enter();
    record_unref(child_of_record);
    gil_leave(entered);
    return;
  }
  if (parent != 0) return; /* a child that never reported: it holds nothing */
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
  r->root = trace;
  atomic_fetch_add(&r->refs, 1); /* the call's */
  *record = r;
  err = api.TRITONSERVER_InferenceTraceId(trace, &r->id);
  if (err) api.TRITONSERVER_ErrorDelete(err);
  r->sink = Py_NewRef(sink);
  return trace;
}
