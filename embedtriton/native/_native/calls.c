/* Calls in flight (caller side): a Call's references and its end, Triton's
 * response and release callbacks, and the outputs handed back to the caller
 * (directly, or on its event loop for asyncio). */
#include "native.h"

/* A call is freed when all three let go of it: the caller (after reading the
 * response and resolving its future), Triton's release of the request (when
 * Triton stops reading the input buffers) and Triton's final response. */
/* With the GIL. */
static void call_destroy(Call* c)
{
  TRITONSERVER_InferenceResponse* late = atomic_exchange(&c->response, NULL);
  if (late != NULL) bury(NULL, late); /* arrived after its caller was let go */
  if (c->is_stream) {
    for (Queued* q = c->head; q != NULL;) {
      Queued* next = q->next;
      bury(NULL, q->response);
      free(q);
      q = next;
    }
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
  }
  Py_CLEAR(c->loop);
  Py_CLEAR(c->future);
  if (c->gate_error != NULL) api.TRITONSERVER_ErrorDelete(c->gate_error);
  if (c->keep != c->keep_inline) free(c->keep);
  for (Py_ssize_t i = 0; i < c->n_presets; i++) {
    PyBuffer_Release(&c->presets[i].view);
    Py_DECREF(c->presets[i].target);
    Py_DECREF(c->presets[i].owner);
  }
  free(c->presets);
  free(c);
}

/* Drop one reference; the last one frees the call (taking the GIL if needed). */
void call_unref(Call* c)
{
  if (atomic_fetch_sub(&c->refs, 1) == 1) {
    int entered = gil_enter();
    call_destroy(c);
    gil_leave(entered);
  }
}

/* The caller's buffer for output `name`, or NULL. */
const Preset* call_preset(struct Call* c, const char* name)
{
  for (Py_ssize_t i = 0; i < c->n_presets; i++)
    if (strcmp(c->presets[i].name, name) == 0) return &c->presets[i];
  return NULL;
}

/* With the GIL: drop the input references Triton was reading from. */
void call_drop_inputs(Call* c)
{
  for (Py_ssize_t i = 0; i < c->n_keep; i++) Py_CLEAR(c->keep[i]);
  c->n_keep = 0;
}

/* With the GIL: the caller's side is done with the call. */
void call_free(Call* c)
{
  TRITONSERVER_InferenceResponse* response = atomic_exchange(&c->response, NULL);
  if (response != NULL) bury(NULL, response); /* see bury() */
  Py_CLEAR(c->loop);
  Py_CLEAR(c->future);
  call_unref(c);
}

/* Claim the call's completion (once: Triton's final response, stop() or the
 * caller giving up race for it). Returns whether this caller won. */
int call_claim(Call* c)
{
  if (atomic_exchange(&c->completed, 1)) return 0;
  atomic_fetch_sub(&in_flight, 1);
  return 1;
}

/* A sync call is complete: wake its caller (for a call of submit_many, once
 * enough of its group are). */
void sync_done(Call* c)
{
  Group* g = c->group;
  if (g == NULL) {
    wait_signal(&c->done);
    return;
  }
  atomic_fetch_add(&g->busy, 1); /* (left still counts this call: its caller is still there) */
  atomic_store(&c->done, WAIT_DONE);
  if (atomic_fetch_sub(&g->left, 1) - 1 <= atomic_load(&g->wake_at)) wait_signal(&g->state);
  atomic_fetch_sub(&g->busy, 1); /* the last touch: its caller may return now */
}

/* The final response arrived: wake the caller or resolve its future. */
static void call_complete(Call* c)
{
  if (!call_claim(c)) return; /* stop() or the caller got there first */
  if (!c->is_async) {
    if (c->group == NULL && t_in_execute && t_wake_cap > t_wake_len)
      t_wake[t_wake_len++] = &c->done;
    else sync_done(c);
    return;
  }
  int entered = gil_enter();
  schedule_async(c);
  gil_leave(entered);
}

