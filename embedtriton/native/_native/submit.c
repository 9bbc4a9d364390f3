/* submit(): one inference request from Python to Triton, blocking (GIL
 * released while it waits), asynchronous (a future on an event loop) or a
 * stream; and cancel() for a cancellable asynchronous one. */
#include "native.h"

/* dict(obj) for a mapping (new reference), or NULL with an InvalidArgumentError
 * "<option> must be <takes>, not ...". */
static PyObject* as_dict(PyObject* obj, const char* option, const char* takes)
{
  PyObject* d = PyMapping_Check(obj) && !PySequence_Check(obj)
                    ? PyObject_CallOneArg((PyObject*)&PyDict_Type, obj)
                    : NULL;
  if (d == NULL) {
    PyErr_Clear();
    refuse(option, takes, obj, "");
  }
  return d;
}

/* An unsigned 64-bit option (priority, timeout_us): None is 0; an int (not a bool) or an
 * object with __index__ (numpy integers) in range. -1 with an InvalidArgumentError. */
static int u64_option(PyObject* value, const char* option, const char* takes,
                      unsigned long long* out)
{
  *out = 0;
  if (value == Py_None) return 0;
  if (PyLong_CheckExact(value)) {
    *out = PyLong_AsUnsignedLongLong(value);
  } else if (!PyBool_Check(value) && PyIndex_Check(value)) {
    PyObject* n = PyNumber_Index(value);
    *out = n != NULL ? PyLong_AsUnsignedLongLong(n) : (unsigned long long)-1;
    Py_XDECREF(n);
  } else {
    *out = (unsigned long long)-1;
    PyErr_SetNone(PyExc_TypeError);
  }
  if (*out == (unsigned long long)-1 && PyErr_Occurred()) {
    refuse(option, takes, value, ""); /* (clears the error) */
    return -1;
  }
  return 0;
}

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

/* The (server, model, version) that submit() and submit_many() start with; -1 when the
 * server is not running. (A bad model or version leaves a Python error for the caller.) */
int target_args(PyObject* const* args, TRITONSERVER_Server** server, const char** model,
                long long* version)
{
  if (!api_loaded || args[0] == Py_None) {
    raise_triton(TRITONSERVER_ERROR_UNAVAILABLE, NOT_RUNNING);
    return -1;
  }
  *server = (TRITONSERVER_Server*)PyLong_AsVoidPtr(args[0]);
  *model = PyUnicode_AsUTF8(args[1]);
  *version = PyLong_AsLongLong(args[2]);
  return 0;
}

/* The options that submit() and submit_many() share, args[4] to args[8]: outputs,
 * request_id, priority, timeout_us, parameters. The common case costs nothing; other
 * mappings and sequences are converted. Returns -1 with an InvalidArgumentError. */
int request_options(PyObject* const* args, Options* o)
{
  o->outputs = o->parameters = NULL;
  o->request_id = args[5];
  if (u64_option(args[6], "priority", TAKES_PRIORITY, &o->priority) < 0 ||
      u64_option(args[7], "timeout_us", TAKES_TIMEOUT_US, &o->timeout_us) < 0)
    return -1;
  if (o->request_id != Py_None && text_of(o->request_id) == NULL) {
    refuse("request_id", TAKES_REQUEST_ID, o->request_id, TEXT_HINT(o->request_id));
    return -1;
  }
  PyObject* outputs = args[4];
  if (outputs == Py_None || PyTuple_Check(outputs) || PyDict_Check(outputs)) {
    o->outputs = Py_NewRef(outputs);
  } else if (PyUnicode_Check(outputs)) { /* outputs="y": a slip for ["y"] */
    PyObject* got = shown(outputs);
    PyObject* hint = got != NULL ? PyUnicode_FromFormat(": for one output, pass [%U]", got) : NULL;
    const char* text = hint != NULL ? PyUnicode_AsUTF8(hint) : NULL;
    if (text != NULL) refuse("outputs", TAKES_OUTPUTS, outputs, text);
    Py_XDECREF(got);
    Py_XDECREF(hint);
    return -1;
  } else if (PyBytes_Check(outputs) || PyByteArray_Check(outputs) ||
             (o->outputs = PySequence_Tuple(outputs)) == NULL) {
    PyErr_Clear();
    refuse("outputs", TAKES_OUTPUTS, outputs, "");
    return -1;
  }
  PyObject* parameters = args[8];
  o->parameters = parameters == Py_None || PyDict_Check(parameters)
                      ? Py_NewRef(parameters)
                      : as_dict(parameters, "parameters", TAKES_PARAMETERS);
  if (o->parameters == NULL) {
    Py_CLEAR(o->outputs);
    return -1;
  }
  return 0;
}

