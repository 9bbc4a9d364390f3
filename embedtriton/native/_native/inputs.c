/* A request's inputs and parameters, from Python objects: numpy arrays (and
 * what numpy can turn into one) and any object with __dlpack__, whose memory
 * goes to Triton as it is. */
#include "inputs.h"

#include "device_array.h"
#include "request.h"

#include <stdio.h>

#include "dlpack.h"

/* ---- DLPack inputs (the ABI's declarations: dlpack.h) ------------------- */

/* A consumed DLPack tensor: its producer's deleter runs when the capsule goes. */
static void dl_capsule_free(PyObject* capsule)
{
  DLManagedTensor* m = PyCapsule_GetPointer(capsule, "embedtriton.dltensor");
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}

/* An input given as any object with __dlpack__ (cupy, torch, jax, numpy...): its
 * memory goes to Triton as it is, host, pinned or GPU (no copy). Returns the
 * holder that keeps it alive until Triton releases the request. */
static PyObject* add_dlpack_input(TRITONSERVER_InferenceRequest* req, const char* name,
                                  PyObject* value)
{
  PyObject* capsule = PyObject_CallMethod(value, "__dlpack__", NULL);
  if (capsule == NULL) { /* e.g. a device array not ready for export */
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyObject* why = v ? PyObject_Str(v) : NULL;
    char msg[512];
    snprintf(msg, sizeof msg, "input '%s' (%s): __dlpack__() failed: %s", name,
             Py_TYPE(value)->tp_name, why ? PyUnicode_AsUTF8(why) : "?");
    Py_XDECREF(why), Py_XDECREF(t), Py_XDECREF(v), Py_XDECREF(tb);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  DLManagedTensor* m = PyCapsule_GetPointer(capsule, "dltensor");
  if (m == NULL) {
    PyErr_Clear();
    Py_DECREF(capsule);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                        "__dlpack__() did not return a 'dltensor' capsule");
  }
  /* consumed: the producer must not delete it; we call its deleter later */
  PyCapsule_SetName(capsule, "used_dltensor");
  PyCapsule_SetDestructor(capsule, NULL);
  Py_DECREF(capsule);
  PyObject* holder = PyCapsule_New(m, "embedtriton.dltensor", dl_capsule_free);
  if (holder == NULL) {
    if (m->deleter) m->deleter(m);
    return NULL;
  }
  DLTensor* t = &m->dl_tensor;
  char msg[256];
  TRITONSERVER_DataType dtype = dl_dtype(t->dtype);
  TRITONSERVER_MemoryType mtype;
  int64_t mtype_id = 0;
  if (t->device.device_type == DL_CPU) {
    mtype = TRITONSERVER_MEMORY_CPU;
  } else if (t->device.device_type == DL_CUDA_HOST) {
    mtype = TRITONSERVER_MEMORY_CPU_PINNED;
  } else if (t->device.device_type == DL_CUDA) {
    mtype = TRITONSERVER_MEMORY_GPU;
    mtype_id = t->device.device_id;
  } else {
    snprintf(msg, sizeof msg,
             "input '%s': DLPack device type %d is not supported (CPU, CUDA "
             "and CUDA host memory are)",
             name, t->device.device_type);
    Py_DECREF(holder);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  if (dtype == TRITONSERVER_TYPE_INVALID || t->ndim > MAX_DIMS || t->ndim < 0) {
    snprintf(msg, sizeof msg,
             "input '%s': DLPack dtype (code %u, %u bits, %u lanes) or %d "
             "dimensions cannot be carried",
             name, t->dtype.code, t->dtype.bits, t->dtype.lanes, t->ndim);
    Py_DECREF(holder);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  uint64_t count = 1;
  int64_t expected = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->strides != NULL && t->shape[d] > 1 && t->strides[d] != expected) {
      snprintf(msg, sizeof msg,
               "input '%s' is not C-contiguous; make it contiguous first "
               "(e.g. .contiguous() / ascontiguousarray)",
               name);
      Py_DECREF(holder);
      return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
    }
    expected *= t->shape[d];
    count *= (uint64_t)t->shape[d];
  }
  size_t nbytes = (size_t)count * (size_t)(t->dtype.bits / 8);
  const char* data = (const char*)t->data + t->byte_offset;
  InputDesc in = {.name = name,
                  .dtype = dtype,
                  .ndim = (uint32_t)t->ndim,
                  .shape = t->shape,
                  .data = data,
                  .nbytes = nbytes,
                  .memory = mtype,
                  .device = mtype_id};
  TRITONSERVER_Error* err = request_add_inputs(req, &in, 1);
  if (err != NULL) {
    Py_DECREF(holder);
    return raise_from(err, 1);
  }
  return holder;
}

