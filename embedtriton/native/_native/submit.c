/* submit(): one inference request from Python to Triton, blocking (GIL
 * released while it waits), asynchronous (a future on an event loop) or a
 * stream; and cancel() for a cancellable asynchronous one. */
#include "submit.h"

#include "calls.h"
#include "cancel.h"
#include "complete.h"
#include "device_array.h"
#include "gates.h"
#include "graveyard.h"
#include "inputs.h"
#include "outputs.h"
#include "queues.h"
#include "request.h"
#include "request_spec.h"
#include "servers.h"
#include "streams.h"
#include "threads.h"
#include "trace.h"

/* The handle of a cancellable asynchronous call holds a reference to it. */
static void request_handle_free(PyObject* capsule)
{
  Call* c = (Call*)PyCapsule_GetPointer(capsule, "embedtriton.request");
  if (c != NULL) call_unref(c);
}

/* cancel(handle): the client went away; Triton drops the request if it has not
 * run it yet (the caller still gets its completion, CANCELLED or the result). */
PyObject* py_cancel(PyObject* self, PyObject* capsule)
{
  (void)self;
  Call* c = (Call*)PyCapsule_GetPointer(capsule, "embedtriton.request");
  if (c == NULL) return NULL;
  call_cancel(c);
  Py_RETURN_NONE;
}
/* Take servers_lock (read) for a request to server: -1 (the lock not held) with an
 * UnavailableError when the server is not running. */
int lock_open_server(TRITONSERVER_Server* server)
{
  pthread_rwlock_rdlock(&servers_lock);
  if (server_is_open(server)) return 0;
  pthread_rwlock_unlock(&servers_lock);
  raise_triton(TRITONSERVER_ERROR_UNAVAILABLE, NOT_RUNNING);
  return -1;
}

/* submit(server, model, version, request, loop, future, stream, cancellable, release_gil)
 * request: an InferRequest (its fields: request_spec_read), or a dict: the inputs of a
 * request with no options (Model.infer's, when nothing else is to be read).
 * Without a loop: blocks (GIL released) and returns the outputs dict.
 * With a loop: returns None (a handle for cancel() when cancellable); the
 * future is resolved on the loop. A stream: returns its handle; with a loop,
 * future is the callable that wakes its consumer. release_gil: hand the request
 * to Triton without the GIL (a model with a batch rule). */
PyObject* py_submit(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "submit() takes 9 arguments");
    return NULL;
  }
  PyObject *loop = args[4], *future = args[5];
  int stream = PyObject_IsTrue(args[6]) == 1;
  int cancellable = PyObject_IsTrue(args[7]) == 1;
  int release_gil = PyObject_IsTrue(args[8]) == 1;
  RequestSpec s;
  if (target_args(args, &s) < 0) return NULL;
  if (t_model_thread && loop == Py_None && future == Py_None && !PyErr_Occurred())
    /* it would wait on its own loop (a target is called instead: it does not wait) */
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                        "a blocking call from an async def callable would stop the event loop that "
                        "runs it: use await model.infer_async(...) (or async for ... in "
                        "model.stream_async(...))");
  if (t_in_execute && loop == Py_None && future == Py_None && t_model_name != NULL &&
      s.model != NULL &&
      strcmp(s.model, t_model_name) == 0) /* its instance would wait for itself */
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                        "a sync callable cannot call its own model: the instance running it would "
                        "wait for itself; write it as an async def callable and await "
                        "model.infer_async(...) to recurse");
  if (request_spec_read(args[3], &s) < 0) return NULL;
  PyObject* result = NULL;
  Submission how = {.loop = loop,
                    .future = future,
                    .stream = stream,
                    .release_gil = release_gil,
                    .cancellable = cancellable};
  if (lock_open_server(s.server) == 0) result = submit_locked(&s, &how, NULL);
  request_spec_clear(&s);
  return result;
}

/* Triton's correlation id and flags of a request of a sequence: (id, flags). -1 with an
 * exception (the error in *err when Triton refused). */