void response_cb(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp)
{
  Call* c = (Call*)userp;
  if (c->is_stream) {
    stream_response(c, response, flags);
    return;
  }
  if (response != NULL) {
    TRITONSERVER_InferenceResponse* old = atomic_load(&c->completed)
                                              ? response /* its caller was let go */
                                              : atomic_exchange(&c->response, response);
    if (old != NULL) bury(NULL, old); /* (a non-decoupled request gets one response) */
  }
  if (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) {
    c->finalized = 1;
    call_complete(c);
    call_unref(c); /* Triton's final response */
  }
}

void release_cb(TRITONSERVER_InferenceRequest* request, const uint32_t flags, void* userp)
{
  if (flags & RELEASE_RESCHEDULE) return; /* Triton keeps it for another iteration */
  Call* c = (Call*)userp;
  if (atomic_load(&c->gate) != NULL) gate_forget(c); /* let through, never run (see queues.c) */
  held_release(c);
  /* forget it (closed, or cancelled by stop): the pointer may be reused */
  if (c->is_stream) take_stream_closed(request);
  bury(request, NULL);
  int entered = gil_enter();
  if (c->is_stream && g_request_done != NULL) {
    /* an iterative model's generator for it, if any, is done too (Triton may have
     * dropped a cancelled request without running the model again) */
    PyObject* r = PyObject_CallFunction(g_request_done, "N", PyLong_FromVoidPtr(request));
    if (r == NULL) PyErr_WriteUnraisable(g_request_done);
    Py_XDECREF(r);
  }
  if (c->trace != NULL) {
    trace_deliver(c->trace);
    c->trace = NULL;
  }
  call_drop_inputs(c);
  call_unref(c);
  gil_leave(entered);
}

/* With the GIL: the outputs of a finished call as a dict, or NULL + error. */
PyObject* call_collect(Call* c)
{
  if (c->aborted)
    return raise_triton(TRITONSERVER_ERROR_UNAVAILABLE,
                        "the server stopped before this request completed");
  if (c->gate_error != NULL) return raise_from(c->gate_error, 0); /* from its queue policy */
  TRITONSERVER_InferenceResponse* response = atomic_load(&c->response);
  if (response == NULL)
    return raise_triton(TRITONSERVER_ERROR_INTERNAL,
                        "Triton completed the request without a response");
  return collect_response(response, c);
}

/* With the GIL: a BYTES output (Triton's length-prefixed layout) as a numpy object array. */
static PyObject* decode_bytes_output(const void* base, size_t size, const int64_t* shape,
                                     uint64_t ndim)
{
  PyObject* shape_t = PyTuple_New((Py_ssize_t)ndim);
  for (uint64_t d = 0; shape_t && d < ndim; d++)
    PyTuple_SET_ITEM(shape_t, d, PyLong_FromLongLong(shape[d]));
  PyObject* mv = PyMemoryView_FromMemory((char*)base, (Py_ssize_t)size, PyBUF_READ);
  PyObject* arr =
      (shape_t && mv) ? PyObject_CallFunctionObjArgs(g_decode_bytes, mv, shape_t, NULL) : NULL;
  Py_XDECREF(mv);
  Py_XDECREF(shape_t);
  return arr;
}

/* With the GIL: an output that is in GPU memory or that the caller wants there
 * (output_device="gpu", a CUDA shared-memory buffer): a DeviceArray, or a host array for a
 * GPU output the caller wants on the host. NULL + exception; Py_None when it is neither. */
