/* A plain @batch function called straight from Triton's buffers: no Request objects, no
 * Python wrapper. One request's inputs are read-only views (as on the general path); several
 * requests' inputs are concatenated here into one array per input; the batched outputs are cut
 * back into one dict of views per request here (numpy arrays) or by the wrapper's own
 * split_outputs (anything else). The general path (build_request, binding.execute and
 * embedtriton/backend/batch.py) defines what this does: a batch that needs anything more
 * (BYTES, GPU memory, requests with different inputs or shapes, tracing, deadlines) takes it,
 * declined here before the function runs. */
#include "fast_batch.h"

#include "batch_io.h"

#define FAST_MAX_INPUTS 16

typedef struct {
  const char* name;
  TRITONSERVER_DataType dtype;
  int typenum;
  const int64_t* shape;
  uint32_t ndim, n_buffers;
  uint64_t byte_size;
  TRITONBACKEND_Input* input;
  const void* data; /* its first buffer */
} FastInput;

/* With the GIL: read binding.fast_batch into the model state (0), or -1 with an exception. */
int fast_batch_init(ModelState* ms, PyObject* binding)
{
  PyObject* fast = PyObject_GetAttrString(binding, "fast_batch");
  if (fast == NULL || fast == Py_None) {
    Py_XDECREF(fast);
    PyErr_Clear();
    return 0;
  }
  PyObject *func, *failed, *split;
  const char *span, *deadline;
  int parameters;
  if (!PyArg_ParseTuple(fast, "OpOO(ss)", &func, &parameters, &failed, &split, &span, &deadline))
    goto fail;
  ms->fast_func = Py_NewRef(func);
  ms->fast_parameters = parameters;
  ms->fast_failed = Py_NewRef(failed);
  ms->fast_split = Py_NewRef(split);
  ms->fast_declines[0] = strdup(span);
  ms->fast_declines[1] = strdup(deadline);
  Py_DECREF(fast);
  return 0;
fail:
  Py_DECREF(fast);
  return -1;
}

void fast_batch_free(ModelState* ms)
{
  Py_XDECREF(ms->fast_func);
  Py_XDECREF(ms->fast_failed);
  Py_XDECREF(ms->fast_split);
  free(ms->fast_declines[0]);
  free(ms->fast_declines[1]);
}

/* Whether a request carries a parameter that the general path reads (a traced request's span
 * key, a deadline): its batch goes that way. */
static int needs_general_path(ModelState* ms, TRITONBACKEND_Request* request)
{
  uint32_t n = 0;
  TRITONSERVER_Error* e = api.TRITONBACKEND_RequestParameterCount(request, &n);
  for (uint32_t i = 0; e == NULL && i < n; i++) {
    const char* key;
    TRITONSERVER_ParameterType type;
    const void* value;
    if ((e = api.TRITONBACKEND_RequestParameter(request, i, &key, &type, &value)) != NULL) break;
    if (strcmp(key, ms->fast_declines[0]) == 0 || strcmp(key, ms->fast_declines[1]) == 0) return 1;
  }
  if (e != NULL) api.TRITONSERVER_ErrorDelete(e);
  return e != NULL;
}

/* Whether every buffer of an input is in host memory. */
static int host_buffers(FastInput* in)
{
  for (uint32_t b = 0; b < in->n_buffers; b++) {
    const void* data = NULL;
    uint64_t size = 0;
    TRITONSERVER_MemoryType mtype = TRITONSERVER_MEMORY_CPU;
    int64_t mtype_id = 0;
    TRITONSERVER_Error* e =
        api.TRITONBACKEND_InputBuffer(in->input, b, &data, &size, &mtype, &mtype_id);
    if (e != NULL) {
      api.TRITONSERVER_ErrorDelete(e);
      return 0;
    }
    if (mtype == TRITONSERVER_MEMORY_GPU) return 0;
    if (b == 0) in->data = data;
  }
  return 1;
}