/* Add one input to a request. Returns the object Triton reads from (new
 * reference), or NULL with an exception. */
PyObject* add_input(TRITONSERVER_InferenceRequest* req, PyObject* key, PyObject* value)
{
  const char* name = PyUnicode_Check(key) ? PyUnicode_AsUTF8(key) : NULL;
  if (name == NULL) {
    PyErr_Clear();
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, "input names must be strings");
  }
  PyArrayObject* arr;
  if (PyArray_Check(value) && PyArray_ISCARRAY_RO((PyArrayObject*)value) &&
      PyArray_ISNOTSWAPPED((PyArrayObject*)value)) {
    arr = (PyArrayObject*)Py_NewRef(value);
  } else if (!PyArray_Check(value) && PyObject_HasAttrString(value, "__dlpack__")) {
    return add_dlpack_input(req, name, value);
  } else {
    arr = (PyArrayObject*)PyArray_FromAny(value, NULL, 0, 0,
                                          NPY_ARRAY_CARRAY_RO | NPY_ARRAY_NOTSWAPPED, NULL);
    if (arr == NULL) { /* e.g. a ragged list */
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      PyObject* why = v ? PyObject_Str(v) : NULL;
      const char* because = why ? PyUnicode_AsUTF8(why) : NULL;
      char msg[640];
      snprintf(msg, sizeof msg, "cannot turn input '%s' (%s) into an array: %s", name,
               Py_TYPE(value)->tp_name, because ? because : "?");
      Py_XDECREF(why), Py_XDECREF(t), Py_XDECREF(v), Py_XDECREF(tb);
      return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
    }
  }
  if (!PyArray_ISNOTSWAPPED(arr)) { /* (FromAny keeps a byte-swapped dtype): to native order */
    PyArray_Descr* native = PyArray_DescrNewByteorder(PyArray_DESCR(arr), NPY_NATIVE);
    PyArrayObject* swapped =
        native ? (PyArrayObject*)PyArray_FromArray(arr, native, NPY_ARRAY_CARRAY_RO) : NULL;
    Py_DECREF(arr);
    if (swapped == NULL) return NULL;
    arr = swapped;
  }
  TRITONSERVER_DataType dtype = triton_dtype_of(arr);
  if (dtype == TRITONSERVER_TYPE_INVALID) {
    PyObject* d = PyObject_Str((PyObject*)PyArray_DESCR(arr));
    char msg[512];
    snprintf(msg, sizeof msg, "input '%s' has dtype %s, which Triton cannot carry", name,
             d ? PyUnicode_AsUTF8(d) : "?");
    Py_XDECREF(d);
    Py_DECREF(arr);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  int ndim = PyArray_NDIM(arr);
  if (ndim > MAX_DIMS) {
    char msg[256];
    snprintf(msg, sizeof msg, "input '%s' has %d dimensions; at most %d are supported", name, ndim,
             MAX_DIMS);
    Py_DECREF(arr);
    return raise_triton(TRITONSERVER_ERROR_INVALID_ARG, msg);
  }
  int64_t shape[MAX_DIMS];
  for (int d = 0; d < ndim; d++) shape[d] = PyArray_DIM(arr, d);
  PyObject* holder = (PyObject*)arr;
  const void* data = PyArray_DATA(arr);
  Py_ssize_t nbytes = PyArray_NBYTES(arr);
  if (dtype == TRITONSERVER_TYPE_BYTES) {
    holder = PyObject_CallOneArg(g_encode_bytes, (PyObject*)arr);
    Py_DECREF(arr);
    if (holder == NULL) return NULL;
    data = PyBytes_AS_STRING(holder);
    nbytes = PyBytes_GET_SIZE(holder);
  }
  InputDesc in = {.name = name,
                  .dtype = dtype,
                  .ndim = (uint32_t)ndim,
                  .shape = shape,
                  .data = data,
                  .nbytes = (size_t)nbytes}; /* (host memory) */
  TRITONSERVER_Error* err = request_add_inputs(req, &in, 1);
  if (err != NULL) {
    Py_DECREF(holder);
    return raise_from(err, 1);
  }
  return holder;
}

