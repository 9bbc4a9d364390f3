/* submit_many(): many requests from one Python call (Model.infer_many). The
 * caller hands Triton up to `window` requests, then waits (without the GIL)
 * until half of them are done, collects those and hands over more: one
 * wake-up per window/2 requests instead of one per request, and Triton's
 * queue never runs dry while the caller refills it. */
#include "many.h"

#include "calls.h"
#include "cancel.h"
#include "graveyard.h"
#include "outputs.h"
#include "request.h"
#include "request_spec.h"
#include "servers.h"
#include "submit.h"
#include "threads.h"
#include "trace.h"

/* With the GIL: the raised exception, taken (a new reference; None if there is none). */
static PyObject* take_exception(void)
{
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != NULL && value != NULL) PyException_SetTraceback(value, tb);
  Py_XDECREF(type);
  Py_XDECREF(tb);
  return value != NULL ? value : Py_NewRef(Py_None);
}

/* With the GIL: hand the calls that submit_locked built (deferred) since the last
 * hand-over (in window[from..*held)) to Triton, letting go of the GIL once for all of them: the
 * model thread runs the first ones meanwhile, instead of waiting for this caller's GIL. (One
 * release per request instead let the model thread in after each, and each took the GIL
 * back from it: a convoy.) Those Triton refuses leave the window, their error in results. */
static void hand_over_window(TRITONSERVER_Server* server, Group* g, Call** window, Py_ssize_t from,
                             Py_ssize_t* held, PyObject* results)
{
  Py_ssize_t built = 0;
  for (Py_ssize_t i = from; i < *held; i++) built += window[i]->deferred.waiting;
  if (built == 0) return;
  int open = lock_open_server(server) == 0;
  if (open) {
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = from; i < *held; i++) {
      Call* c = window[i];
      if (!c->deferred.waiting) continue;
      /* its numpy inputs, read by submit_locked (pending_input), then the request to Triton */
      c->deferred.error = request_add_inputs(c->request, c->deferred.inputs, c->deferred.n_inputs);
      if (c->deferred.error != NULL) continue; /* (its trace is abandoned below) */
      TRITONSERVER_InferenceTrace* trace = c->deferred.trace;
      c->deferred.trace = NULL;
      c->deferred.error = hand_over(server, c->request, trace);
    }
    pthread_rwlock_unlock(&servers_lock);
    Py_END_ALLOW_THREADS
  }
  Py_ssize_t kept = from;
  for (Py_ssize_t i = from; i < *held; i++) {
    Call* c = window[i];
    if (!c->deferred.waiting) {
      window[kept++] = c;
      continue;
    }
    c->deferred.waiting = 0;
    TRITONSERVER_Error* err = c->deferred.error;
    c->deferred.error = NULL;
    if (!open) {
      PyErr_Clear(); /* (raised for each below) */
      err = api.TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, NOT_RUNNING);
    }
    if (c->deferred.trace != NULL) trace_abandon(c->deferred.trace, NULL); /* (never handed over) */
    c->deferred.trace = NULL;
    if (err == NULL) {
      window[kept++] = c;
      continue;
    }
    Py_ssize_t index = c->group_index;
    submit_refused(c, err, 0);
    atomic_fetch_sub(&g->left, 1);
    PyList_SetItem(results, index, take_exception()); /* this request's error, in its place */
  }
  *held = kept;
}

/* With the GIL: move the completed calls of the window into results. */
static Py_ssize_t collect_done(Call** window, Py_ssize_t n, PyObject* results)
{
  for (Py_ssize_t i = 0; i < n;) {
    Call* c = window[i];
    if (atomic_load(&c->done) != WAIT_DONE) {
      i++;
      continue;
    }
    PyObject* result = call_collect(c);
    PyList_SetItem(results, c->group_index, result != NULL ? result : take_exception());
    call_free(c);
    window[i] = window[--n];
  }
  return n;
}

/* Without the GIL: whether at most `target` calls of the group are not done, waiting up
 * to timeout_ns (0: for ever) for it. */
static int group_reached(Group* g, int target, uint64_t timeout_ns)
{
  atomic_store(&g->wake_at, target);
  atomic_store(&g->state, WAIT_PENDING); /* (a completion after this signals it) */
  return atomic_load(&g->left) <= target || wait_for(&g->state, 0, timeout_ns);
}

/* With the GIL: wait until at most `target` calls of the group are not done, deleting
 * up to `graves` graves meanwhile. Returns -1 with KeyboardInterrupt (or another signal
 * handler's error) set. */
static int wait_group(Group* g, int target, long graves)
{
  int main = on_main_thread();
  while (atomic_load(&g->left) > target) {
    int done;
    Py_BEGIN_ALLOW_THREADS
    delete_buried(graves); /* as many as the calls since the last wait buried */
    done = group_reached(g, target, main ? SIGNAL_CHECK_NS : 0);
    Py_END_ALLOW_THREADS
    if (!done && PyErr_CheckSignals() < 0) return -1;
  }
  return 0;
}

/* Before the group's stack frame goes: no completion is still touching it. */
static void leave(Group* g)
{
  while (atomic_load(&g->busy) > 0) cpu_relax();
}