/* One input of a request, if this path can take it (1), or not (0). */
static int read_input(ModelState* ms, TRITONBACKEND_Input* input, FastInput* in)
{
  in->input = input;
  in->data = NULL;
  TRITONSERVER_Error* e = api.TRITONBACKEND_InputProperties(
      input, &in->name, &in->dtype, &in->shape, &in->ndim, &in->byte_size, &in->n_buffers);
  if (e != NULL) {
    api.TRITONSERVER_ErrorDelete(e);
    return 0;
  }
  in->typenum = numpy_typenum_of(in->dtype);
  if (in->dtype == TRITONSERVER_TYPE_BYTES || in->typenum < 0 || in->ndim > MAX_DIMS) return 0;
  if (ms->max_batch_size > 0 && (in->ndim == 0 || in->shape[0] == 0)) return 0;
  if (input_wants_gpu(ms, in->name)) return 0;
  return host_buffers(in);
}

/* The inputs of every request, checked to be the same names, dtypes and shapes (but for the
 * batch axis) as the first request's: n_in, or 0 when the batch takes the general path. */
static uint32_t read_inputs(ModelState* ms, TRITONBACKEND_Request** requests, uint32_t count,
                            FastInput* first, FastInput* other)
{
  uint32_t n_in = 0;
  TRITONSERVER_Error* e = api.TRITONBACKEND_RequestInputCount(requests[0], &n_in);
  if (e != NULL || n_in == 0 || n_in > FAST_MAX_INPUTS) {
    if (e != NULL) api.TRITONSERVER_ErrorDelete(e);
    return 0;
  }
  for (uint32_t i = 0; i < n_in; i++) {
    TRITONBACKEND_Input* input;
    if ((e = api.TRITONBACKEND_RequestInputByIndex(requests[0], i, &input)) != NULL) break;
    if (!read_input(ms, input, &first[i])) return 0;
  }
  for (uint32_t r = 1; e == NULL && r < count; r++) {
    uint32_t n = 0;
    if ((e = api.TRITONBACKEND_RequestInputCount(requests[r], &n)) != NULL || n != n_in) break;
    for (uint32_t i = 0; i < n_in; i++) {
      TRITONBACKEND_Input* input;
      FastInput* in = &other[r * FAST_MAX_INPUTS + i];
      if ((e = api.TRITONBACKEND_RequestInput(requests[r], first[i].name, &input)) != NULL) break;
      if (!read_input(ms, input, in) || in->dtype != first[i].dtype || in->ndim != first[i].ndim)
        return 0;
      for (uint32_t d = 1; d < in->ndim; d++)
        if (in->shape[d] != first[i].shape[d]) return 0;
    }
  }
  if (e != NULL) {
    api.TRITONSERVER_ErrorDelete(e);
    return 0;
  }
  return n_in;
}

/* With the GIL: the request's rows (the batch size the general path reads: the last input's). */
static uint64_t rows_of(ModelState* ms, FastInput* inputs, uint32_t n_in)
{
  uint64_t rows = 1;
  for (uint32_t i = 0; i < n_in; i++)
    if (ms->max_batch_size > 0 && inputs[i].ndim > 0) rows = (uint64_t)inputs[i].shape[0];
  return rows;
}

/* With the GIL: one request's input as the function gets it: a read-only view of its one
 * host buffer, or a copy of its buffers. */
static PyObject* one_input(FastInput* in, PyObject** views, Py_ssize_t* n_views,
                           TRITONSERVER_Error** err)
{
  npy_intp dims[MAX_DIMS];
  for (uint32_t d = 0; d < in->ndim; d++) dims[d] = (npy_intp)in->shape[d];
  if (in->n_buffers != 1)
    return host_copy(in->input, in->name, in->n_buffers, in->typenum, (int)in->ndim, dims, err);
  /* (its buffer, read by host_buffers) */
  PyObject* arr = host_view(in->data, in->dtype, in->typenum, (int)in->ndim, dims);
  if (arr != NULL) views[(*n_views)++] = Py_NewRef(arr);
  return arr;
}