static int set_sequence(TRITONSERVER_InferenceRequest* req, PyObject* sequence,
                        TRITONSERVER_Error** err)
{
  PyObject* id = PyTuple_Check(sequence) && PyTuple_GET_SIZE(sequence) == 2
                     ? PyTuple_GET_ITEM(sequence, 0)
                     : NULL;
  unsigned long flags = id ? PyLong_AsUnsignedLong(PyTuple_GET_ITEM(sequence, 1)) : 0;
  if (id == NULL || PyErr_Occurred()) {
    PyErr_Clear();
    raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "bad sequence arguments");
    return -1;
  }
  if (PyUnicode_Check(id)) {
    const char* text = text_of(id);
    if (text == NULL || text[0] == '\0') {
      refuse("correlation_id", TAKES_CORRELATION_ID, id, text == NULL ? NOT_TEXT : "");
      return -1;
    }
    *err = api.TRITONSERVER_InferenceRequestSetCorrelationIdString(req, text);
  } else {
    unsigned long long number;
    if (PyBool_Check(id) || u64_option(id, "correlation_id", TAKES_CORRELATION_ID, &number) < 0 ||
        number == 0) {
      refuse("correlation_id", TAKES_CORRELATION_ID, id, "");
      return -1;
    }
    *err = api.TRITONSERVER_InferenceRequestSetCorrelationId(req, number);
  }
  if (*err == NULL && flags) *err = api.TRITONSERVER_InferenceRequestSetFlags(req, (uint32_t)flags);
  return *err != NULL ? -1 : 0;
}

/* With the GIL: Triton did not take c's request (err, which this deletes): no callbacks come.
 * Raises err and frees the call; returns NULL. */
PyObject* submit_refused(Call* c, TRITONSERVER_Error* err, int handle_ref)
{
  if (c->trace != NULL) { /* the sink sees no times; Triton drops its side with the request */
    trace_deliver(c->trace);
    c->trace = NULL;
  }
  held_release(c);
  call_claim(c);
  api.TRITONSERVER_InferenceRequestDelete(c->request);
  raise_from(err, 1);
  call_drop_inputs(c);
  atomic_fetch_sub(&c->refs, 2 + handle_ref); /* never taken (the caller's remains) */
  call_free(c);
  return NULL;
}

/* A new call's fields (calloc'd c, the caller's reference): its kind, its request and the room
 * for its inputs: the references it holds and, handed over by submit_many (defers), its pending
 * inputs (NULL when out of memory, which build_inputs reports). */
static void call_init(Call* c, const RequestSpec* s, TRITONSERVER_InferenceRequest* req,
                      const Submission* how, int defers)
{
  c->server = s->server;
  Py_ssize_t n_inputs = PyDict_GET_SIZE(s->inputs);
  Py_ssize_t n_held = defers ? 2 * n_inputs : n_inputs; /* (a pending input's name is held too) */
  c->keep = n_held <= 8 ? c->keep_inline : calloc((size_t)n_held, sizeof(PyObject*));
  if (defers)
    c->deferred.inputs = n_inputs <= DEFERRED_INLINE ? c->deferred.inputs_inline
                                                     : calloc((size_t)n_inputs, sizeof(InputDesc));
  atomic_init(&c->refs, 1); /* the caller's; Triton's is added when it takes the request */
  call_set_kind(c, how->stream, how->loop, how->future); /* its kind's completion (complete.c) */
  c->request = req;
  c->group = how->group;
  c->out_device = s->out_device;
  if (how->stream) stream_init(c);
}

/* The inputs (a dict name -> array) added to c's request, or, handed over by submit_many
 * (defers), read for it: 0, or -1 with an exception. */
