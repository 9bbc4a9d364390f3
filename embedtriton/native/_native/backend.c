/* The Triton backend (model side): a model's state from its Python binding
 * (TRITONBACKEND_ModelInitialize/Finalize) and the execution of each batch
 * Triton schedules (TRITONBACKEND_ModelInstanceExecute). */
#include "native.h"

/* ---- backend (model side) ---------------------------------------------- */

static void model_state_free(ModelState* ms)
{
  for (Py_ssize_t i = 0; ms->outputs && i < ms->n_outputs; i++) {
    free(ms->outputs[i].name);
    Py_XDECREF(ms->outputs[i].name_obj);
  }
  free(ms->outputs);
  free(ms->name);
  Py_XDECREF(ms->execute);
  Py_XDECREF(ms->include);
  Py_XDECREF(ms->iterate);
  Py_XDECREF(ms->binding);
  free(ms);
}

/* With the GIL: read the binding's output specs into the model state. */
static int read_output_specs(ModelState* ms)
{
  PyObject* specs = PyObject_GetAttr(ms->binding, s_output_specs);
  PyObject* seq = specs ? PySequence_Fast(specs, "output_specs must be a sequence") : NULL;
  Py_XDECREF(specs);
  if (seq == NULL) return -1;
  ms->n_outputs = PySequence_Fast_GET_SIZE(seq);
  ms->outputs = calloc((size_t)ms->n_outputs + 1, sizeof(OutputSpec));
  for (Py_ssize_t i = 0; i < ms->n_outputs; i++) {
    OutputSpec* o = &ms->outputs[i];
    PyObject* name;
    PyObject* dims;
    int dtype;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UiO", &name, &dtype, &dims)) goto fail;
    o->name = strdup(PyUnicode_AsUTF8(name));
    o->name_obj = Py_NewRef(name);
    o->dtype = (TRITONSERVER_DataType)dtype;
    o->ndims = (int)PyTuple_Size(dims);
    if (o->ndims < 0 || o->ndims + (ms->max_batch_size > 0) > MAX_DIMS) {
      PyErr_Format(PyExc_ValueError, "output '%U' has too many dimensions (at most %d)", name,
                   MAX_DIMS);
      goto fail;
    }
    for (int d = 0; d < o->ndims; d++) o->dims[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(dims, d));
  }
  Py_DECREF(seq);
  return PyErr_Occurred() ? -1 : 0;
fail:
  Py_DECREF(seq);
  return -1;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model)
{
  const char* location = NULL;
  int artifact_type = 0;
  TRITONSERVER_Error* err = api.TRITONBACKEND_ModelRepository(model, &artifact_type, &location);
  if (err != NULL) return err;
  int entered = gil_enter();
  PyObject* binding = g_bindings ? PyDict_GetItemString(g_bindings, location) : NULL;
  if (binding == NULL) {
    gil_leave(entered);
    return new_error(TRITONSERVER_ERROR_NOT_FOUND,
                     "no Python callable is bound for the model at '%s'", location);
  }
  ModelState* ms = calloc(1, sizeof(ModelState));
  ms->binding = Py_NewRef(binding);
  ms->execute = PyObject_GetAttr(binding, s_execute);
  PyObject* mbs = PyObject_GetAttr(binding, s_max_batch_size);
  PyObject* name = PyObject_GetAttr(binding, s_name);
  ms->max_batch_size = mbs ? PyLong_AsLongLong(mbs) : 0;
  PyObject* decoupled = PyObject_GetAttrString(binding, "decoupled");
  ms->decoupled = decoupled != NULL && PyObject_IsTrue(decoupled) == 1;
  Py_XDECREF(decoupled);
  PyObject* iterative = PyObject_GetAttrString(binding, "iterative");
  if (iterative != NULL && PyObject_IsTrue(iterative) == 1)
    ms->iterate = PyObject_GetAttrString(binding, "_iterate");
  Py_XDECREF(iterative);
  PyErr_Clear();
  PyObject* rule = PyObject_GetAttrString(binding, "batch_rule");
  if (rule != NULL && rule != Py_None) ms->include = PyObject_GetAttrString(binding, "_include");
  Py_XDECREF(rule);
  PyErr_Clear();
  PyObject* sequence = PyObject_GetAttrString(binding, "sequence");
  ms->sequence = sequence != NULL && PyObject_IsTrue(sequence) == 1;
  Py_XDECREF(sequence);
  PyObject* warmups = PyObject_GetAttrString(binding, "warmup_runs");
  atomic_init(&ms->warmup_left, warmups ? (int)PyLong_AsLong(warmups) : 0);
  atomic_init(&ms->warmup_failed, 0);
  Py_XDECREF(warmups);
  PyErr_Clear();
  ms->name = strdup(name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : "?");
  Py_XDECREF(mbs);
  Py_XDECREF(name);
  if (ms->execute == NULL || PyErr_Occurred() || read_output_specs(ms) < 0) {
    err = error_from_python("cannot read the model binding");
    model_state_free(ms);
    gil_leave(entered);
    return err;
  }
  PyObject* r = PyObject_CallMethod(binding, "_loaded", "i", 1); /* see Binding._loaded */
  if (r == NULL) PyErr_WriteUnraisable(binding);
  Py_XDECREF(r);
  gil_leave(entered);
  return api.TRITONBACKEND_ModelSetState(model, ms);
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model)
{
  void* state = NULL;
  api.TRITONBACKEND_ModelState(model, &state);
  if (state != NULL) {
    int entered = gil_enter();
    PyObject* r = PyObject_CallMethod(((ModelState*)state)->binding, "_loaded", "i", -1);
    if (r == NULL) PyErr_WriteUnraisable(NULL);
    Py_XDECREF(r);
    model_state_free((ModelState*)state);
    gil_leave(entered);
  }
  return NULL;
}

