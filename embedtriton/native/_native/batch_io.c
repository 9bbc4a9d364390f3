/* A batch's data on the model side: each request's inputs (views of Triton's
 * buffers, no copy), parameters and sequence controls handed to Python, and the
 * outputs Python returns checked against the model's config and copied into
 * Triton's responses. */
#include "batch_io.h"

#include "cuda.h"
#include "device_array.h"
#include "memory.h"
#include "outputs.h"
#include "threads.h"

#include <stdio.h>

/* With the GIL: a request's parameters as a dict (NULL with *err or an exception). */
PyObject* read_parameters(TRITONBACKEND_Request* request, TRITONSERVER_Error** err)
{
  PyObject* params = PyDict_New();
  if (params == NULL) return NULL;
  uint32_t n_params = 0;
  if ((*err = api.TRITONBACKEND_RequestParameterCount(request, &n_params))) goto fail;
  for (uint32_t i = 0; i < n_params; i++) {
    const char* key;
    TRITONSERVER_ParameterType type;
    const void* v;
    if ((*err = api.TRITONBACKEND_RequestParameter(request, i, &key, &type, &v))) goto fail;
    PyObject* value = NULL;
    switch (type) {
      case TRITONSERVER_PARAMETER_STRING: value = PyUnicode_FromString((const char*)v); break;
      case TRITONSERVER_PARAMETER_INT: value = PyLong_FromLongLong(*(const int64_t*)v); break;
      case TRITONSERVER_PARAMETER_BOOL: value = PyBool_FromLong(*(const bool*)v); break;
      case TRITONSERVER_PARAMETER_DOUBLE: value = PyFloat_FromDouble(*(const double*)v); break;
      default: continue;
    }
    if (value == NULL || PyDict_SetItemString(params, key, value) < 0) {
      Py_XDECREF(value);
      goto fail;
    }
    Py_DECREF(value);
  }
  return params;
fail:
  Py_DECREF(params);
  return NULL;
}

/* Whether the model asked for input `name` on the GPU (Tensor(..., device="gpu")). */
int input_wants_gpu(ModelState* ms, const char* name)
{
  for (Py_ssize_t i = 0; i < ms->n_gpu_inputs; i++)
    if (strcmp(ms->gpu_inputs[i], name) == 0) return 1;
  return 0;
}

/* Copy an input's buffers, one after the other, into dst (device memory if dst_gpu) of
 * byte_size bytes; Triton's sizes are checked against it. */
TRITONSERVER_Error* gather_input(TRITONBACKEND_Input* input, const char* name, uint32_t n_buffers,
                                 char* dst, uint64_t byte_size, int dst_gpu)
{
  uint64_t offset = 0;
  for (uint32_t b = 0; b < n_buffers; b++) {
    const void* data = NULL;
    uint64_t size = 0;
    TRITONSERVER_MemoryType mtype = TRITONSERVER_MEMORY_CPU;
    int64_t mtype_id = 0;
    TRITONSERVER_Error* err =
        api.TRITONBACKEND_InputBuffer(input, b, &data, &size, &mtype, &mtype_id);
    if (err != NULL) return err;
    if (offset + size > byte_size)
      return new_error(TRITONSERVER_ERROR_INTERNAL, "input '%s' arrived with inconsistent sizes",
                       name);
    const char* why = NULL;
    if (mtype == TRITONSERVER_MEMORY_GPU || dst_gpu) why = cuda_copy(dst + offset, data, size);
    else memcpy(dst + offset, data, size);
    if (why != NULL)
      return new_error(TRITONSERVER_ERROR_INTERNAL, "cannot copy input '%s': %s", name, why);
    offset += size;
  }
  return NULL;
}

/* With the GIL: a read-only view of one host buffer holding an input (no copy). */
PyObject* host_view(const void* data, TRITONSERVER_DataType dtype, int typenum, int ndim,
                    npy_intp* dims)
{
  int flags = NPY_ARRAY_C_CONTIGUOUS;
  if (((uintptr_t)data % dtype_size(dtype)) == 0) flags |= NPY_ARRAY_ALIGNED;
  return PyArray_New(&PyArray_Type, ndim, dims, typenum, NULL, (void*)data, 0, flags, NULL);
}