static int build_inputs(Call* c, PyObject* inputs, int defers)
{
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (c->keep != NULL && (c->deferred.inputs != NULL || !defers) &&
         PyDict_Next(inputs, &pos, &key, &value)) {
    if (defers && pending_input(key, value, &c->deferred.inputs[c->deferred.n_inputs])) {
      c->deferred.n_inputs++;
      c->keep[c->n_keep++] = Py_NewRef(value);
      c->keep[c->n_keep++] = Py_NewRef(key);
      continue;
    }
    PyObject* holder = add_input(c->request, key, value);
    if (holder == NULL) return -1;
    c->keep[c->n_keep++] = holder;
  }
  if (c->keep == NULL || (defers && c->deferred.inputs == NULL)) {
    PyErr_NoMemory();
    return -1;
  }
  return 0;
}

/* outputs[key], a buffer, as c's next preset: Triton writes that output into it. 0, or -1 with
 * an exception. */
static int add_preset(Call* c, PyObject* outputs, PyObject* key, PyObject* value, const char* name)
{
  Preset* p = &c->presets[c->n_presets];
  if (is_device_array(value)) { /* device memory (a client's CUDA shared memory) */
    p->gpu = 1;
    p->device = device_array_device(value);
    p->view.buf = device_array_ptr(value);
    p->view.len = (Py_ssize_t)device_array_nbytes(value);
  } else if (PyObject_GetBuffer(value, &p->view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
    PyErr_Clear();
    PyObject* option = PyUnicode_FromFormat("outputs[%R]", key);
    const char* text = option != NULL ? PyUnicode_AsUTF8(option) : NULL;
    if (text != NULL) refuse(text, TAKES_OUTPUT_BUFFER, value, "");
    Py_XDECREF(option);
    return -1;
  }
  p->name = name;
  p->owner = Py_NewRef(outputs);
  p->target = Py_NewRef(value);
  c->n_presets++;
  return 0;
}

/* The outputs asked for (None: all; a tuple of names; a dict name -> writable buffer or None)
 * on c's request: 0, or -1 with an exception. */
static int build_outputs(Call* c, PyObject* outputs)
{
  TRITONSERVER_InferenceRequest* req = c->request;
  TRITONSERVER_Error* err;
  if (outputs != Py_None && PyDict_Check(outputs)) { /* name -> writable buffer or None */
    c->presets = calloc((size_t)PyDict_GET_SIZE(outputs) + 1, sizeof(Preset));
    if (c->presets == NULL) {
      PyErr_NoMemory();
      return -1;
    }
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(outputs, &pos, &key, &value)) {
      const char* name = text_of(key);
      if (name == NULL) {
        refuse("a name in outputs", TAKES_OUTPUT, key, TEXT_HINT(key));
        return -1;
      }
      if ((err = api.TRITONSERVER_InferenceRequestAddRequestedOutput(req, name))) {
        raise_from(err, 1);
        return -1;
      }
      if (value != Py_None && add_preset(c, outputs, key, value, name) < 0) return -1;
    }
  } else if (outputs != Py_None) {
    Py_ssize_t n = PyTuple_GET_SIZE(outputs);
    for (Py_ssize_t i = 0; i < n; i++) {
      PyObject* item = PyTuple_GET_ITEM(outputs, i);
      const char* name = text_of(item);
      if (name == NULL) {
        char option[40];
        snprintf(option, sizeof option, "outputs[%zd]", i);
        refuse(option, TAKES_OUTPUT, item, TEXT_HINT(item));
        return -1;
      }
      if ((err = api.TRITONSERVER_InferenceRequestAddRequestedOutput(req, name))) {
        raise_from(err, 1);
        return -1;
      }
    }
  }
  return 0;
}

/* The rest of s on c's request (its id, sequence, priority, timeout and parameters) and Triton's
 * callbacks: 0, or -1 with an exception. */