static TRITONSERVER_Error* execute_batch(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                                         TRITONBACKEND_Request** requests, const uint32_t count,
                                         uint64_t exec_start);

static TRITONSERVER_Error* execute_requests(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                                            TRITONBACKEND_Request** requests, const uint32_t count);

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                              TRITONBACKEND_Request** requests,
                                                              const uint32_t count)
{
  TRITONBACKEND_Model* model;
  void* state = NULL;
  TRITONSERVER_Error* err = api.TRITONBACKEND_ModelInstanceModel(instance, &model);
  if (err == NULL) err = api.TRITONBACKEND_ModelState(model, &state);
  if (err != NULL) return err;
  ModelState* ms = (ModelState*)state;
  if (atomic_load(&ms->warmup_left) > 0) { /* one of Triton's warm-up runs, while binding.warming */
    int entered = gil_enter();
    PyObject* warming = PyObject_GetAttrString(ms->binding, "warming");
    int still = warming != NULL && PyObject_IsTrue(warming) == 1;
    Py_XDECREF(warming);
    PyErr_Clear();
    gil_leave(entered);
    if (still && atomic_fetch_sub(&ms->warmup_left, 1) > 0) {
      t_warmup = ms;
      TRITONSERVER_Error* result = execute_requests(ms, instance, requests, count);
      t_warmup = NULL;
      return result;
    }
    atomic_store(&ms->warmup_left, 0);
  }
  return execute_requests(ms, instance, requests, count);
}