/* With the GIL: an input's buffers copied into a new array (NULL with *err or an exception). */
PyObject* host_copy(TRITONBACKEND_Input* input, const char* name, uint32_t n_buffers, int typenum,
                    int ndim, npy_intp* dims, TRITONSERVER_Error** err)
{
  PyObject* arr = PyArray_SimpleNew(ndim, dims, typenum);
  if (arr != NULL &&
      (*err = gather_input(input, name, n_buffers, PyArray_DATA((PyArrayObject*)arr),
                           (uint64_t)PyArray_NBYTES((PyArrayObject*)arr), 0)) != NULL)
    Py_CLEAR(arr);
  return arr;
}

/* With the GIL: an input for the callable in GPU memory, as the model's gpu_arrays asks
 * (cupy, torch or the DeviceArray itself). A single GPU buffer is handed over as it is (for
 * a one-request batch, the caller's own memory), its request held while the callable keeps a
 * view; host data (Tensor(device="gpu")) and several buffers are gathered into a new block. */
static PyObject* gpu_input(TRITONBACKEND_Request* request, ModelState* ms,
                           TRITONBACKEND_Input* input, const char* name,
                           TRITONSERVER_DataType dtype, const int64_t* shape, uint32_t ndim,
                           uint64_t byte_size, uint32_t n_buffers, const void* data, uint64_t size,
                           TRITONSERVER_MemoryType mtype, int64_t mtype_id, int device,
                           PyObject** views, Py_ssize_t* n_views, PyObject** hold,
                           TRITONSERVER_Error** err)
{
  PyObject* dev;
  if (n_buffers == 1 && mtype == TRITONSERVER_MEMORY_GPU && ms->iterate == NULL) {
    if (*hold == NULL) { /* the batch's list of views owns it */
      if ((*hold = hold_new(request)) == NULL) return NULL;
      views[(*n_views)++] = *hold;
    }
    dev = device_array_new((void*)data, size, (int)ndim, shape, dtype, (int)mtype_id, 0, *hold);
  } else { /* (an iterative model keeps its inputs across iterations: its own copy) */
    int target = mtype == TRITONSERVER_MEMORY_GPU ? (int)mtype_id : device;
    dev = device_array_alloc(byte_size, (int)ndim, shape, dtype, target);
    if (dev != NULL &&
        (*err = gather_input(input, name, n_buffers, device_array_ptr(dev), byte_size, 1))) {
      Py_DECREF(dev);
      return NULL;
    }
  }
  if (dev == NULL || ms->gpu_wrap == NULL) return dev;
  PyObject* arr = PyObject_CallOneArg(ms->gpu_wrap, dev);
  Py_DECREF(dev);
  return arr;
}

/* A sequence-batcher control input (int32 0/1) of a request as its Request attribute
 * (sequence_start, _end, _ready). 0, or -1 with *err or a Python error. */
static int control_input(PyObject* req, TRITONBACKEND_Input* input, const char* name,
                         TRITONSERVER_Error** err)
{
  const void* data = NULL;
  uint64_t size = 0;
  TRITONSERVER_MemoryType mtype = TRITONSERVER_MEMORY_CPU;
  int64_t mtype_id = 0;
  if ((*err = api.TRITONBACKEND_InputBuffer(input, 0, &data, &size, &mtype, &mtype_id))) return -1;
  int32_t flag = size >= 4 ? *(const int32_t*)data : 0;
  const char* attr = name + sizeof CONTROL_PREFIX - 1; /* start, end, ready */
  char full[32];
  snprintf(full, sizeof full, "sequence_%s", attr);
  return PyObject_SetAttrString(req, full, flag ? Py_True : Py_False) < 0 ? -1 : 0;
}

/* A BYTES input (or one of a datatype numpy cannot hold): gathered, then decoded (g_decode_bytes).
 * NULL with *err or a Python error. */
