/* A finished call's outputs for its caller: Triton's response read into numpy arrays,
 * DeviceArrays or the caller's own buffers (call_collect, collect_response). */
#include "native.h"

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
    if (arr == NULL || dict_set_name(result, name, arr) < 0) {
      Py_XDECREF(arr);
      Py_DECREF(result);
      return NULL;
    }
    Py_DECREF(arr);
  }
  return result;
}