/* With the GIL: input i of every request, joined along the batch axis into a new array. */
static PyObject* joined_input(FastInput* first, FastInput* other, uint32_t count, uint32_t i,
                              TRITONSERVER_Error** err)
{
  npy_intp dims[MAX_DIMS];
  dims[0] = 0;
  for (uint32_t r = 0; r < count; r++)
    dims[0] += (npy_intp)(r == 0 ? first[i] : other[r * FAST_MAX_INPUTS + i]).shape[0];
  for (uint32_t d = 1; d < first[i].ndim; d++) dims[d] = (npy_intp)first[i].shape[d];
  PyObject* arr = PyArray_SimpleNew((int)first[i].ndim, dims, first[i].typenum);
  if (arr == NULL) return NULL;
  char* dst = PyArray_DATA((PyArrayObject*)arr);
  uint64_t total = (uint64_t)PyArray_NBYTES((PyArrayObject*)arr), offset = 0;
  for (uint32_t r = 0; r < count; r++) {
    FastInput* in = r == 0 ? &first[i] : &other[r * FAST_MAX_INPUTS + i];
    if (offset + in->byte_size > total) {
      *err = new_error(TRITONSERVER_ERROR_INTERNAL, "input '%s' arrived with inconsistent sizes",
                       in->name);
    } else {
      *err = gather_input(in->input, in->name, in->n_buffers, dst + offset, in->byte_size, 0);
    }
    if (*err != NULL) {
      Py_DECREF(arr);
      return NULL;
    }
    offset += in->byte_size;
  }
  return arr;
}

/* With the GIL, an exception set: the runner's message for it (runner.failed), as the
 * general path returns it; NULL (exception set) for what is not an Exception, which the
 * general path does not catch either. */
static PyObject* failed_message(ModelState* ms)
{
  if (!PyErr_ExceptionMatches(PyExc_Exception)) return NULL;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb != NULL) PyException_SetTraceback(value, tb);
  PyObject* message = PyObject_CallOneArg(ms->fast_failed, value);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return message;
}

/* With the GIL: the batched outputs as one dict per request: views of numpy arrays' rows
 * (what split_outputs does for them), or split_outputs itself for anything else. */
static PyObject* split(ModelState* ms, PyObject* result, uint32_t count, const uint64_t* sizes)
{
  if (count == 1 && PyDict_CheckExact(result)) {
    PyObject* parts = PyList_New(1);
    if (parts != NULL) PyList_SET_ITEM(parts, 0, Py_NewRef(result));
    return parts;
  }
  int arrays = PyDict_CheckExact(result);
  Py_ssize_t pos = 0;
  PyObject *key, *value;
  while (arrays && PyDict_Next(result, &pos, &key, &value))
    arrays = PyArray_CheckExact(value) && PyArray_NDIM((PyArrayObject*)value) >= 1;
  if (!arrays) {
    PyObject* bounds = PyList_New(count - 1);
    uint64_t at = 0;
    for (uint32_t r = 0; bounds != NULL && r + 1 < count; r++) {
      at += sizes[r];
      PyObject* b = PyLong_FromUnsignedLongLong(at);
      if (b == NULL) Py_CLEAR(bounds);
      else PyList_SET_ITEM(bounds, r, b);
    }
    PyObject* parts =
        bounds ? PyObject_CallFunction(ms->fast_split, "OIO", result, count, bounds) : NULL;
    Py_XDECREF(bounds);
    return parts;
  }
  PyObject* parts = PyList_New(count);
  Py_ssize_t start = 0;
  for (uint32_t r = 0; parts != NULL && r < count; r++) {
    PyObject* one = PyDict_New();
    if (one == NULL) goto fail;
    PyList_SET_ITEM(parts, r, one);
    Py_ssize_t end = r + 1 < count ? start + (Py_ssize_t)sizes[r] : PY_SSIZE_T_MAX;
    pos = 0;
    while (PyDict_Next(result, &pos, &key, &value)) {
      PyObject* rows = PySequence_GetSlice(value, start, end);
      int rc = rows ? PyDict_SetItem(one, key, rows) : -1;
      Py_XDECREF(rows);
      if (rc < 0) goto fail;
    }
    start = end;
  }
  return parts;
fail:
  Py_XDECREF(parts);
  return NULL;
}