static PyObject* bytes_input(TRITONBACKEND_Input* input, const char* name,
                             TRITONSERVER_DataType dtype, const int64_t* shape, uint32_t ndim,
                             uint32_t n_buffers, uint64_t byte_size, TRITONSERVER_Error** err)
{
  PyObject* arr;
  char* gathered = malloc(byte_size ? byte_size : 1);
  if ((*err = gather_input(input, name, n_buffers, gathered, byte_size, 0))) {
    free(gathered);
    return NULL;
  }
  uint64_t offset = byte_size;
  if (dtype == TRITONSERVER_TYPE_BYTES) {
    PyObject* shape_t = PyTuple_New(ndim);
    for (uint32_t d = 0; shape_t && d < ndim; d++)
      PyTuple_SET_ITEM(shape_t, d, PyLong_FromLongLong(shape[d]));
    PyObject* raw = PyBytes_FromStringAndSize(gathered, (Py_ssize_t)offset);
    arr =
        (shape_t && raw) ? PyObject_CallFunctionObjArgs(g_decode_bytes, raw, shape_t, NULL) : NULL;
    Py_XDECREF(raw);
    Py_XDECREF(shape_t);
    free(gathered);
  } else {
    free(gathered);
    *err =
        new_error(TRITONSERVER_ERROR_UNSUPPORTED,
                  "input '%s' has datatype %s, which numpy cannot hold", name, dtype_name(dtype));
    return NULL;
  }
  return arr;
}

/* A sequence's correlation id (an int, or a str) as the Request's correlation_id (None when Triton
 * has neither). 0, or -1 with a Python error. */
static int set_correlation_id(PyObject* req, TRITONBACKEND_Request* request)
{
  uint64_t number = 0;
  const char* text = NULL;
  PyObject* id = NULL;
  TRITONSERVER_Error* e = api.TRITONBACKEND_RequestCorrelationId(request, &number);
  if (e == NULL) {
    id = PyLong_FromUnsignedLongLong(number);
  } else {
    api.TRITONSERVER_ErrorDelete(e);
    e = api.TRITONBACKEND_RequestCorrelationIdString(request, &text);
    if (e == NULL) id = PyUnicode_FromString(text ? text : "");
    else api.TRITONSERVER_ErrorDelete(e), id = Py_NewRef(Py_None);
  }
  int rc = id ? PyObject_SetAttrString(req, "correlation_id", id) : -1;
  Py_XDECREF(id);
  return rc < 0 ? -1 : 0;
}

/* With the GIL: the inputs of one request as a Request (a dict subclass).
 * Views of Triton's buffers are appended to views[] (new references). */