/* Ctrl-C: cancel what is still in flight and wait for Triton to let go of it. */
static void abandon(Group* g, Call** window, Py_ssize_t n)
{
  for (Py_ssize_t i = 0; i < n; i++)
    if (call_claim(window[i])) { /* not completed: it never will be by Triton's callback */
      atomic_fetch_sub(&g->left, 1);
      call_cancel(window[i]);
    }
  Py_BEGIN_ALLOW_THREADS
  while (!group_reached(g, 0, SIGNAL_CHECK_NS)) {
  }
  Py_END_ALLOW_THREADS
  for (Py_ssize_t i = 0; i < n; i++) call_free(window[i]);
}

/* submit_many(server, model, version, request, inputs, parameters, sinks, window, release_gil)
 * -> a list: each request's outputs dict, or its exception. request: an InferRequest whose
 * options all the requests share, read as submit() reads it (request_spec_read; its inputs
 * are not sent); inputs: a list of inputs dicts, one per request. parameters and sinks (per
 * request, from tracing) may be None, and so may an entry of parameters (the shared
 * parameters then) or of sinks. */
PyObject* py_submit_many(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "submit_many() takes 9 arguments");
    return NULL;
  }
  RequestSpec shared;
  if (target_args(args, &shared) < 0) return NULL;
  PyObject *inputs = args[4], *parameters_list = args[5], *sinks = args[6];
  long size = PyLong_AsLong(args[7]);
  int release_gil = PyObject_IsTrue(args[8]) == 1;
  if (PyErr_Occurred()) return NULL;
  if (t_model_thread ||
      (t_in_execute && t_model_name != NULL && strcmp(shared.model, t_model_name) == 0))
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                        "infer_many() from a callable would block the instance that runs it: "
                        "await model.infer_async(...) for each request instead");
  if (!PyList_Check(inputs) ||
      (parameters_list != Py_None &&
       (!PyList_Check(parameters_list) ||
        PyList_GET_SIZE(parameters_list) != PyList_GET_SIZE(inputs))) ||
      (sinks != Py_None &&
       (!PyList_Check(sinks) || PyList_GET_SIZE(sinks) != PyList_GET_SIZE(inputs))) ||
      size < 1 || size > 65536) {
    PyErr_SetString(PyExc_TypeError, "submit_many(): bad arguments");
    return NULL;
  }
  if (request_spec_read(args[3], &shared) < 0) return NULL;
  Py_ssize_t n = PyList_GET_SIZE(inputs);
  PyObject* results = PyList_New(n);
  Call** window = calloc((size_t)size, sizeof(Call*));
  if (results == NULL || window == NULL) {
    Py_XDECREF(results);
    free(window);
    request_spec_clear(&shared);
    return PyErr_NoMemory();
  }
  for (Py_ssize_t i = 0; i < n; i++) PyList_SET_ITEM(results, i, Py_NewRef(Py_None));
  Group g;
  atomic_init(&g.left, 0);
  atomic_init(&g.wake_at, 0);
  atomic_init(&g.state, WAIT_PENDING);
  atomic_init(&g.busy, 0);
  Py_ssize_t held = 0; /* calls in the window: in flight or done, not collected */
  Py_ssize_t from = 0; /* window[from..held): added since the last hand_over_window */
  for (Py_ssize_t i = 0; i < n; i++) {
    if (held == size) {
      hand_over_window(shared.server, &g, window, from, &held, results);
      from = held;
    }
    if (held == size) {
      if (wait_group(&g, (int)(size / 2), 2 * size) < 0) goto interrupted;
      held = from = collect_done(window, held, results);
    }
    PyObject* item = PyList_GET_ITEM(inputs, i);
    if (!PyDict_Check(item)) {
      raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                   "inputs must be a mapping of input name -> array");
    } else {
      RequestSpec one = shared; /* (borrows its references) */
      one.inputs = item;
      if (parameters_list != Py_None && PyList_GET_ITEM(parameters_list, i) != Py_None)
        one.parameters = PyList_GET_ITEM(parameters_list, i);
      if (sinks != Py_None) one.trace_sink = PyList_GET_ITEM(sinks, i);
      Call* c = NULL;
      PyObject* r = NULL;
      atomic_fetch_add(&g.left, 1); /* before Triton may complete it */
      if (lock_open_server(shared.server) == 0)
        r = submit_locked(&one, &(Submission){Py_None, Py_None, 0, release_gil, 0, &g}, &c);
      if (r != NULL) {
        Py_DECREF(r);
        c->group_index = i;
        window[held++] = c;
        continue;
      }
      atomic_fetch_sub(&g.left, 1);
    }
    PyList_SetItem(results, i, take_exception()); /* this request's error, in its place */
  }
  hand_over_window(shared.server, &g, window, from, &held, results);
  while (held > 0) {
    if (wait_group(&g, 0, 2 * size) < 0) goto interrupted;
    held = collect_done(window, held, results);
  }
  leave(&g);
  free(window);
  request_spec_clear(&shared);
  return results;

interrupted:
  abandon(&g, window, held);
  leave(&g);
  free(window);
  request_spec_clear(&shared);
  Py_DECREF(results);
  return NULL;
}