static PyObject* device_output(Call* c, const Preset* preset, TRITONSERVER_DataType dtype,
                               const int64_t* shape, uint64_t ndim, const void* base, size_t size,
                               TRITONSERVER_MemoryType mtype, int64_t mtype_id, void* userp)
{
  int on_gpu = mtype == TRITONSERVER_MEMORY_GPU;
  int want_gpu = preset != NULL ? preset->gpu : c->out_device >= 0;
  if (!on_gpu && !want_gpu) return Py_NewRef(Py_None);
  if (ndim > MAX_DIMS)
    return raise_triton(TRITONSERVER_ERROR_UNSUPPORTED, "an output has too many dimensions");
  const char* why = NULL;
  if (dtype == TRITONSERVER_TYPE_BYTES) { /* strings are decoded on the host */
    if (preset != NULL)
      return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                          "a BYTES output cannot be written to GPU memory");
    if (!on_gpu) return Py_NewRef(Py_None);
    char* host = malloc(size ? size : 1);
    if (host == NULL) return PyErr_NoMemory();
    PyObject* arr = NULL;
    if ((why = cuda_copy(host, base, size)) == NULL)
      arr = decode_bytes_output(host, size, shape, ndim);
    free(host);
    return why ? raise_triton(TRITONSERVER_ERROR_INTERNAL, why) : arr;
  }
  if (preset != NULL) { /* the caller's device memory (a cache hit is copied there) */
    if (base != preset->view.buf && (why = cuda_copy(preset->view.buf, base, size)) != NULL)
      return raise_triton(TRITONSERVER_ERROR_INTERNAL, why);
    return device_array_new(preset->view.buf, size, (int)ndim, shape, dtype, preset->device, 0,
                            preset->target);
  }
  Ticket* ticket = (Ticket*)userp;
  if (on_gpu && ticket != NULL && ticket->gpu && want_gpu) { /* our block: the array owns it */
    PyObject* arr =
        device_array_new((void*)base, size, (int)ndim, shape, dtype, (int)mtype_id, 1, NULL);
    if (arr != NULL) ticket->taken = 1;
    return arr;
  }
  if (!want_gpu) { /* GPU memory the caller wants on the host */
    int typenum = numpy_typenum_of(dtype);
    if (typenum < 0)
      return raise_triton(TRITONSERVER_ERROR_UNSUPPORTED, "output datatype has no numpy equivalent");
    npy_intp dims[MAX_DIMS];
    for (uint64_t d = 0; d < ndim; d++) dims[d] = (npy_intp)shape[d];
    PyObject* arr = PyArray_SimpleNew((int)ndim, dims, typenum);
    if (arr != NULL && (why = cuda_copy(PyArray_DATA((PyArrayObject*)arr), base, size)) != NULL) {
      Py_DECREF(arr);
      return raise_triton(TRITONSERVER_ERROR_INTERNAL, why);
    }
    return arr;
  }
  /* host memory (or another's device memory) the caller wants on its GPU: one copy */
  PyObject* arr = device_array_alloc(size, (int)ndim, shape, dtype, c->out_device);
  if (arr != NULL && (why = cuda_copy(device_array_ptr(arr), base, size)) != NULL) {
    Py_DECREF(arr);
    return raise_triton(TRITONSERVER_ERROR_INTERNAL, why);
  }
  return arr;
}