PyObject* build_request(TRITONBACKEND_Request* request, ModelState* ms, int device,
                        PyObject** views, Py_ssize_t* n_views, uint64_t* batch_size,
                        TRITONSERVER_Error** err)
{
  PyObject* hold = NULL; /* (borrowed: views owns it) */
  PyObject* req = PyObject_CallNoArgs(g_request_type);
  PyObject* params = NULL;
  if (req == NULL) goto py_fail;
  uint32_t n_inputs = 0;
  if ((*err = api.TRITONBACKEND_RequestInputCount(request, &n_inputs))) goto fail;
  *batch_size = 1;
  for (uint32_t i = 0; i < n_inputs; i++) {
    TRITONBACKEND_Input* input;
    const char* name;
    TRITONSERVER_DataType dtype;
    const int64_t* shape;
    uint32_t ndim, n_buffers;
    uint64_t byte_size;
    if ((*err = api.TRITONBACKEND_RequestInputByIndex(request, i, &input)) ||
        (*err = api.TRITONBACKEND_InputProperties(input, &name, &dtype, &shape, &ndim, &byte_size,
                                                  &n_buffers)))
      goto fail;
    if (ndim > MAX_DIMS) {
      *err = new_error(TRITONSERVER_ERROR_INVALID_ARG, "input '%s' has too many dimensions", name);
      goto fail;
    }
    if (ms->sequence && strncmp(name, CONTROL_PREFIX, sizeof CONTROL_PREFIX - 1) == 0) {
      if (control_input(req, input, name, err) < 0) goto failed;
      continue;
    }
    if (ms->max_batch_size > 0 && ndim > 0) *batch_size = (uint64_t)shape[0];
    if (ms->max_batch_size > 0 &&
        (ndim == 0 || shape[0] == 0)) { /* Triton passes these on, shapeless */
      *err = new_error(TRITONSERVER_ERROR_INVALID_ARG,
                       "input '%s' has batch size 0 for model '%s'; send at least one row", name,
                       ms->name);
      goto fail;
    }
    npy_intp dims[MAX_DIMS];
    for (uint32_t d = 0; d < ndim; d++) dims[d] = (npy_intp)shape[d];
    const void* data = NULL;
    uint64_t size = 0;
    TRITONSERVER_MemoryType mtype = TRITONSERVER_MEMORY_CPU;
    int64_t mtype_id = 0;
    if (n_buffers == 1 &&
        (*err = api.TRITONBACKEND_InputBuffer(input, 0, &data, &size, &mtype, &mtype_id)))
      goto fail;
    PyObject* arr;
    int typenum = numpy_typenum_of(dtype);
    int gpu = dtype != TRITONSERVER_TYPE_BYTES &&
              (mtype == TRITONSERVER_MEMORY_GPU || input_wants_gpu(ms, name));
    for (uint32_t b = 0; !gpu && n_buffers > 1 && dtype != TRITONSERVER_TYPE_BYTES && b < n_buffers;
         b++) { /* a batch gathered from several buffers stays on the GPU if any part is there */
      TRITONSERVER_MemoryType m = TRITONSERVER_MEMORY_CPU;
      if ((*err = api.TRITONBACKEND_InputBuffer(input, b, &data, &size, &m, &mtype_id))) goto fail;
      gpu = m == TRITONSERVER_MEMORY_GPU;
    }
    if (gpu) {
      arr = gpu_input(request, ms, input, name, dtype, shape, ndim, byte_size, n_buffers, data,
                      size, mtype, mtype_id, device, views, n_views, &hold, err);
      if (arr == NULL) goto failed;
    } else if (n_buffers == 1 && mtype != TRITONSERVER_MEMORY_GPU &&
               dtype != TRITONSERVER_TYPE_BYTES && typenum >= 0) {
      /* one host buffer: a read-only view, no copy */
      if ((arr = host_view(data, dtype, typenum, (int)ndim, dims)) == NULL) goto py_fail;
      views[(*n_views)++] = Py_NewRef(arr);
    } else if (dtype != TRITONSERVER_TYPE_BYTES && typenum >= 0) {
      /* several buffers: one contiguous copy */
      if ((arr = host_copy(input, name, n_buffers, typenum, (int)ndim, dims, err)) == NULL)
        goto failed;
    } else if ((arr = bytes_input(input, name, dtype, shape, ndim, n_buffers, byte_size, err)) ==
               NULL) {
      goto failed;
    }
    int rc = dict_set_name(req, name, arr);
    Py_DECREF(arr);
    if (rc < 0) goto py_fail;
  }
  params = read_parameters(request, err);
  if (params == NULL) goto failed;
  if (PyObject_SetAttr(req, s_parameters, params) < 0) goto py_fail;
  if (ms->sequence && set_correlation_id(req, request) < 0) goto py_fail;
  Py_DECREF(params);
  return req;
failed: /* (*err, or else a Python error) */
  if (*err != NULL) goto fail;
py_fail:
  *err = error_from_python("cannot hand the request to Python");
fail:
  Py_XDECREF(req);
  Py_XDECREF(params);
  return NULL;
}

/* An output's shape (ndim extents) against its spec: NULL, or the error that says so. */
static TRITONSERVER_Error* check_shape(ModelState* ms, OutputSpec* o, int ndim, const int64_t* dims,
                                       uint64_t batch_size, size_t index)
{
  int batched = ms->max_batch_size > 0;
  int ok = ndim == o->ndims + batched && ndim <= MAX_DIMS;
  if (ok && batched) ok = (uint64_t)dims[0] == batch_size;
  for (int d = 0; ok && d < o->ndims; d++) ok = o->dims[d] < 0 || o->dims[d] == dims[d + batched];
  if (ok) return NULL;
  char want[256], have[256];
  int w = snprintf(want, sizeof want, "(%s", batched ? "batch" : "");
  for (int d = 0; d < o->ndims && w < 200; d++)
    w += snprintf(want + w, sizeof want - w, "%s%lld", (d || batched) ? ", " : "",
                  (long long)o->dims[d]);
  snprintf(want + w, sizeof want - w, ")");
  int h = snprintf(have, sizeof have, "(");
  for (int d = 0; d < ndim && d < MAX_DIMS && h < 200; d++)
    h += snprintf(have + h, sizeof have - h, "%s%lld", d ? ", " : "", (long long)dims[d]);
  snprintf(have + h, sizeof have - h, ")");
  return new_error(TRITONSERVER_ERROR_INTERNAL,
                   "model '%s' returned output '%s' with shape %s for request %zu; "
                   "expected %s%s with batch = %llu",
                   ms->name, o->name, have, index, want, batched ? "" : " (no batch axis)",
                   (unsigned long long)batch_size);
}