void options_clear(Options* o)
{
  Py_CLEAR(o->outputs);
  Py_CLEAR(o->parameters);
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

/* submit(server, model, version, inputs, outputs, request_id, priority,
 *        timeout_us, parameters, loop, future[, stream, sequence, release_gil,
 *        trace_sink, cancellable])
 * Without a loop: blocks (GIL released) and returns the outputs dict.
 * With a loop: returns None (a handle for cancel() when cancellable); the
 * future is resolved on the loop. */
PyObject* py_submit(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs < 11 || nargs > 17) {
    PyErr_SetString(PyExc_TypeError, "submit() takes 11 to 17 arguments");
    return NULL;
  }
  int out_device = nargs >= 17 ? (int)PyLong_AsLong(args[16]) : -1; /* output_device */
  if (out_device == -1 && PyErr_Occurred()) return NULL;
  PyObject* trace_sink = nargs >= 15 ? args[14] : Py_None;
  int cancellable = nargs >= 16 && PyObject_IsTrue(args[15]) == 1;
  int release_gil = nargs >= 14 && PyObject_IsTrue(args[13]) == 1;
  int stream = nargs >= 12 && PyObject_IsTrue(args[11]) == 1;
  PyObject* sequence = nargs >= 13 ? args[12] : Py_None; /* (correlation id, flags) */
  TRITONSERVER_Server* server;
  const char* model;
  long long version;
  if (target_args(args, &server, &model, &version) < 0) return NULL;
  PyObject* loop = args[9];
  if (t_model_thread && loop == Py_None && !PyErr_Occurred()) /* it would wait on its own loop */
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                        "a blocking call from an async def callable would stop the event loop that "
                        "runs it: use await model.infer_async(...) (or async for ... in "
                        "model.stream_async(...))");
  if (t_in_execute && loop == Py_None && t_model_name != NULL && model != NULL &&
      strcmp(model, t_model_name) == 0) /* its instance would wait for itself */
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                        "a sync callable cannot call its own model: the instance running it would "
                        "wait for itself; write it as an async def callable and await "
                        "model.infer_async(...) to recurse");
  Options o;
  if (request_options(args, &o) < 0) return NULL;
  PyObject* inputs = PyDict_Check(args[3])
                         ? Py_NewRef(args[3])
                         : as_dict(args[3], "inputs", "a mapping of input name -> array");
  PyObject* result = NULL;
  if (inputs != NULL && lock_open_server(server) == 0)
    result = submit_locked(server, model, version, inputs, o.outputs, o.request_id, o.priority,
                           o.timeout_us, o.parameters, loop, args[10], stream, sequence,
                           release_gil, trace_sink, cancellable, out_device, NULL, NULL);
  Py_XDECREF(inputs);
  options_clear(&o);
  return result;
}

/* With servers_lock held (read), which it lets go of: one request to Triton.
 * With a group (submit_many): returns None once Triton took it, the call in *out. */