/* Run a batch Triton scheduled: the iterative path, or the live requests through the callable. */
static TRITONSERVER_Error* execute_requests(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                                            TRITONBACKEND_Request** requests, const uint32_t count)
{
  uint64_t exec_start = now_ns();
  if (ms->iterate != NULL) {
    t_in_execute = 1;
    run_iterative(ms, instance, requests, count, exec_start);
    t_in_execute = 0;
    flush_wakes();
    return NULL;
  }

  /* Requests whose caller went away while they waited (a gRPC client that
   * disconnected, a Ctrl-C) are answered CANCELLED without running the callable.
   * (Sequence requests always run: the callable keeps each sequence's state.) */
  TRITONBACKEND_Request* live_inline[64];
  TRITONBACKEND_Request** live = count <= 64 ? live_inline : malloc(count * sizeof(*live));
  if (live == NULL) return new_error(TRITONSERVER_ERROR_UNAVAILABLE, "out of memory");
  uint32_t n_live = 0;
  for (uint32_t i = 0; i < count; i++) {
    bool cancelled = false;
    TRITONSERVER_Error* e =
        ms->sequence ? NULL : api.TRITONBACKEND_RequestIsCancelled(requests[i], &cancelled);
    if (e != NULL) api.TRITONSERVER_ErrorDelete(e), cancelled = false;
    if (!cancelled) {
      live[n_live++] = requests[i];
      continue;
    }
    TRITONBACKEND_Response* response = NULL;
    TRITONSERVER_Error* why =
        new_error(TRITONSERVER_ERROR_CANCELLED,
                  "the request was cancelled before model '%s' ran it", ms->name);
    if (api.TRITONBACKEND_ResponseNew(&response, requests[i]) == NULL) send_final(response, why);
    api.TRITONBACKEND_ModelInstanceReportStatistics(instance, requests[i], false, exec_start,
                                                    exec_start, exec_start, now_ns());
    api.TRITONSERVER_ErrorDelete(why);
    api.TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  if (n_live == 0) {
    if (live != live_inline) free(live);
    flush_wakes();
    return NULL;
  }
  TRITONSERVER_Error* status = execute_batch(ms, instance, live, n_live, exec_start);
  if (live != live_inline) free(live);
  return status;
}

/* Run one batch of live requests through the callable and answer each. */
static TRITONSERVER_Error* execute_batch(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                                         TRITONBACKEND_Request** requests, const uint32_t count,
                                         uint64_t exec_start)
{
  TRITONSERVER_Error** errors = calloc(count, sizeof(TRITONSERVER_Error*));
  uint64_t* sizes = calloc(count, sizeof(uint64_t));
  PyObject** views = NULL;
  Py_ssize_t n_views = 0;
  uint64_t batch_size = 0, compute_start = 0, compute_end = 0;

  if (t_wake_cap < count) {
    atomic_int** grown = realloc(t_wake, count * sizeof(atomic_int*));
    if (grown != NULL) t_wake = grown, t_wake_cap = count;
  }
  t_in_execute = 1;
  int entered = gil_enter();
  PyObject* list = PyList_New(count);
  if (list == NULL) {
    PyErr_Clear();
    gil_leave(entered);
    t_in_execute = 0;
    free(errors);
    free(sizes);
    return new_error(TRITONSERVER_ERROR_UNAVAILABLE, "out of memory");
  }
  size_t view_cap = 0;
  for (uint32_t i = 0; i < count; i++) {
    uint32_t n_inputs = 0;
    api.TRITONBACKEND_RequestInputCount(requests[i], &n_inputs);
    view_cap += n_inputs;
  }
  views = calloc(view_cap + 1, sizeof(PyObject*));
  TRITONSERVER_Error* batch_err = NULL;
  for (uint32_t i = 0; i < count && batch_err == NULL; i++) {
    PyObject* req = build_request(requests[i], ms, views, &n_views, &sizes[i], &batch_err);
    if (req != NULL) PyList_SET_ITEM(list, i, req);
    batch_size += sizes[i];
  }
  PyObject* result = NULL;
  if (batch_err == NULL) {
    compute_start = now_ns();
    result = PyObject_CallOneArg(ms->execute, list);
    compute_end = now_ns();
    if (result == NULL) batch_err = error_from_python("model binding failed");
    else if (PyUnicode_Check(result)) /* the callable raised: its message */
      batch_err = new_error(TRITONSERVER_ERROR_INTERNAL, "%s", PyUnicode_AsUTF8(result));
    else if (ms->decoupled) {
      run_decoupled(ms, requests, count, result, sizes, errors);
      compute_end = now_ns();
    } else if (!PyList_Check(result) || PyList_GET_SIZE(result) != (Py_ssize_t)count)
      batch_err = new_error(TRITONSERVER_ERROR_INTERNAL,
                            "model '%s' must return a list with one dict per request (%u)",
                            ms->name, count);
  }
  if (compute_start == 0) compute_start = compute_end = now_ns();
  /* Build every response (outputs copied into Triton's buffers) ... */
  TRITONBACKEND_Response** responses = calloc(count, sizeof(TRITONBACKEND_Response*));
  for (uint32_t i = 0; i < count; i++) {
    if (batch_err != NULL) {
      if (api.TRITONBACKEND_ResponseNew(&responses[i], requests[i]) != NULL) responses[i] = NULL;
      errors[i] = api.TRITONSERVER_ErrorNew(api.TRITONSERVER_ErrorCode(batch_err),
                                            api.TRITONSERVER_ErrorMessage(batch_err));
    } else if (!ms->decoupled) { /* decoupled: all sent already */
      responses[i] = respond(ms, requests[i], PyList_GET_ITEM(result, i), sizes[i], i, &errors[i]);
    }
  }
  Py_XDECREF(result);
  Py_DECREF(list);
  /* ... detach the input views the callable kept (they still point at the
   * callers' memory) ... */
  for (Py_ssize_t v = 0; v < n_views; v++) {
    detach_view((PyArrayObject*)views[v]);
    Py_DECREF(views[v]);
  }
  free(views);
  if (batch_err != NULL) api.TRITONSERVER_ErrorDelete(batch_err);
  /* ... and only then send: a response lets its caller go on and reuse its
   * inputs. Still holding the GIL: async completions are collected and handed
   * to their event loops in one go, sync callers woken once the GIL is free. */
  t_deferred = PyDict_New();
  /* With a batch rule, Triton's batcher thread takes the GIL while it holds its
   * queue lock: never wait on Triton holding the GIL then. */
  PyThreadState* saved = NULL;
  if (ms->include != NULL) {
    saved = PyEval_SaveThread();
    t_gil_depth = 0;
  }
  for (uint32_t i = 0; i < count; i++)
    if (responses[i] != NULL) send_final(responses[i], errors[i]);
  free(responses);

  uint64_t exec_end = now_ns();
  for (uint32_t i = 0; i < count; i++) {
    api.TRITONBACKEND_ModelInstanceReportStatistics(
        instance, requests[i], errors[i] == NULL, exec_start, compute_start, compute_end, exec_end);
    if (errors[i] != NULL) api.TRITONSERVER_ErrorDelete(errors[i]);
    api.TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  if (batch_size == 0) batch_size = count;
  api.TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, batch_size, exec_start,
                                                       compute_start, compute_end, exec_end);
  if (saved != NULL) {
    PyEval_RestoreThread(saved);
    t_gil_depth = 1;
  }
  flush_deferred();
  gil_leave(entered);
  t_in_execute = 0;
  flush_wakes();
  free(errors);
  free(sizes);
  return NULL;
}