/* With the GIL: check one returned host output against its spec. Returns a
 * C-contiguous array (new reference) or NULL with *err set. */
static PyArrayObject* check_output(ModelState* ms, OutputSpec* o, PyObject* value,
                                   uint64_t batch_size, size_t index, TRITONSERVER_Error** err)
{
  /* NOTSWAPPED: a non-native byte order (x.astype(">i8")) is converted, never reinterpreted.
   * An array that is already C-contiguous, aligned and native is taken as it is (numpy's
   * conversion would discover its dtype and shape again: most of an output's cost). */
  PyArrayObject* arr =
      PyArray_Check(value) && PyArray_ISCARRAY_RO((PyArrayObject*)value) &&
              PyArray_ISNOTSWAPPED((PyArrayObject*)value)
          ? (PyArrayObject*)Py_NewRef(value)
          : (PyArrayObject*)PyArray_FROM_OF(value, NPY_ARRAY_CARRAY_RO | NPY_ARRAY_NOTSWAPPED);
  if (arr == NULL) {
    *err = error_from_python("output is not an array");
    return NULL;
  }
  TRITONSERVER_DataType got = triton_dtype_of(arr);
  if (got != o->dtype) {
    PyObject* d = PyObject_Str((PyObject*)PyArray_DESCR(arr));
    *err =
        new_error(TRITONSERVER_ERROR_INTERNAL,
                  "model '%s' returned output '%s' as %s (%s) for request %zu; its config says %s "
                  "(%s): return it .astype(np.%s) or declare the output Tensor(dtype=np.%s)",
                  ms->name, o->name, d ? PyUnicode_AsUTF8(d) : "?", dtype_name(got), index,
                  dtype_name(o->dtype), numpy_dtype_name(o->dtype), numpy_dtype_name(o->dtype),
                  numpy_dtype_name(got));
    Py_XDECREF(d);
    Py_DECREF(arr);
    return NULL;
  }
  int ndim = PyArray_NDIM(arr);
  int64_t dims[MAX_DIMS];
  for (int d = 0; d < ndim && d < MAX_DIMS; d++) dims[d] = PyArray_DIM(arr, d);
  if ((*err = check_shape(ms, o, ndim, dims, batch_size, index)) != NULL) {
    Py_DECREF(arr);
    return NULL;
  }
  return arr;
}

/* With the GIL: check one returned GPU output (g) against its spec; NULL or the error. */
static TRITONSERVER_Error* check_gpu_output(ModelState* ms, OutputSpec* o, GpuValue* g,
                                            uint64_t batch_size, size_t index)
{
  if (g->dtype != o->dtype)
    return new_error(
        TRITONSERVER_ERROR_INTERNAL,
        "model '%s' returned output '%s' as %s (%s) for request %zu; its config says %s "
        "(%s): convert it to %s or declare the output Tensor(dtype=np.%s)",
        ms->name, o->name, numpy_dtype_name(g->dtype), dtype_name(g->dtype), index,
        dtype_name(o->dtype), numpy_dtype_name(o->dtype), numpy_dtype_name(o->dtype),
        numpy_dtype_name(g->dtype));
  return check_shape(ms, o, g->ndim, g->shape, batch_size, index);
}

/* Every output the callable returned must be declared (a misspelt name is not dropped): the
 * error for the first one that is not, or NULL. */
static TRITONSERVER_Error* undeclared_output(ModelState* ms, PyObject* out, size_t index)
{
  TRITONSERVER_Error* err = NULL;
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (PyDict_Next(out, &pos, &key, &value)) {
    int declared = 0;
    for (Py_ssize_t k = 0; k < ms->n_outputs && !declared; k++)
      declared = key == ms->outputs[k].name_obj ||
                 (PyUnicode_Check(key) && PyUnicode_Compare(key, ms->outputs[k].name_obj) == 0);
    if (!declared) {
      PyObject* text = PyObject_Repr(key);
      PyErr_Clear();
      err = new_error(TRITONSERVER_ERROR_INTERNAL,
                      "model '%s' returned output %s for request %zu, which its outputs do not "
                      "declare; declare it with a Tensor in bind(outputs=...) or stop returning it",
                      ms->name, text ? PyUnicode_AsUTF8(text) : "?", index);
      Py_XDECREF(text);
      return err;
    }
  }
  return NULL;
}