PyObject* submit_locked(TRITONSERVER_Server* server, const char* model, long long version,
                        PyObject* inputs, PyObject* outputs, PyObject* request_id,
                        unsigned long long priority, unsigned long long timeout_us,
                        PyObject* parameters, PyObject* loop, PyObject* future, int stream,
                        PyObject* sequence, int release_gil, PyObject* trace_sink, int cancellable,
                        int out_device, Group* group, Call** out)
{
  TRITONSERVER_InferenceRequest* req = NULL;
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceRequestNew(&req, server, model, version);
  if (err != NULL) {
    pthread_rwlock_unlock(&servers_lock);
    return raise_from(err, 1);
  }

  Call* c = calloc(1, sizeof(Call));
  if (c == NULL) {
    pthread_rwlock_unlock(&servers_lock);
    api.TRITONSERVER_InferenceRequestDelete(req);
    return PyErr_NoMemory();
  }
  c->server = server;
  Py_ssize_t n_inputs = PyDict_GET_SIZE(inputs);
  c->keep = n_inputs <= 8 ? c->keep_inline : calloc((size_t)n_inputs, sizeof(PyObject*));
  atomic_init(&c->refs, 1); /* the caller's; Triton's is added when it takes the request */
  call_set_kind(c, stream, loop, future); /* its kind's completion (complete.c) */
  c->request = req;
  c->group = group;
  c->out_device = out_device;
  if (stream) {
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
  }

  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (c->keep != NULL && PyDict_Next(inputs, &pos, &key, &value)) {
    PyObject* holder = add_input(req, key, value);
    if (holder == NULL) goto fail;
    c->keep[c->n_keep++] = holder;
  }
  if (c->keep == NULL) {
    PyErr_NoMemory();
    goto fail;
  }
  if (outputs != Py_None && PyDict_Check(outputs)) { /* name -> writable buffer or None */
    c->presets = calloc((size_t)PyDict_GET_SIZE(outputs) + 1, sizeof(Preset));
    if (c->presets == NULL) {
      PyErr_NoMemory();
      goto fail;
    }
    pos = 0;
    while (PyDict_Next(outputs, &pos, &key, &value)) {
      const char* name = text_of(key);
      if (name == NULL) {
        refuse("a name in outputs", TAKES_OUTPUT, key, TEXT_HINT(key));
        goto fail;
      }
      if ((err = api.TRITONSERVER_InferenceRequestAddRequestedOutput(req, name))) goto fail_err;
      if (value == Py_None) continue;
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
        goto fail;
      }
      p->name = name;
      p->owner = Py_NewRef(outputs);
      p->target = Py_NewRef(value);
      c->n_presets++;
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
        goto fail;
      }
      if ((err = api.TRITONSERVER_InferenceRequestAddRequestedOutput(req, name))) goto fail_err;
    }
  }
  if (request_id != Py_None) {
    const char* id = PyUnicode_AsUTF8(request_id);
    if (id == NULL) goto fail;
    if ((err = api.TRITONSERVER_InferenceRequestSetId(req, id))) goto fail_err;
  }
  if (sequence != Py_None) {
    PyObject* id = PyTuple_Check(sequence) && PyTuple_GET_SIZE(sequence) == 2
                       ? PyTuple_GET_ITEM(sequence, 0)
                       : NULL;
    unsigned long flags = id ? PyLong_AsUnsignedLong(PyTuple_GET_ITEM(sequence, 1)) : 0;
    if (id == NULL || PyErr_Occurred()) {
      PyErr_Clear();
      raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "bad sequence arguments");
      goto fail;
    }
    if (PyUnicode_Check(id)) {
      const char* text = text_of(id);
      if (text == NULL || text[0] == '\0') {
        refuse("correlation_id", TAKES_CORRELATION_ID, id, text == NULL ? NOT_TEXT : "");
        goto fail;
      }
      err = api.TRITONSERVER_InferenceRequestSetCorrelationIdString(req, text);
    } else {
      unsigned long long number;
      if (PyBool_Check(id) || u64_option(id, "correlation_id", TAKES_CORRELATION_ID, &number) < 0 ||
          number == 0) {
        refuse("correlation_id", TAKES_CORRELATION_ID, id, "");
        goto fail;
      }
      err = api.TRITONSERVER_InferenceRequestSetCorrelationId(req, number);
    }
    if (err == NULL && flags) err = api.TRITONSERVER_InferenceRequestSetFlags(req, (uint32_t)flags);
    if (err != NULL) goto fail_err;
  }
  if (priority && (err = api.TRITONSERVER_InferenceRequestSetPriorityUInt64(req, priority)))
    goto fail_err;
  if (timeout_us &&
      (err = api.TRITONSERVER_InferenceRequestSetTimeoutMicroseconds(req, timeout_us)))
    goto fail_err;
  if (parameters != Py_None) {
    pos = 0;
    while (PyDict_Next(parameters, &pos, &key, &value))
      if ((err = set_parameter(req, key, value))) goto fail_err;
  }
  if ((err = api.TRITONSERVER_InferenceRequestSetReleaseCallback(req, release_cb, c)) ||
      (err = api.TRITONSERVER_InferenceRequestSetResponseCallback(
           req, allocator, c->n_presets || c->out_device >= 0 ? c : NULL, response_cb, c)))
    goto fail_err;

  /* Triton's two (dropped at its release and at its final response) and, for a cancellable
   * asynchronous call, the handle's: taken before ServerInferAsync, which may complete the
   * call inline (a response-cache hit) and, on an immediate loop (the gRPC frontend's), let
   * the caller go too, freeing the call before this function returns. */
  int handle_ref = c->is_async && cancellable;
  atomic_fetch_add(&c->refs, 2 + handle_ref);
  if (c->is_async || (stream && loop != Py_None)) {
    c->loop = Py_NewRef(loop);
    c->future = Py_NewRef(future); /* a stream's: the callable that wakes its consumer */
  } else {
    atomic_init(&c->done, WAIT_PENDING);
  }
  TRITONSERVER_InferenceTrace* trace = NULL;
  if (trace_sink != Py_None && (trace = trace_new(trace_sink, &c->trace)) == NULL) {
    atomic_fetch_sub(&c->refs, 2 + handle_ref);
    Py_CLEAR(c->loop);
    Py_CLEAR(c->future);
    goto fail;
  }
  held_add(c);
  atomic_fetch_add(&in_flight, 1);
  /* A model with queue policies or priorities: its gate may hold the request (queues.c). */
  Gate* gate = gate_find(server, model, version);
  int admitted = GATE_GO;
  if (gate != NULL) {
    const char* id = request_id != Py_None ? PyUnicode_AsUTF8(request_id) : NULL;
    admitted = gate_admit(gate, c, trace, priority, timeout_us, id, &err);
    gate_release_ref(gate);
  }
  /* The GIL stays held: handing over a request does not block, and releasing
   * the GIL here would let the model thread in and make this caller queue
   * for it again (a convoy under load). Callbacks that Triton runs inline
   * (errors, cache hits) find the GIL already held. */
  if (admitted != GATE_GO) {
    /* held by the gate (err NULL), or refused (err: Triton's wording) */
  } else if (release_gil) { /* a batch rule: see TRITONBACKEND_ModelBatchIncludeRequest */
    Py_BEGIN_ALLOW_THREADS
    err = api.TRITONSERVER_ServerInferAsync(server, req, trace);
    Py_END_ALLOW_THREADS
  } else {
    err = api.TRITONSERVER_ServerInferAsync(server, req, trace);
  }
  pthread_rwlock_unlock(&servers_lock);
  if (err != NULL && admitted == GATE_GO && gate != NULL) gate_forget(c);
  if (err != NULL) {        /* Triton did not take the request: no callbacks */
    if (c->trace != NULL) { /* the sink sees no times; Triton drops its side with the request */
      trace_deliver(c->trace);
      c->trace = NULL;
    }
    held_release(c);
    call_claim(c);
    api.TRITONSERVER_InferenceRequestDelete(req);
    raise_from(err, 1);
    call_drop_inputs(c);
    atomic_fetch_sub(&c->refs, 2 + handle_ref); /* never taken (the caller's remains) */
    call_free(c);
    return NULL;
  }
  if (group != NULL) { /* (submit_many counted it in before, and waits for it) */
    *out = c;
    Py_RETURN_NONE;
  }
  if (c->is_async || stream) drain_graveyard(GRAVE_STEP_ASYNC); /* (a sync call: as it waits) */
  if (c->is_async) {
    if (!cancellable) Py_RETURN_NONE;
    PyObject* handle = PyCapsule_New(c, "embedtriton.request", request_handle_free);
    if (handle == NULL) call_unref(c);
    return handle;
  }
  if (stream) return PyCapsule_New(c, "embedtriton.stream", NULL);

  if (wait_interruptible(&c->done) < 0) { /* Ctrl-C: cancel the request and leave */
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

fail_err:
  raise_from(err, 1);
fail:
  pthread_rwlock_unlock(&servers_lock);
  api.TRITONSERVER_InferenceRequestDelete(req);
  call_drop_inputs(c);
  call_free(c);
  return NULL;
}