/* With the GIL: a response's outputs as a dict, or NULL + its error raised. */
PyObject* collect_response(TRITONSERVER_InferenceResponse* resp, Call* c)
{
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceResponseError(resp);
  if (err != NULL) return raise_from(err, 0);
  uint32_t count = 0;
  if ((err = api.TRITONSERVER_InferenceResponseOutputCount(resp, &count)))
    return raise_from(err, 1);
  PyObject* result = PyDict_New();
  if (result == NULL) return NULL;
  for (uint32_t i = 0; i < count; i++) {
    const char* name;
    TRITONSERVER_DataType dtype;
    const int64_t* shape;
    uint64_t ndim;
    const void* base;
    size_t size;
    TRITONSERVER_MemoryType mtype;
    int64_t mtype_id;
    void* userp;
    if ((err = api.TRITONSERVER_InferenceResponseOutput(resp, i, &name, &dtype, &shape, &ndim,
                                                        &base, &size, &mtype, &mtype_id, &userp))) {
      Py_DECREF(result);
      return raise_from(err, 1);
    }
    npy_intp dims[MAX_DIMS];
    for (uint64_t d = 0; d < ndim && d < MAX_DIMS; d++) dims[d] = (npy_intp)shape[d];
    PyObject* arr;
    int typenum = numpy_typenum_of(dtype);
    const Preset* preset = call_preset(c, name);
    if (mtype == TRITONSERVER_MEMORY_GPU || c->out_device >= 0 || (preset && preset->gpu)) {
      arr = device_output(c, preset, dtype, shape, ndim, base, size, mtype, mtype_id, userp);
      if (arr == Py_None) Py_CLEAR(arr); /* a BYTES output on the host: below */
      else goto have;
    }
    if (preset != NULL) { /* in the caller's buffer (a cached response is copied there) */
      if ((size_t)preset->view.len < size) {
        arr = raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "an output does not fit its buffer");
      } else {
        if (base != preset->view.buf) memcpy(preset->view.buf, base, size);
        if (dtype ==
            TRITONSERVER_TYPE_BYTES) { /* the buffer holds Triton's length-prefixed layout */
          arr = decode_bytes_output(preset->view.buf, size, shape, ndim);
        } else {
          arr = typenum < 0 || ndim > MAX_DIMS
                    ? raise_triton(TRITONSERVER_ERROR_UNSUPPORTED,
                                   "output datatype has no numpy equivalent")
                    : PyArray_New(&PyArray_Type, (int)ndim, dims, typenum, NULL, preset->view.buf,
                                  0, NPY_ARRAY_CARRAY, NULL);
          if (arr && PyArray_SetBaseObject((PyArrayObject*)arr, Py_NewRef(preset->target)) < 0)
            Py_CLEAR(arr);
        }
      }
    } else if (dtype == TRITONSERVER_TYPE_BYTES) {
      arr = decode_bytes_output(base, size, shape, ndim);
    } else if (typenum < 0 || ndim > MAX_DIMS) {
      arr = raise_triton(TRITONSERVER_ERROR_UNSUPPORTED, "output datatype has no numpy equivalent");
    } else if (userp != NULL && mtype != TRITONSERVER_MEMORY_GPU) {
      /* our allocator's block: the array takes it over */
      arr = PyArray_New(&PyArray_Type, (int)ndim, dims, typenum, NULL, (void*)base, 0,
                        NPY_ARRAY_CARRAY, NULL);
      Ticket* ticket = (Ticket*)userp;
      PyObject* owner =
          arr ? PyCapsule_New(ticket->block, "embedtriton.block", free_block_capsule) : NULL;
      if (owner != NULL && PyArray_SetBaseObject((PyArrayObject*)arr, owner) == 0) {
        ticket->taken = 1;
      } else {
        if (owner) PyCapsule_SetDestructor(owner, NULL);
        Py_XDECREF(owner);
        Py_CLEAR(arr);
      }
    } else { /* e.g. a response from the cache with foreign memory: copy */
      arr = PyArray_SimpleNew((int)ndim, dims, typenum);
      if (arr) memcpy(PyArray_DATA((PyArrayObject*)arr), base, size);
    }
  have:
    if (arr == NULL || PyDict_SetItemString(result, name, arr) < 0) {
      Py_XDECREF(arr);
      Py_DECREF(result);
      return NULL;
    }
    Py_DECREF(arr);
  }
  return result;
}

/* With the GIL, on the event loop: resolve one async call's future. */
static int complete_one(Call* c)
{
  PyObject* result = call_collect(c);
  PyObject *type = NULL, *value = NULL, *tb = NULL;
  if (result == NULL) {
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
  }
  PyObject* fut = c->future;
  Py_INCREF(fut);
  call_free(c);
  PyObject* done = PyObject_CallMethodNoArgs(fut, s_done);
  PyObject* r = NULL;
  if (done == Py_False)
    r = PyObject_CallMethodOneArg(fut, result ? s_set_result : s_set_exception,
                                  result ? result : value);
  else if (done != NULL) r = Py_NewRef(Py_None);
  Py_XDECREF(done);
  Py_XDECREF(result);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  Py_DECREF(fut);
  if (r == NULL) return -1;
  Py_DECREF(r);
  return 0;
}

/* _complete(loop, calls): runs on the event loop; resolves each call's future,
 * including those added to the list after it was handed over (the loop's mailbox). */
PyObject* py_complete(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs != 2 || !PyList_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "_complete(loop, calls)");
    return NULL;
  }
  PyObject* calls = args[1];
  take_mailbox(args[0], calls);
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(calls); i++) {
    Call* c = (Call*)PyCapsule_GetPointer(PyList_GET_ITEM(calls, i), "embedtriton.call");
    if (c == NULL || complete_one(c) < 0) PyErr_WriteUnraisable(calls);
  }
  Py_RETURN_NONE;
}