static int build_options(Call* c, const RequestSpec* s)
{
  TRITONSERVER_InferenceRequest* req = c->request;
  TRITONSERVER_Error* err = NULL;
  if (s->request_id != Py_None) {
    const char* id = PyUnicode_AsUTF8(s->request_id);
    if (id == NULL) return -1;
    if ((err = api.TRITONSERVER_InferenceRequestSetId(req, id))) goto fail_err;
  }
  if (s->sequence != Py_None && set_sequence(req, s->sequence, &err) < 0) {
    if (err != NULL) goto fail_err;
    return -1;
  }
  if (s->priority && (err = api.TRITONSERVER_InferenceRequestSetPriorityUInt64(req, s->priority)))
    goto fail_err;
  if (s->timeout_us &&
      (err = api.TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(req, s->timeout_us)))
    goto fail_err;
  if (s->parameters != Py_None) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(s->parameters, &pos, &key, &value))
      if ((err = set_parameter(req, key, value))) goto fail_err;
  }
  if ((err = call_bind_request(c))) goto fail_err;
  return 0;
fail_err:
  raise_from(err, 1);
  return -1;
}

/* With servers_lock held (read), which it lets go of: c's request to Triton, unless the gate
 * held or refused it (admitted; err: its refusal). The GIL is let go of for the hand-over when
 * release says so; a caller that waits keeps it released (*released) for its wait once Triton
 * took the call. Returns Triton's error, or the gate's. */
static TRITONSERVER_Error* hand_over_unlock(Call* c, TRITONSERVER_InferenceTrace* trace,
                                            int admitted, TRITONSERVER_Error* err, int release,
                                            int waits, PyThreadState** released)
{
  TRITONSERVER_Server* server = c->server;
  TRITONSERVER_InferenceRequest* req = c->request;
  if (admitted == GATE_GO) { /* (else held by the gate, err NULL, or refused: Triton's wording) */
    if (release) *released = PyEval_SaveThread();
    err = hand_over(server, req, trace);
  }
  pthread_rwlock_unlock(&servers_lock);
  if (*released != NULL && (err != NULL || !waits)) {
    PyEval_RestoreThread(*released);
    *released = NULL;
  }
  return err;
}

/* A sync caller's wait for c, Triton's (the GIL still released for it: released), then its
 * outputs; NULL with an exception (Ctrl-C cancels the call). c is freed. */
static PyObject* wait_outputs(Call* c, PyThreadState* released)
{
  int waited = released != NULL ? wait_released(&c->done, released) : wait_interruptible(&c->done);
  if (waited < 0) { /* Ctrl-C: cancel the request and leave */
    if (call_claim(c)) {
      call_cancel(c);
    } else { /* it completed meanwhile: its wake-up may still be on its way */
      Py_BEGIN_ALLOW_THREADS
      wait_for(&c->done, 0, 0);
      Py_END_ALLOW_THREADS
    }
    call_free(c);
    return NULL;
  }
  PyObject* result = call_collect(c);
  call_free(c);
  return result;
}

/* c taken by Triton: what its caller gets. A group's call (submit_many counted it in before, and
 * waits for it) in *out, and None; an asynchronous call's cancel handle (None if it takes none);
 * a stream's capsule; a sync call's outputs once it is done. */
static PyObject* submitted(Call* c, const Submission* how, Call** out, PyThreadState* released)
{
  if (how->group != NULL) {
    *out = c;
    Py_RETURN_NONE;
  }
  if (c->is_async || how->stream) delete_buried(GRAVE_STEP_ASYNC); /* (a sync call: as it waits) */
  if (c->is_async) {
    if (!how->cancellable) Py_RETURN_NONE;
    PyObject* handle = PyCapsule_New(c, "embedtriton.request", request_handle_free);
    if (handle == NULL) call_unref(c);
    return handle;
  }
  if (how->stream) return PyCapsule_New(c, "embedtriton.stream", NULL);
  return wait_outputs(c, released);
}

/* With servers_lock held (read), which it lets go of: the request s to Triton, in steps: the call
 * and its request built (call_init, build_*), Triton's references taken, admitted by the model's
 * gate if it has one, handed over (hand_over_unlock), and what the caller gets (submitted).
 * With a group (submit_many): returns None once Triton took it, the call in *out. */
