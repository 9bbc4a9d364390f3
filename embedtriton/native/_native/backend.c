/* The Triton backend (model side): a model's state from its Python binding
 * (TRITONBACKEND_ModelInitialize/Finalize) and the execution of each batch
 * Triton schedules (TRITONBACKEND_ModelInstanceExecute). */
#include "backend.h"

#include "batch_io.h"
#include "complete.h"
#include "device_array.h"
#include "fast_batch.h"
#include "gates.h"
#include "modes.h"
#include "queues.h"
#include "threads.h"

/* ---- backend (model side) ---------------------------------------------- */

static void model_state_free(ModelState* ms)
{
  for (Py_ssize_t i = 0; ms->outputs && i < ms->n_outputs; i++) {
    free(ms->outputs[i].name);
    Py_XDECREF(ms->outputs[i].name_obj);
  }
  free(ms->outputs);
  for (Py_ssize_t i = 0; ms->gpu_inputs && i < ms->n_gpu_inputs; i++) free(ms->gpu_inputs[i]);
  free(ms->gpu_inputs);
  Py_XDECREF(ms->gpu_wrap);
  free(ms->name);
  Py_XDECREF(ms->execute);
  Py_XDECREF(ms->include);
  Py_XDECREF(ms->iterate);
  Py_XDECREF(ms->binding);
  fast_batch_free(ms);
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
    int gpu = 0;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UiO|p", &name, &dtype, &dims, &gpu))
      goto fail;
    o->gpu = gpu;
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

/* With the GIL: what the model does with GPU memory (binding.gpu_wrap, binding.gpu_inputs). */
static int read_gpu_settings(ModelState* ms)
{
  PyObject* wrap = PyObject_GetAttrString(ms->binding, "gpu_wrap");
  PyObject* names = wrap ? PyObject_GetAttrString(ms->binding, "gpu_inputs") : NULL;
  PyObject* seq = names ? PySequence_Fast(names, "gpu_inputs must be a sequence") : NULL;
  Py_XDECREF(names);
  if (seq == NULL) {
    Py_XDECREF(wrap);
    return -1;
  }
  ms->gpu_wrap = wrap == Py_None ? NULL : wrap;
  if (wrap == Py_None) Py_DECREF(wrap);
  ms->n_gpu_inputs = PySequence_Fast_GET_SIZE(seq);
  ms->gpu_inputs = calloc((size_t)ms->n_gpu_inputs + 1, sizeof(char*));
  for (Py_ssize_t i = 0; ms->gpu_inputs && i < ms->n_gpu_inputs; i++) {
    const char* name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
    ms->gpu_inputs[i] = strdup(name ? name : "");
  }
  Py_DECREF(seq);
  return PyErr_Occurred() ? -1 : 0;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model)
{
  const char* location = NULL;
  int artifact_type = 0;
  TRITONSERVER_Error* err = api.TRITONBACKEND_ModelRepository(model, &artifact_type, &location);
  if (err != NULL) return err;
  uint64_t version = 1;
  if ((err = api.TRITONBACKEND_ModelVersion(model, &version)) != NULL) return err;
  char key[4096 + 32]; /* the version's folder: each version is its own binding */
  snprintf(key, sizeof key, "%s/%llu", location, (unsigned long long)version);
  int entered = gil_enter();
  PyObject* binding = g_bindings ? PyDict_GetItemString(g_bindings, key) : NULL;
  if (binding == NULL) {
    gil_leave(entered);
    return new_error(TRITONSERVER_ERROR_NOT_FOUND,
                     "no Python callable is bound for the model at '%s'", key);
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
  PyObject* with_batcher = PyObject_GetAttrString(binding, "with_batcher");
  ms->with_batcher = with_batcher != NULL && PyObject_IsTrue(with_batcher) == 1;
  Py_XDECREF(with_batcher);
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
  if (ms->execute == NULL || PyErr_Occurred() || read_output_specs(ms) < 0 ||
      read_gpu_settings(ms) < 0 || fast_batch_init(ms, binding) < 0) {
    err = error_from_python("cannot read the model binding");
    model_state_free(ms);
    gil_leave(entered);
    return err;
  }
  PyObject* gate = PyObject_GetAttrString(binding, "queue_gate"); /* see Binding.queue_gate */
  if (gate == NULL) PyErr_Clear();
  TRITONSERVER_Server* server = NULL;
  if (gate != NULL && gate != Py_None &&
      (err = api.TRITONBACKEND_ModelServer(model, &server)) == NULL &&
      (ms->gate = gate_new(gate, server, ms->name, (long long)version, ms->include != NULL)) ==
          NULL) {
    Py_DECREF(gate);
    err = error_from_python("cannot read the model's queue policies");
    model_state_free(ms);
    gil_leave(entered);
    return err;
  }
  Py_XDECREF(gate);
  if (err != NULL) {
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
    if (((ModelState*)state)->gate != NULL) gate_close(((ModelState*)state)->gate);
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

static ModelState* instance_model_state(TRITONBACKEND_ModelInstance* instance,
                                        TRITONSERVER_Error** err)
{
  TRITONBACKEND_Model* model;
  void* state = NULL;
  *err = api.TRITONBACKEND_ModelInstanceModel(instance, &model);
  if (*err == NULL) *err = api.TRITONBACKEND_ModelState(model, &state);
  return (ModelState*)state;
}

/* Instances are counted for the model's queue policies (queues.c). */
EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(
    TRITONBACKEND_ModelInstance* instance)
{
  TRITONSERVER_Error* err = NULL;
  ModelState* ms = instance_model_state(instance, &err);
  if (err == NULL && ms != NULL && ms->gate != NULL) gate_instances(ms->gate, 1);
  return err;
}

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(
    TRITONBACKEND_ModelInstance* instance)
{
  TRITONSERVER_Error* err = NULL;
  ModelState* ms = instance_model_state(instance, &err);
  if (err == NULL && ms != NULL && ms->gate != NULL) gate_instances(ms->gate, -1);
  return err;
}

static TRITONSERVER_Error* execute_model(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                                         TRITONBACKEND_Request** requests, const uint32_t count);

EXPORT TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                              TRITONBACKEND_Request** requests,
                                                              const uint32_t count)
{
  TRITONSERVER_Error* err = NULL;
  ModelState* ms = instance_model_state(instance, &err);
  if (err != NULL) return err;
  if (ms->gate == NULL) {
    err = execute_model(ms, instance, requests, count);
  } else {
    /* queue policies: this instance is busy until its callable is done (gate_end, at the latest
     * here; finish_batch ends it before the responses go out) */
    gate_begin(ms->gate, requests, count);
    err = execute_model(ms, instance, requests, count);
    gate_end();
  }
  linger(ms->with_batcher); /* (threads.c) */
  return err;
}

static TRITONSERVER_Error* execute_model(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                                         TRITONBACKEND_Request** requests, const uint32_t count)
{
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

/* A batch between the callable's call and its answers: on the stack for a
 * plain callable; on the heap for an async one, whose coroutine finishes on
 * the library's event loop after execute returned (Triton keeps the requests
 * until they are released, and schedules other batches on the instance
 * meanwhile). */
typedef struct {
  ModelState* ms;
  TRITONBACKEND_ModelInstance* instance;
  TRITONBACKEND_Request** requests;
  uint32_t count;
  uint64_t* sizes; /* (the start of one block that holds errors, responses and views too) */
  TRITONSERVER_Error** errors;
  TRITONBACKEND_Response** responses;
  PyObject** views; /* the input views handed to the callable, detached at the end */
  Py_ssize_t n_views;
  PyObject* list; /* the Request objects */
  uint64_t exec_start, compute_start, batch_size;
  TRITONBACKEND_Request* inline_requests[1];
} Batch;

/* With the GIL: answer every request of a batch from the callable's result
 * (or batch_err), report statistics, release the requests, free the batch's
 * parts (not the Batch itself). */
static void finish_batch(Batch* b, PyObject* result, TRITONSERVER_Error* batch_err,
                         uint64_t compute_end)
{
  ModelState* ms = b->ms;
  uint32_t count = b->count;
  TRITONBACKEND_Request** requests = b->requests;
  TRITONSERVER_Error** errors = b->errors;
  if (batch_err == NULL && result != NULL && !ms->decoupled &&
      (!PyList_Check(result) || PyList_GET_SIZE(result) != (Py_ssize_t)count))
    batch_err =
        new_error(TRITONSERVER_ERROR_INTERNAL,
                  "model '%s' must return a list with one dict per request (%u)", ms->name, count);
  uint64_t compute_start = b->compute_start;
  if (compute_start == 0) compute_start = compute_end = now_ns();
  /* Build every response (outputs copied into Triton's buffers) ... */
  TRITONBACKEND_Response** responses = b->responses;
  for (uint32_t i = 0; i < count; i++) {
    if (batch_err != NULL) {
      if (api.TRITONBACKEND_ResponseNew(&responses[i], requests[i]) != NULL) responses[i] = NULL;
      errors[i] = api.TRITONSERVER_ErrorNew(api.TRITONSERVER_ErrorCode(batch_err),
                                            api.TRITONSERVER_ErrorMessage(batch_err));
    } else if (!ms->decoupled) { /* decoupled: all sent already */
      responses[i] =
          respond(ms, requests[i], PyList_GET_ITEM(result, i), b->sizes[i], i, &errors[i]);
    }
  }
  Py_CLEAR(b->list);
  /* ... detach the input views the callable kept (they still point at the
   * callers' memory) ... */
  for (Py_ssize_t v = 0; v < b->n_views; v++) {
    if (is_hold(b->views[v])) continue;
    detach_view((PyArrayObject*)b->views[v]);
    Py_CLEAR(b->views[v]); /* (the loop below must not read the type of a view freed here) */
  }
  /* ... and let go of the holds on GPU inputs: a request whose GPU input the callable still
   * uses is released when its last view goes (its buffer cannot be copied under a cupy or
   * torch array that points at it) ... */
  TRITONBACKEND_Request** kept = NULL;
  uint32_t n_kept = 0;
  for (Py_ssize_t v = 0; v < b->n_views; v++) {
    if (b->views[v] == NULL || !is_hold(b->views[v])) continue;
    TRITONBACKEND_Request* r = hold_drop(b->views[v]);
    if (r != NULL && kept == NULL) kept = calloc(count, sizeof(*kept));
    if (r != NULL && kept != NULL) kept[n_kept++] = r;
  }
  if (batch_err != NULL) api.TRITONSERVER_ErrorDelete(batch_err);
  /* ... and only then send: a response lets its caller go on and reuse its
   * inputs. Still holding the GIL: async completions are collected and handed
   * to their event loops in one go, sync callers woken once the GIL is free. */
  t_deferred = PyDict_New();
  /* With a batch rule, Triton's batcher thread takes the GIL while it holds its
   * queue lock: never wait on Triton holding the GIL then. */
  PyThreadState* saved = NULL;
  int depth = t_gil_depth;
  if (ms->include != NULL) {
    saved = PyEval_SaveThread();
    t_gil_depth = 0;
  }
  /* Its callable is done: with queue policies, the next requests go to Triton now, to be
   * batched while these responses go out (queues.c). */
  if (gate_current() != NULL && gate_current() == ms->gate) gate_end();
  for (uint32_t i = 0; i < count; i++)
    if (responses[i] != NULL) send_final(responses[i], errors[i]);

  uint64_t exec_end = now_ns();
  for (uint32_t i = 0; i < count; i++) {
    api.TRITONBACKEND_ModelInstanceReportStatistics(b->instance, requests[i], errors[i] == NULL,
                                                    b->exec_start, compute_start, compute_end,
                                                    exec_end);
    if (errors[i] != NULL) api.TRITONSERVER_ErrorDelete(errors[i]);
    int held = 0;
    for (uint32_t k = 0; k < n_kept && !held; k++) held = kept[k] == requests[i];
    if (!held) api.TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL);
  }
  free(kept);
  uint64_t batch_size = b->batch_size ? b->batch_size : count;
  api.TRITONBACKEND_ModelInstanceReportBatchStatistics(b->instance, batch_size, b->exec_start,
                                                       compute_start, compute_end, exec_end);
  if (saved != NULL) {
    PyEval_RestoreThread(saved);
    t_gil_depth = depth;
  }
  flush_deferred();
  free(b->sizes); /* (the block) */
}

static void batch_capsule_free(PyObject* capsule)
{
  Batch* b = PyCapsule_GetPointer(capsule, "embedtriton.batch");
  if (b != NULL &&
      b->list != NULL) { /* never finished (a bug): fail the requests, never leak them */
    finish_batch(b, NULL,
                 new_error(TRITONSERVER_ERROR_INTERNAL, "the async model's result was lost"),
                 now_ns());
  }
  free(b);
}

/* finish_batch(capsule, result): the event loop's end of an async callable's batch. */
PyObject* py_finish_batch(PyObject* self, PyObject* args)
{
  (void)self;
  PyObject *capsule, *result;
  if (!PyArg_ParseTuple(args, "OO", &capsule, &result)) return NULL;
  Batch* b = PyCapsule_GetPointer(capsule, "embedtriton.batch");
  if (b == NULL) return NULL;
  if (b->list == NULL)
    return raise_triton(TRITONSERVER_ERROR_INTERNAL, "the batch is already answered");
  uint64_t compute_end = now_ns();
  TRITONSERVER_Error* batch_err = NULL;
  if (PyUnicode_Check(result)) /* the callable raised: its message */
    batch_err = new_error(TRITONSERVER_ERROR_INTERNAL, "%s", PyUnicode_AsUTF8(result));
  finish_batch(b, result, batch_err, compute_end);
  Py_RETURN_NONE;
}

/* Run one batch of live requests through the callable and answer each. */
/* A plain @batch function called from here (fast_batch.c) when the batch allows it: its result
 * (the batch's rows counted, *batch_err set as the callable's path sets it), or, *declined, the
 * batch goes the general way. */
static PyObject* run_fast(Batch* b, TRITONSERVER_Error** batch_err, int* declined,
                          uint64_t* compute_end)
{
  PyObject* result = fast_batch_run(b->ms, b->requests, b->count, b->views, &b->n_views, b->sizes,
                                    &b->compute_start, batch_err, declined);
  if (!*declined) {
    *compute_end = now_ns();
    for (uint32_t i = 0; i < b->count; i++) b->batch_size += b->sizes[i];
    if (result == NULL && *batch_err == NULL)
      *batch_err = error_from_python("model binding failed");
    else if (result != NULL && PyUnicode_Check(result)) /* the function raised: its message */
      *batch_err = new_error(TRITONSERVER_ERROR_INTERNAL, "%s", PyUnicode_AsUTF8(result));
  }
  return result;
}

/* An async callable: its coroutine (result, whose reference this takes) runs on the library's
 * event loop and finishes the batch there (finish_batch); this instance is free for other
 * batches meanwhile. b is the execute's own (its requests are copied for the loop). */
static void schedule_batch(Batch* b, PyObject* result)
{
  ModelState* ms = b->ms;
  Batch* held = malloc(sizeof(Batch) + b->count * sizeof(TRITONBACKEND_Request*));
  PyObject* capsule = NULL;
  if (held != NULL) {
    *held = *b;
    held->requests = (TRITONBACKEND_Request**)(held + 1);
    memcpy(held->requests, b->requests, b->count * sizeof(TRITONBACKEND_Request*));
    capsule = PyCapsule_New(held, "embedtriton.batch", batch_capsule_free);
  }
  PyObject* r =
      capsule ? PyObject_CallMethod(ms->binding, "schedule", "OO", result, capsule) : NULL;
  Py_DECREF(result);
  if (r != NULL) {
    Py_DECREF(r);
    Py_DECREF(capsule); /* the loop holds it now */
    return;
  }
  /* not scheduled: answer here with the error (held's parts are b's) */
  TRITONSERVER_Error* err = error_from_python("cannot schedule the async model");
  if (capsule != NULL) {
    held->list = NULL; /* finished below, through b */
    Py_DECREF(capsule);
  } else {
    free(held);
  }
  finish_batch(b, NULL, err, now_ns());
}

static TRITONSERVER_Error* execute_batch(ModelState* ms, TRITONBACKEND_ModelInstance* instance,
                                         TRITONBACKEND_Request** requests, const uint32_t count,
                                         uint64_t exec_start)
{
  size_t view_cap = 0; /* (each request's inputs, and its hold of GPU inputs) */
  for (uint32_t i = 0; i < count; i++) {
    uint32_t n_inputs = 0;
    api.TRITONBACKEND_RequestInputCount(requests[i], &n_inputs);
    view_cap += n_inputs + 1;
  }
  /* One block for the batch's arrays: per request its rows, error and response; the views. */
  uint64_t* block = calloc(1, count * (sizeof(uint64_t) + sizeof(TRITONSERVER_Error*) +
                                       sizeof(TRITONBACKEND_Response*)) +
                                  (view_cap + 1) * sizeof(PyObject*));
  TRITONSERVER_Error** errors = block != NULL ? (TRITONSERVER_Error**)(block + count) : NULL;
  TRITONBACKEND_Response** responses =
      block != NULL ? (TRITONBACKEND_Response**)(errors + count) : NULL;
  Batch local = {.ms = ms,
                 .instance = instance,
                 .requests = requests,
                 .count = count,
                 .sizes = block,
                 .errors = errors,
                 .responses = responses,
                 .views = block != NULL ? (PyObject**)(responses + count) : NULL,
                 .exec_start = exec_start};
  Batch* b = &local;
  uint64_t compute_end = 0;

  if (t_wake_cap < count) {
    atomic_int** grown = realloc(t_wake, count * sizeof(atomic_int*));
    if (grown != NULL) t_wake = grown, t_wake_cap = count;
  }
  t_in_execute = 1;
  t_model_name = ms->name;
  int entered = gil_enter();
  b->list = PyList_New(count);
  if (b->list == NULL || block == NULL) {
    PyErr_Clear();
    Py_CLEAR(b->list);
    gil_leave(entered);
    t_in_execute = 0;
    free(block);
    return new_error(TRITONSERVER_ERROR_UNAVAILABLE, "out of memory");
  }
  int32_t device = 0; /* where Tensor(device="gpu") inputs go: this instance's GPU */
  TRITONSERVER_Error* no_id = api.TRITONBACKEND_ModelInstanceDeviceId(instance, &device);
  if (no_id != NULL) api.TRITONSERVER_ErrorDelete(no_id), device = 0;
  TRITONSERVER_Error* batch_err = NULL;
  PyObject* result = NULL;
  int declined = 1; /* a plain @batch function: called from here when the batch allows it */
  if (ms->fast_func != NULL) result = run_fast(b, &batch_err, &declined, &compute_end);
  for (uint32_t i = 0; declined && i < count && batch_err == NULL; i++) {
    PyObject* req =
        build_request(requests[i], ms, device, b->views, &b->n_views, &b->sizes[i], &batch_err);
    if (req != NULL) PyList_SET_ITEM(b->list, i, req);
    b->batch_size += b->sizes[i];
  }
  if (declined && batch_err == NULL) {
    b->compute_start = now_ns();
    result = PyObject_CallOneArg(ms->execute, b->list);
    compute_end = now_ns();
    if (result == NULL) batch_err = error_from_python("model binding failed");
    else if (PyUnicode_Check(result)) /* the callable raised: its message */
      batch_err = new_error(TRITONSERVER_ERROR_INTERNAL, "%s", PyUnicode_AsUTF8(result));
    else if (PyCoro_CheckExact(result) && !ms->decoupled) {
      schedule_batch(b, result);
      gil_leave(entered);
      t_in_execute = 0;
      flush_wakes();
      return NULL;
    } else if (ms->decoupled) {
      run_decoupled(ms, requests, count, result, b->sizes, b->errors);
      compute_end = now_ns();
    }
  }
  finish_batch(b, result, batch_err, compute_end);
  Py_XDECREF(result);
  gil_leave(entered);
  t_in_execute = 0;
  flush_wakes();
  return NULL;
}