/* With the GIL: run the model's @batch function on a batch. Returns the outputs per request
 * (a list, as binding.execute returns them) or the function's error message (a str); NULL
 * with *err (Triton's error) or an exception set when the batch failed here; NULL with
 * *declined set, and nothing consumed, when it takes the general path. */
PyObject* fast_batch_run(ModelState* ms, TRITONBACKEND_Request** requests, uint32_t count,
                         PyObject** views, Py_ssize_t* n_views, uint64_t* sizes,
                         uint64_t* compute_start, TRITONSERVER_Error** err, int* declined)
{
  *declined = 1;
  if (count > 1 && ms->max_batch_size <= 0) return NULL;
  for (uint32_t r = 0; r < count; r++)
    if (needs_general_path(ms, requests[r])) return NULL;
  FastInput first[FAST_MAX_INPUTS];
  FastInput* other = count > 1 ? malloc(sizeof(FastInput) * FAST_MAX_INPUTS * count) : NULL;
  if (count > 1 && other == NULL) return NULL;
  uint32_t n_in = read_inputs(ms, requests, count, first, other);
  /* (an input named "parameters" beside the parameters: the general path, where they replace it) */
  for (uint32_t i = 0; n_in > 0 && ms->fast_parameters && i < n_in; i++)
    if (strcmp(first[i].name, "parameters") == 0) n_in = 0;
  if (n_in == 0) {
    free(other);
    return NULL;
  }
  *declined = 0;
  for (uint32_t r = 0; r < count; r++)
    sizes[r] = rows_of(ms, r == 0 ? first : &other[r * FAST_MAX_INPUTS], n_in);
  /* The function's keyword arguments, in the inputs' order (then parameters): a vectorcall
   * with their names, no dict to build and unpack. */
  PyObject* result = NULL;
  PyObject* args[FAST_MAX_INPUTS + 1];
  uint32_t n_args = 0, n_names = n_in + (ms->fast_parameters ? 1 : 0);
  PyObject* names = PyTuple_New(n_names);
  for (uint32_t i = 0; names != NULL && i < n_in; i++, n_args++) {
    PyObject* arr = count == 1 ? one_input(&first[i], views, n_views, err)
                               : joined_input(first, other, count, i, err);
    PyObject* name = arr ? name_str(first[i].name) : NULL;
    if (name == NULL) {
      Py_XDECREF(arr);
      Py_CLEAR(names);
      break;
    }
    args[i] = arr;
    PyTuple_SET_ITEM(names, i, name);
  }
  free(other);
  if (names != NULL && ms->fast_parameters) { /* (after the inputs, as @batch does) */
    PyObject* all = PyList_New(count);
    for (uint32_t r = 0; all != NULL && r < count; r++) {
      PyObject* p = read_parameters(requests[r], err);
      if (p == NULL) Py_CLEAR(all);
      else PyList_SET_ITEM(all, r, p);
    }
    if (all == NULL) {
      Py_CLEAR(names);
    } else {
      args[n_args++] = all;
      PyTuple_SET_ITEM(names, n_in, Py_NewRef(s_parameters));
    }
  }
  PyObject* outputs = NULL;
  if (names != NULL) {
    *compute_start = now_ns();
    outputs = PyObject_Vectorcall(ms->fast_func, args, 0, names);
  }
  for (uint32_t a = 0; a < n_args; a++) Py_DECREF(args[a]);
  if (names == NULL) {
    if (*err == NULL && !PyErr_Occurred()) PyErr_NoMemory();
    return NULL;
  }
  Py_DECREF(names);
  if (outputs != NULL) {
    result = split(ms, outputs, count, sizes);
    Py_DECREF(outputs);
  }
  return result != NULL ? result : failed_message(ms);
}
