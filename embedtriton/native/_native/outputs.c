/* A finished call's outputs for its caller: Triton's response read into numpy arrays,
 * DeviceArrays or the caller's own buffers (call_collect, collect_response). */
#include "outputs.h"

#include "calls.h"
#include "cuda.h"
#include "device_array.h"
#include "memory.h"

/* (outputs.h) */
__thread int t_sending;

static PyObject* collect_kept(struct Kept* k);

/* With the GIL: the outputs of a finished call as a dict, or NULL + error. */
PyObject* call_collect(Call* c)
{
  if (c->aborted)
    return raise_triton(TRITONSERVER_ERROR_UNAVAILABLE,
                        "the server stopped before this request completed");
  if (c->gate_error != NULL) return raise_from(c->gate_error, 0); /* from its queue policy */
  struct Kept* kept = atomic_load(&c->kept);
  if (kept != NULL) return collect_kept(kept);
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

/* With the GIL: a numpy array over a block of ours that it takes over (freeing it when it
 * dies), or NULL + exception with the block still the caller's. */
static PyObject* array_owning(int ndim, npy_intp* dims, int typenum, void* block)
{
  PyObject* arr =
      PyArray_New(&PyArray_Type, ndim, dims, typenum, NULL, block, 0, NPY_ARRAY_CARRAY, NULL);
  PyObject* owner = arr ? PyCapsule_New(block, "embedtriton.block", free_block_capsule) : NULL;
  if (owner != NULL && PyArray_SetBaseObject((PyArrayObject*)arr, owner) == 0) return arr;
  if (owner) PyCapsule_SetDestructor(owner, NULL); /* (the block stays the caller's) */
  Py_XDECREF(owner);
  Py_XDECREF(arr);
  return NULL;
}

/* ---- outputs kept: a response read where it was sent ---------------------
 * Triton builds a response on its instance thread, from that thread's malloc
 * arena. Deleted by the caller (late, in the graveyard), each of its frees took
 * that arena's lock while the instance thread allocated the next responses
 * from it: the two threads queued on glibc's lock, and the instance thread's
 * mallocs went the slow way (infer_many spent half of its caller's time there).
 * So a plain call's response sent by our backend is read into one block (names,
 * shapes, small outputs copied; larger output buffers taken over) and deleted
 * on the instance thread at once. That is safe there, unlike in other
 * callbacks (see bury()): inside send_final the request, or its response
 * factory, still holds the model, so the response is never its last reference. */
#define KEEP_COPY_MAX 256 /* bytes: an output this small is copied, its buffer freed at once */
#define KEEP_MAX_OUTPUTS 16

static int succeeded(TRITONSERVER_Error* err)
{
  if (err == NULL) return 1;
  api.TRITONSERVER_ErrorDelete(err);
  return 0;
}

/* Triton's thread, inside send_final (t_sending), without the GIL: the response's outputs
 * in one block, or NULL when they stay in the response (an error, more than
 * KEEP_MAX_OUTPUTS outputs, outputs not in our host buffers: the caller's own buffers, GPU
 * or cached memory). The caller deletes the response once this returned a block. */
Kept* keep_outputs(TRITONSERVER_InferenceResponse* resp, Call* c)
{
  if (c->n_presets || c->out_device >= 0 || api.TRITONSERVER_InferenceResponseError(resp))
    return NULL;
  uint32_t count = 0;
  if (!succeeded(api.TRITONSERVER_InferenceResponseOutputCount(resp, &count)) ||
      count > KEEP_MAX_OUTPUTS)
    return NULL;
  KeptOutput o[KEEP_MAX_OUTPUTS];
  Ticket* tickets[KEEP_MAX_OUTPUTS];
  size_t bytes = sizeof(Kept) + count * sizeof(KeptOutput);
  for (uint32_t i = 0; i < count; i++) {
    uint64_t ndim;
    TRITONSERVER_MemoryType mtype;
    int64_t mtype_id;
    void* userp;
    if (!succeeded(api.TRITONSERVER_InferenceResponseOutput(resp, i, &o[i].name, &o[i].dtype,
                                                            &o[i].shape, &ndim, &o[i].data,
                                                            &o[i].size, &mtype, &mtype_id, &userp)))
      return NULL;
    tickets[i] = (Ticket*)userp;
    if (mtype != TRITONSERVER_MEMORY_CPU || userp == NULL || tickets[i]->gpu || ndim > MAX_DIMS)
      return NULL;
    o[i].ndim = (uint32_t)ndim;
    bytes += ndim * sizeof(int64_t) + strlen(o[i].name) + 1;
    if (o[i].size <= KEEP_COPY_MAX) bytes += o[i].size;
  }
  Kept* k =
      bytes <= KEPT_INLINE && atomic_load(&c->kept) == NULL ? (Kept*)c->kept_inline : malloc(bytes);
  if (k == NULL) return NULL;
  k->count = count;
  int64_t* shapes = (int64_t*)&k->out[count];
  for (uint32_t i = 0; i < count; i++) {
    if (o[i].ndim) memcpy(shapes, o[i].shape, o[i].ndim * sizeof(int64_t));
    o[i].shape = shapes;
    shapes += o[i].ndim;
  }
  char* at = (char*)shapes;
  for (uint32_t i = 0; i < count; i++) {
    size_t n = strlen(o[i].name) + 1;
    memcpy(at, o[i].name, n);
    o[i].name = at;
    at += n;
  }
  for (uint32_t i = 0; i < count; i++) {
    o[i].owned = NULL;
    if (o[i].size <= KEEP_COPY_MAX) { /* its buffer goes with the response */
      if (o[i].size) memcpy(at, o[i].data, o[i].size);
      o[i].data = at;
      at += o[i].size;
    } else { /* taken over: the response's release leaves it */
      o[i].owned = tickets[i]->block;
      tickets[i]->taken = 1;
    }
    k->out[i] = o[i];
  }
  return k;
}

/* With the GIL: the kept outputs as a dict (the buffers it owns handed to their arrays). */
static PyObject* collect_kept(Kept* k)
{
  PyObject* result = PyDict_New();
  for (uint32_t i = 0; result != NULL && i < k->count; i++) {
    KeptOutput* o = &k->out[i];
    npy_intp dims[MAX_DIMS];
    for (uint32_t d = 0; d < o->ndim; d++) dims[d] = (npy_intp)o->shape[d];
    int typenum = numpy_typenum_of(o->dtype);
    PyObject* arr;
    if (o->dtype == TRITONSERVER_TYPE_BYTES) {
      arr = decode_bytes_output(o->data, o->size, o->shape, o->ndim);
    } else if (typenum < 0) {
      arr = raise_triton(TRITONSERVER_ERROR_UNSUPPORTED, "output datatype has no numpy equivalent");
    } else if (o->owned == NULL) {
      arr = PyArray_SimpleNew((int)o->ndim, dims, typenum);
      size_t n = arr != NULL ? (size_t)PyArray_NBYTES((PyArrayObject*)arr) : 0;
      if (n) memcpy(PyArray_DATA((PyArrayObject*)arr), o->data, n < o->size ? n : o->size);
    } else {
      arr = array_owning((int)o->ndim, dims, typenum, o->owned);
      if (arr != NULL) o->owned = NULL; /* the array's now */
    }
    if (arr == NULL || dict_set_name(result, o->name, arr) < 0) Py_CLEAR(result);
    Py_XDECREF(arr);
  }
  return result;
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
      return raise_triton(TRITONSERVER_ERROR_UNSUPPORTED,
                          "output datatype has no numpy equivalent");
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
      Ticket* ticket = (Ticket*)userp;
      arr = array_owning((int)ndim, dims, typenum, ticket->block);
      if (arr != NULL) ticket->taken = 1;
    } else { /* e.g. a response from the cache with foreign memory: copy */
      arr = PyArray_SimpleNew((int)ndim, dims, typenum);
      if (arr) memcpy(PyArray_DATA((PyArrayObject*)arr), base, size);
    }
  have:
    if (arr == NULL || dict_set_name(result, name, arr) < 0) {
      Py_XDECREF(arr);
      Py_DECREF(result);
      return NULL;
    }
    Py_DECREF(arr);
  }
  return result;
}