/* The output `name` of a response: value (declared as o) checked and copied into the buffer Triton
 * gives, on the GPU when it is there or the model wants it there. Returns the error, or NULL. */
static TRITONSERVER_Error* write_output(ModelState* ms, TRITONBACKEND_Response* response,
                                        const char* name, OutputSpec* o, PyObject* value,
                                        uint64_t batch_size, size_t index)
{
  TRITONSERVER_Error* err = NULL;
  /* a GPU array (cupy, torch, ...) is copied device to device; a host one through numpy */
  GpuValue g = {0};
  int on_gpu = gpu_value(value, &g, name, &err);
  if (on_gpu < 0) return err;
  PyArrayObject* arr = NULL;
  PyObject* bytes = NULL;
  const void* data;
  size_t nbytes;
  int64_t shape[MAX_DIMS];
  int ndim;
  if (on_gpu) {
    if ((err = check_gpu_output(ms, o, &g, batch_size, index)) != NULL) {
      gpu_value_done(&g);
      return err;
    }
    data = g.data, nbytes = g.nbytes, ndim = g.ndim;
    memcpy(shape, g.shape, sizeof(int64_t) * (size_t)ndim);
  } else {
    arr = check_output(ms, o, value, batch_size, index, &err);
    if (arr == NULL) return err;
    data = PyArray_DATA(arr);
    nbytes = (size_t)PyArray_NBYTES(arr);
    if (o->dtype == TRITONSERVER_TYPE_BYTES) {
      bytes = PyObject_CallOneArg(g_encode_bytes, (PyObject*)arr);
      if (bytes == NULL) {
        Py_DECREF(arr);
        err = error_from_python("cannot serialize a BYTES output");
        return err;
      }
      data = PyBytes_AS_STRING(bytes);
      nbytes = (size_t)PyBytes_GET_SIZE(bytes);
    }
    ndim = PyArray_NDIM(arr);
    for (int d = 0; d < ndim; d++) shape[d] = PyArray_DIM(arr, d);
  }
  TRITONBACKEND_Output* output;
  void* buffer;
  /* where the data is (or where the model wants it) is where we ask Triton for the buffer:
   * an ensemble's next step then gets it there; our caller-side allocator decides by the
   * caller's output_device */
  int prefer_gpu = on_gpu || (o->gpu && o->dtype != TRITONSERVER_TYPE_BYTES && cuda_ready());
  TRITONSERVER_MemoryType mtype = prefer_gpu ? TRITONSERVER_MEMORY_GPU : TRITONSERVER_MEMORY_CPU;
  int64_t mtype_id = on_gpu ? g.device : 0;
  err = api.TRITONBACKEND_ResponseOutput(response, &output, name, o->dtype, shape, (uint32_t)ndim);
  if (err == NULL) err = api.TRITONBACKEND_OutputBuffer(output, &buffer, nbytes, &mtype, &mtype_id);
  if (err == NULL && nbytes) {
    if (on_gpu || mtype == TRITONSERVER_MEMORY_GPU) { /* one copy, whichever way */
      const char* why = cuda_copy(buffer, data, nbytes);
      if (why != NULL)
        err = new_error(TRITONSERVER_ERROR_INTERNAL, "cannot copy output '%s' of model '%s': %s",
                        name, ms->name, why);
    } else {
      memcpy(buffer, data, nbytes);
    }
  }
  if (on_gpu) gpu_value_done(&g);
  Py_XDECREF(bytes);
  Py_XDECREF(arr);
  return err;
}

/* With the GIL: build request i's response from out (a dict), outputs copied
 * in. Returns the response to send (NULL if none could be made) and sets
 * *error when the request failed. */