PyObject* submit_locked(const RequestSpec* s, const Submission* how, Call** out)
{
  TRITONSERVER_InferenceRequest* req = NULL;
  TRITONSERVER_Error* err =
      api.TRITONSERVER_InferenceRequestNew(&req, s->server, s->model, s->version);
  if (err != NULL) {
    pthread_rwlock_unlock(&servers_lock);
    return raise_from(err, 1);
  }
  Call* c = calloc(1, how->stream ? sizeof(StreamCall) : sizeof(Call)); /* (its kind's fields) */
  if (c == NULL) {
    pthread_rwlock_unlock(&servers_lock);
    api.TRITONSERVER_InferenceRequestDelete(req);
    return PyErr_NoMemory();
  }
  /* A model with queue policies or priorities: its gate may hold the request (queues.c). */
  Gate* gate = gate_find(s->server, s->model, s->version);
  /* submit_many hands a call over itself (hand_over, many.c), without the GIL: its numpy
   * inputs are added to the request there, not here. */
  int defers = how->group != NULL && gate == NULL && !how->release_gil;
  call_init(c, s, req, how, defers);
  if (build_inputs(c, s->inputs, defers) < 0 || build_outputs(c, s->outputs) < 0 ||
      build_options(c, s) < 0)
    goto fail;

  /* Triton's two (dropped at its release and at its final response) and, for a cancellable
   * asynchronous call, the handle's: taken before ServerInferAsync, which may complete the
   * call inline (a response-cache hit) and, on an immediate loop (the gRPC frontend's), let
   * the caller go too, freeing the call before this function returns. */
  int handle_ref = c->is_async && how->cancellable;
  atomic_fetch_add(&c->refs, 2 + handle_ref);
  TRITONSERVER_InferenceTrace* trace = NULL;
  if (s->trace_sink != Py_None && (trace = trace_new(s->trace_sink, &c->trace)) == NULL) {
    atomic_fetch_sub(&c->refs, 2 + handle_ref);
    goto fail;
  }
  held_add(c);
  atomic_fetch_add(&in_flight, 1);
  int admitted = GATE_GO;
  if (gate != NULL) {
    const char* id = s->request_id != Py_None ? PyUnicode_AsUTF8(s->request_id) : NULL;
    admitted = gate_admit(gate, c, trace, s->priority, s->timeout_us, id, &err);
    gate_release_ref(gate);
  }
  if (defers) { /* submit_many hands it over */
    c->deferred.trace = trace;
    c->deferred.waiting = 1;
    pthread_rwlock_unlock(&servers_lock);
    *out = c;
    Py_RETURN_NONE;
  }
  /* A caller that waits for its call lets go of the GIL before the hand-over and takes it back
   * only once the call is done: the model thread, which Triton may reach before
   * ServerInferAsync returns here, then never waits for this caller's GIL. (Not on a Triton
   * thread, a callable calling a model: its callbacks would take the GIL as held.) An
   * asynchronous caller keeps it: handing over a request does not block, and releasing the GIL
   * would let the model thread in and make this caller queue for it again (a convoy under
   * load). Callbacks that Triton runs inline (errors, cache hits) take the GIL if it is free.
   * (release_gil: a batch rule, see TRITONBACKEND_ModelBatchIncludeRequest) */
  int waits = how->group == NULL && !c->is_async && !how->stream && t_gil_depth == 0;
  PyThreadState* released = NULL;
  err = hand_over_unlock(c, trace, admitted, err, how->release_gil || waits, waits, &released);
  if (err != NULL && admitted == GATE_GO && gate != NULL) gate_forget(c);
  if (err != NULL) return submit_refused(c, err, handle_ref);
  return submitted(c, how, out, released);

fail:
  pthread_rwlock_unlock(&servers_lock);
  if (gate != NULL) gate_release_ref(gate);
  api.TRITONSERVER_InferenceRequestDelete(req);
  call_drop_inputs(c);
  call_free(c);
  return NULL;
}