_Static_assert(sizeof(npy_intp) == sizeof(int64_t), "numpy's dims are Triton's shape");

/* With the GIL: read an input that request_add_inputs can add later without the GIL (a
 * C-contiguous numpy array of a dtype Triton carries, not BYTES) into *out and return 1; the
 * caller holds key and value meanwhile. 0: add it with add_input instead (which also says what is
 * wrong). */
int pending_input(PyObject* key, PyObject* value, InputDesc* out)
{
  if (!PyUnicode_Check(key) || !PyArray_Check(value)) return 0;
  PyArrayObject* arr = (PyArrayObject*)value;
  if (!PyArray_ISCARRAY_RO(arr) || !PyArray_ISNOTSWAPPED(arr) || PyArray_NDIM(arr) > MAX_DIMS)
    return 0;
  TRITONSERVER_DataType dtype = triton_dtype_of(arr);
  if (dtype == TRITONSERVER_TYPE_INVALID || dtype == TRITONSERVER_TYPE_BYTES) return 0;
  const char* name = PyUnicode_AsUTF8(key);
  if (name == NULL) {
    PyErr_Clear();
    return 0;
  }
  *out = (InputDesc){.name = name,
                     .dtype = dtype,
                     .ndim = (uint32_t)PyArray_NDIM(arr),
                     .shape = (const int64_t*)PyArray_DIMS(arr),
                     .data = PyArray_DATA(arr),
                     .nbytes = (size_t)PyArray_NBYTES(arr)}; /* (host memory) */
  return 1;
}

/* The INVALID_ARG error for one of the parameters, in the words of embedtriton/core/request.py:
 * "parameters[<key>] must be <TAKES_PARAMETER>, not <value>", or with value NULL "a name in
 * parameters must be <TAKES_PARAMETER_NAME>, not <key>". Clears any Python error. */
static TRITONSERVER_Error* refused_parameter(PyObject* key, PyObject* value)
{
  PyErr_Clear();
  PyObject* name = shown(key);
  PyObject* got = value != NULL ? shown(value) : NULL;
  const char* n = name != NULL ? PyUnicode_AsUTF8(name) : NULL;
  const char* g = got != NULL ? PyUnicode_AsUTF8(got) : NULL;
  TRITONSERVER_Error* err =
      value == NULL ? new_error(TRITONSERVER_ERROR_INVALID_ARG,
                                "a name in parameters must be " TAKES_PARAMETER_NAME ", not %s%s",
                                n != NULL ? n : "?", TEXT_HINT(key))
                    : new_error(TRITONSERVER_ERROR_INVALID_ARG,
                                "parameters[%s] must be " TAKES_PARAMETER ", not %s%s",
                                n != NULL ? n : "?", g != NULL ? g : "?", TEXT_HINT(value));
  PyErr_Clear();
  Py_XDECREF(name);
  Py_XDECREF(got);
  return err;
}

TRITONSERVER_Error* set_parameter(TRITONSERVER_InferenceRequest* req, PyObject* key,
                                  PyObject* value)
{
  const char* k = text_of(key);
  if (k == NULL) return refused_parameter(key, NULL);
  if (PyBool_Check(value))
    return api.TRITONSERVER_InferenceRequestSetBoolParameter(req, k, value == Py_True);
  if (PyLong_Check(value)) {
    long long v = PyLong_AsLongLong(value);
    if (v == -1 && PyErr_Occurred()) return refused_parameter(key, value);
    return api.TRITONSERVER_InferenceRequestSetIntParameter(req, k, v);
  }
  if (PyFloat_Check(value))
    return api.TRITONSERVER_InferenceRequestSetDoubleParameter(req, k, PyFloat_AS_DOUBLE(value));
  const char* s = text_of(value);
  if (s != NULL) return api.TRITONSERVER_InferenceRequestSetStringParameter(req, k, s);
  return refused_parameter(key, value);
}