TRITONSERVER_Error* fill_response(ModelState* ms, TRITONBACKEND_Request* request,
                                  TRITONBACKEND_Response* response, PyObject* out,
                                  uint64_t batch_size, size_t index)
{
  TRITONSERVER_Error* err = NULL;
  /* a padding request: Triton drops its response */
  if (ms->sequence && out == Py_None) return NULL;
  if (!PyDict_Check(out)) {
    err = new_error(TRITONSERVER_ERROR_INTERNAL,
                    "model '%s' must return one dict of outputs per request; "
                    "got %s for request %zu",
                    ms->name, Py_TYPE(out)->tp_name, index);
    goto send;
  }
  if ((err = undeclared_output(ms, out, index))) goto send;
  uint32_t n_requested = 0;
  if ((err = api.TRITONBACKEND_RequestOutputCount(request, &n_requested))) goto send;
  for (uint32_t r = 0; r < n_requested; r++) {
    const char* name;
    if ((err = api.TRITONBACKEND_RequestOutputName(request, r, &name))) goto send;
    OutputSpec* o = NULL;
    for (Py_ssize_t k = 0; k < ms->n_outputs; k++)
      if (strcmp(ms->outputs[k].name, name) == 0) o = &ms->outputs[k];
    PyObject* value = o ? PyDict_GetItemWithError(out, o->name_obj) : NULL;
    if (value == NULL) {
      PyErr_Clear();
      PyObject* keys = PyDict_Keys(out);
      PyObject* text = keys ? PyObject_Repr(keys) : NULL;
      err = new_error(TRITONSERVER_ERROR_INTERNAL,
                      "model '%s' returned no output '%s' for request %zu (it returned %s)",
                      ms->name, name, index, text ? PyUnicode_AsUTF8(text) : "?");
      Py_XDECREF(text);
      Py_XDECREF(keys);
      goto send;
    }
    if ((err = write_output(ms, response, name, o, value, batch_size, index))) goto send;
  }
send:
  return err;
}

TRITONBACKEND_Response* respond(ModelState* ms, TRITONBACKEND_Request* request, PyObject* out,
                                uint64_t batch_size, size_t index, TRITONSERVER_Error** error)
{
  TRITONBACKEND_Response* response = NULL;
  *error = api.TRITONBACKEND_ResponseNew(&response, request);
  if (*error != NULL) return NULL;
  /* the caller sends the error, reports it in the statistics and deletes it */
  *error = fill_response(ms, request, response, out, batch_size, index);
  return response;
}

__thread ModelState* t_warmup;

/* With the GIL: a failed warm-up request, recorded on the binding (the first one only). */
static void record_warmup_failure(ModelState* ms, TRITONSERVER_Error* err)
{
  int expected = 0;
  if (!atomic_compare_exchange_strong(&ms->warmup_failed, &expected, 1)) return;
  PyObject* message = PyUnicode_FromString(api.TRITONSERVER_ErrorMessage(err));
  if (message == NULL || PyObject_SetAttrString(ms->binding, "warmup_error", message) < 0)
    PyErr_WriteUnraisable(ms->binding);
  Py_XDECREF(message);
}

void send_final(TRITONBACKEND_Response* response, TRITONSERVER_Error* err)
{
  if (err != NULL && t_warmup != NULL) { /* see ModelState.warmup_left */
    int entered = gil_enter();
    record_warmup_failure(t_warmup, err);
    gil_leave(entered);
    err = NULL;
  }
  t_sending = 1; /* (its request or factory is still held: see keep_outputs) */
  TRITONSERVER_Error* send_err =
      api.TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, err);
  t_sending = 0;
  if (send_err != NULL) {
    api.TRITONSERVER_ErrorDelete(send_err);
    api.TRITONBACKEND_ResponseDelete(response);
  }
}

/* An input view that the callable kept a reference to must outlive Triton's
 * buffer: give it its own copy of the data before the request is released. */
void detach_view(PyArrayObject* arr)
{
  if (Py_REFCNT(arr) <= 1) return;
  size_t n = (size_t)PyArray_NBYTES(arr);
  void* copy = malloc(n ? n : 1);
  PyObject* owner = copy ? PyCapsule_New(copy, "embedtriton.block", NULL) : NULL;
  if (owner == NULL) {
    free(copy);
    PyErr_Clear();
    return;
  }
  memcpy(copy, PyArray_DATA(arr), n);
  PyCapsule_SetPointer(owner, copy);
  PyCapsule_SetDestructor(owner, (PyCapsule_Destructor)NULL);
  /* free through the capsule destructor: */
  PyCapsule_SetDestructor(owner, free_block_capsule);
  ((PyArrayObject_fields*)arr)->data = copy;
  if (PyArray_SetBaseObject(arr, owner) < 0) PyErr_Clear();
}
