/* The model modes beyond one response per request: custom batching rules
 * (Triton's batch strategy entry points), decoupled models (several responses
 * per request) and iterative sequences (continuous batching). */
#include "modes.h"

#include "batch_io.h"
#include "complete.h"
#include "streams.h"
#include "threads.h"

/* ---- custom batching rules ------------------------------------------------
 * Triton loads this same library as the model's batch strategy
 * (TRITON_BATCH_STRATEGY_PATH) and asks, on its batcher thread, whether each
 * pending request may join the batch being formed. The binding's rule answers
 * from the candidate's parameters and the requests already accepted. */
typedef struct {
  ModelState* ms;
  PyObject* batch; /* list of accepted candidates */
} BatchRecord;

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatcherInitialize(TRITONBACKEND_Batcher** batcher,
                                                                TRITONBACKEND_Model* model)
{
  void* state = NULL;
  TRITONSERVER_Error* err = api.TRITONBACKEND_ModelState(model, &state);
  *batcher = (TRITONBACKEND_Batcher*)state;
  return err;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatcherFinalize(TRITONBACKEND_Batcher* batcher)
{
  (void)batcher;
  return NULL;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatchInitialize(const TRITONBACKEND_Batcher* batcher,
                                                              void** userp)
{
  BatchRecord* record = calloc(1, sizeof(BatchRecord));
  record->ms = (ModelState*)batcher;
  int entered = gil_enter();
  record->batch = PyList_New(0);
  gil_leave(entered);
  *userp = record;
  return NULL;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatchFinalize(void* userp)
{
  BatchRecord* record = (BatchRecord*)userp;
  int entered = gil_enter();
  Py_XDECREF(record->batch);
  gil_leave(entered);
  free(record);
  return NULL;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelBatchIncludeRequest(TRITONBACKEND_Request* request,
                                                                  void* userp, bool* should_include)
{
  BatchRecord* record = (BatchRecord*)userp;
  *should_include = true;
  if (record->ms == NULL || record->ms->include == NULL || record->batch == NULL) return NULL;
  TRITONSERVER_Error* err = NULL;
  int entered = gil_enter();
  PyObject* candidate = PyObject_CallNoArgs(g_request_type);
  PyObject* params = candidate ? read_parameters(request, &err) : NULL;
  PyObject* answer = NULL;
  if (params != NULL && PyObject_SetAttr(candidate, s_parameters, params) == 0)
    answer = PyObject_CallFunctionObjArgs(record->ms->include, record->batch, candidate, NULL);
  if (answer != NULL) {
    *should_include = PyObject_IsTrue(answer) == 1;
  } else if (err == NULL) {
    PyErr_WriteUnraisable(record->ms->include); /* the binding logs rule errors itself */
  }
  PyErr_Clear();
  Py_XDECREF(answer);
  Py_XDECREF(params);
  Py_XDECREF(candidate);
  gil_leave(entered);
  if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
  return NULL;
}

/* ---- decoupled models: several responses per request --------------------
 * The binding returns an iterator of steps; each step is a list with one
 * outputs dict (or None) per request, or a str: the message of an exception.
 * Every dict is sent at once as a response of its own; when the iterator ends
 * each request gets its final flag. Before each step, requests whose caller
 * went away (cancelled) are closed; when all are, the iterator is closed. */
static void factory_finish(TRITONBACKEND_ResponseFactory** f, TRITONSERVER_Error* err)
{
  if (*f == NULL) return;
  if (err != NULL) {
    TRITONBACKEND_Response* response = NULL;
    if (api.TRITONBACKEND_ResponseNewFromFactory(&response, *f) == NULL) send_final(response, err);
  } else {
    TRITONSERVER_Error* e =
        api.TRITONBACKEND_ResponseFactorySendFlags(*f, TRITONSERVER_RESPONSE_COMPLETE_FINAL);
    if (e) api.TRITONSERVER_ErrorDelete(e);
  }
  api.TRITONBACKEND_ResponseFactoryDelete(*f);
  *f = NULL;
}

static TRITONSERVER_Error* copy_error(TRITONSERVER_Error* err)
{
  return api.TRITONSERVER_ErrorNew(api.TRITONSERVER_ErrorCode(err),
                                   api.TRITONSERVER_ErrorMessage(err));
}

void run_decoupled(ModelState* ms, TRITONBACKEND_Request** requests, uint32_t count,
                   PyObject* steps, uint64_t* sizes, TRITONSERVER_Error** errors)
{
  TRITONBACKEND_ResponseFactory** factories = calloc(count, sizeof(TRITONBACKEND_ResponseFactory*));
  uint32_t open = 0;
  for (uint32_t i = 0; i < count; i++) {
    errors[i] = api.TRITONBACKEND_ResponseFactoryNew(&factories[i], requests[i]);
    if (errors[i] == NULL) {
      open++;
    } else { /* answer it the plain way */
      TRITONBACKEND_Response* response = NULL;
      factories[i] = NULL;
      if (api.TRITONBACKEND_ResponseNew(&response, requests[i]) == NULL)
        send_final(response, errors[i]);
    }
  }
  TRITONSERVER_Error* fail = NULL;
  t_hold_back = 1; /* a consumer that is behind holds the generators back (streams.h) */
  while (open > 0 && fail == NULL) {
    for (uint32_t i = 0; i < count; i++) {
      bool cancelled = false;
      if (factories[i] &&
          api.TRITONBACKEND_ResponseFactoryIsCancelled(factories[i], &cancelled) == NULL &&
          cancelled) {
        factory_finish(&factories[i], NULL);
        errors[i] = new_error(TRITONSERVER_ERROR_CANCELLED, "the caller cancelled the request");
        open--;
      }
    }
    if (open == 0) break;
    PyObject* step = PyIter_Next(steps);
    if (step == NULL) {
      if (PyErr_Occurred()) fail = error_from_python("model binding failed");
      break;
    }
    if (PyUnicode_Check(step)) {
      fail = new_error(TRITONSERVER_ERROR_INTERNAL, "%s", PyUnicode_AsUTF8(step));
    } else if (!PyList_Check(step) || PyList_GET_SIZE(step) != (Py_ssize_t)count) {
      fail = new_error(TRITONSERVER_ERROR_INTERNAL,
                       "model '%s' must yield a list with one dict (or None) per request (%u)",
                       ms->name, count);
    } else {
      for (uint32_t i = 0; i < count; i++) {
        PyObject* out = PyList_GET_ITEM(step, i);
        if (out == Py_None || factories[i] == NULL) continue;
        TRITONBACKEND_Response* response = NULL;
        TRITONSERVER_Error* err = api.TRITONBACKEND_ResponseNewFromFactory(&response, factories[i]);
        if (err == NULL) err = fill_response(ms, requests[i], response, out, sizes[i], i);
        if (err != NULL) { /* this request fails; the others go on */
          if (response) send_final(response, err);
          api.TRITONBACKEND_ResponseFactoryDelete(factories[i]);
          factories[i] = NULL;
          errors[i] = err;
          open--;
          continue;
        }
        TRITONSERVER_Error* send_err = api.TRITONBACKEND_ResponseSend(response, 0, NULL);
        if (send_err) {
          api.TRITONSERVER_ErrorDelete(send_err);
          api.TRITONBACKEND_ResponseDelete(response);
        }
      }
    }
    Py_DECREF(step);
  }
  t_hold_back = 0;
  PyObject* r = PyObject_CallMethod(steps, "close", NULL); /* a no-op once exhausted */
  if (r == NULL) PyErr_Clear();
  Py_XDECREF(r);
  for (uint32_t i = 0; i < count; i++) {
    if (factories[i] != NULL && fail != NULL && errors[i] == NULL) errors[i] = copy_error(fail);
    factory_finish(&factories[i], factories[i] ? (fail ? errors[i] : NULL) : NULL);
  }
  if (fail != NULL) api.TRITONSERVER_ErrorDelete(fail);
  free(factories);
}

/* ---- iterative sequences (continuous batching) -----------------------------
 * Each in-flight request has a generator in the binding; every execute
 * advances the generators of the requests Triton scheduled together by one
 * step and streams each yield to its caller. A request whose generator is
 * not done is released with RESCHEDULE: Triton puts it back, and new
 * requests join the next iteration instead of waiting for the batch. */
/* Whether a sequence request is real: the sequence batcher pads batches with
 * copies of real requests whose READY control input is 0. */
static int request_ready(TRITONBACKEND_Request* request)
{
  TRITONBACKEND_Input* input = NULL;
  const void* data = NULL;
  uint64_t size = 0;
  TRITONSERVER_MemoryType mtype = TRITONSERVER_MEMORY_CPU;
  int64_t mtype_id = 0;
  TRITONSERVER_Error* err = api.TRITONBACKEND_RequestInput(request, CONTROL_PREFIX "ready", &input);
  if (err == NULL) err = api.TRITONBACKEND_InputBuffer(input, 0, &data, &size, &mtype, &mtype_id);
  if (err != NULL) {
    api.TRITONSERVER_ErrorDelete(err);
    return 1;
  }
  return size < 4 || *(const int32_t*)data != 0;
}

/* One request's item of an iteration's step: (key, Request) on its first iteration (its inputs,
 * copied: they are kept across iterations), (key, None) on the others, (None, None) for padding
 * (nobody waits for it). */
static PyObject* step_item(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                           TRITONBACKEND_Request* request, uint64_t* size,
                           TRITONSERVER_Error** error)
{
  if (!request_ready(request)) return Py_BuildValue("(OO)", Py_None, Py_None);
  PyObject* key = PyLong_FromVoidPtr(request);
  PyObject* req = Py_NewRef(Py_None);
  PyObject* views[MAX_DIMS * 4];
  Py_ssize_t n_views = 0;
  uint32_t n_inputs = 0;
  api.TRITONBACKEND_RequestInputCount(request, &n_inputs);
  PyObject* known = PyObject_CallMethod(ms->binding, "_knows", "O", key);
  if (known == Py_False && n_inputs <= MAX_DIMS * 4) { /* first iteration: hand over its inputs */
    Py_DECREF(req);
    int32_t device = 0;
    TRITONSERVER_Error* no_id = api.TRITONBACKEND_ModelInstanceDeviceId(instance, &device);
    if (no_id != NULL) api.TRITONSERVER_ErrorDelete(no_id), device = 0;
    req = build_request(request, ms, device, views, &n_views, size, error);
    for (Py_ssize_t v = 0; v < n_views; v++) { /* kept across iterations: own copies */
      detach_view((PyArrayObject*)views[v]);
      Py_DECREF(views[v]);
    }
    if (req == NULL) req = Py_NewRef(Py_None);
  }
  Py_XDECREF(known);
  PyErr_Clear();
  return Py_BuildValue("(NN)", key, req);
}

/* The binding lets go of an iterative request (its generator or state): it is done here. */
static void forget(ModelState* ms, TRITONBACKEND_Request* request)
{
  PyObject* r = PyObject_CallMethod(ms->binding, "_forget", "N", PyLong_FromVoidPtr(request));
  Py_XDECREF(r);
  PyErr_Clear();
}

/* One request's answer to an iteration, through a response factory: its error, its outputs (out,
 * a dict; None: no response this time) or, done, the end of its stream. A request whose stream
 * was closed or that was cancelled is forgotten and done; so is one whose response failed (*errp:
 * that error). Returns whether it is done. */
static int answer_step(ModelState* ms, TRITONBACKEND_Request* request, PyObject* out, int done,
                       TRITONSERVER_Error** errp, uint64_t batch_size, size_t index)
{
  TRITONSERVER_Error* err = *errp;
  TRITONBACKEND_ResponseFactory* factory = NULL;
  if (api.TRITONBACKEND_ResponseFactoryNew(&factory, request) != NULL) return done;
  bool cancelled = false;
  if (!done && (take_stream_closed(request) ||
                (api.TRITONBACKEND_RequestIsCancelled(request, &cancelled) == NULL && cancelled))) {
    forget(ms, request);
    done = 1;
  }
  if (err != NULL) {
    factory_finish(&factory, err);
  } else if (out != Py_None) {
    TRITONBACKEND_Response* response = NULL;
    err = api.TRITONBACKEND_ResponseNewFromFactory(&response, factory);
    if (err == NULL) err = fill_response(ms, request, response, out, batch_size, index);
    if (err != NULL) {
      if (response) send_final(response, err);
      forget(ms, request);
      done = 1;
    } else {
      TRITONSERVER_Error* send_err = api.TRITONBACKEND_ResponseSend(
          response, done ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0, NULL);
      if (send_err)
        api.TRITONSERVER_ErrorDelete(send_err), api.TRITONBACKEND_ResponseDelete(response);
    }
    api.TRITONBACKEND_ResponseFactoryDelete(factory);
    factory = NULL;
  } else if (done) {
    factory_finish(&factory, NULL);
  }
  if (factory != NULL) api.TRITONBACKEND_ResponseFactoryDelete(factory);
  *errp = err;
  return done;
}

/* Put a request that is not done back for the next iteration. Triton refuses when its sequence
 * batcher ended the sequence meanwhile: an iteration counts against max_sequence_idle_microseconds
 * (the request is in no queue while it runs), so a slow one gets its sequences' slots taken away.
 * Triton leaves the request with us then: end it with an error that says what to change rather
 * than leave its caller waiting forever. */
static void reschedule(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                       TRITONBACKEND_Request* request, uint64_t exec_start, uint64_t compute_start,
                       uint64_t compute_end)
{
  TRITONSERVER_Error* refused = api.TRITONBACKEND_RequestRelease(request, RELEASE_RESCHEDULE);
  if (refused == NULL) return;
  forget(ms, request);
  TRITONBACKEND_ResponseFactory* factory = NULL;
  if (api.TRITONBACKEND_ResponseFactoryNew(&factory, request) == NULL) {
    TRITONSERVER_Error* err = new_error(
        TRITONSERVER_ERROR_UNAVAILABLE,
        "Triton's sequence batcher ended this sequence while an iteration ran: an iteration "
        "counts against SequenceBatcher.max_sequence_idle_microseconds; give the model a limit "
        "longer than an iteration can take (Triton: %s)",
        api.TRITONSERVER_ErrorMessage(refused));
    factory_finish(&factory, err);
    api.TRITONSERVER_ErrorDelete(err);
  }
  api.TRITONSERVER_ErrorDelete(refused);
  api.TRITONBACKEND_ModelInstanceReportStatistics(instance, request, false, exec_start,
                                                  compute_start, compute_end, now_ns());
  api.TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL);
}

void run_iterative(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                   TRITONBACKEND_Request** requests, uint32_t count, uint64_t exec_start)
{
  int entered = gil_enter();
  t_deferred = PyDict_New();
  PyObject* step = PyList_New(count); /* (key, Request or None) per request */
  uint64_t* sizes = calloc(count, sizeof(uint64_t));
  TRITONSERVER_Error** errors = calloc(count, sizeof(TRITONSERVER_Error*));
  for (uint32_t i = 0; i < count && step; i++)
    PyList_SET_ITEM(step, i, step_item(ms, instance, requests[i], &sizes[i], &errors[i]));
  uint64_t compute_start = now_ns();
  /* result: per request (outputs dict | None | error str, done) */
  PyObject* result = step ? PyObject_CallOneArg(ms->iterate, step) : NULL;
  uint64_t compute_end = now_ns();
  if (result == NULL || !PyList_Check(result) || PyList_GET_SIZE(result) != (Py_ssize_t)count) {
    TRITONSERVER_Error* e = error_from_python("model binding failed");
    for (uint32_t i = 0; i < count; i++)
      if (errors[i] == NULL) errors[i] = copy_error(e);
    api.TRITONSERVER_ErrorDelete(e);
  }
  for (uint32_t i = 0; i < count; i++) {
    PyObject* out = Py_None;
    int done = 1;
    TRITONSERVER_Error* err = errors[i];
    if (step && PyTuple_GET_ITEM(PyList_GET_ITEM(step, i), 0) == Py_None) { /* padding */
      if (err) api.TRITONSERVER_ErrorDelete(err);
      api.TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL);
      continue;
    }
    if (err == NULL) {
      PyObject* item = PyList_GET_ITEM(result, i);
      out = PyTuple_GET_ITEM(item, 0);
      done = PyObject_IsTrue(PyTuple_GET_ITEM(item, 1)) == 1;
      if (PyUnicode_Check(out))
        err = new_error(TRITONSERVER_ERROR_INTERNAL, "%s", PyUnicode_AsUTF8(out));
    }
    done = answer_step(ms, requests[i], out, done, &err, sizes[i] ? sizes[i] : 1, i);
    if (done) {
      api.TRITONBACKEND_ModelInstanceReportStatistics(
          instance, requests[i], err == NULL, exec_start, compute_start, compute_end, now_ns());
      api.TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL);
    } else {
      reschedule(ms, instance, requests[i], exec_start, compute_start, compute_end);
    }
    if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
  }
  api.TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, exec_start, compute_start,
                                                       compute_end, now_ns());
  Py_XDECREF(result);
  Py_XDECREF(step);
  free(sizes);
  free(errors);
  flush_deferred();
  gil_leave(entered);
}
