/* Device memory as Python objects: DeviceArray (device memory handed to Python as a DLPack /
 * CUDA-array-interface object: views of Triton's buffers, outputs our allocator placed on the
 * GPU, regions of a client's CUDA shared memory), the holds that keep a request's GPU inputs
 * alive while the callable still uses them, and GPU arrays a callable returned (read through
 * DLPack). The CUDA runtime itself is cuda.c's. */
#include "device_array.h"

#include "cuda.h"

#include <stdio.h>

/* ---- dtypes between Triton and DLPack ----------------------------------- */

TRITONSERVER_DataType dl_dtype(DLDataType t)
{
  if (t.lanes != 1) return TRITONSERVER_TYPE_INVALID;
  switch (t.code) {
    case DL_BOOL: return t.bits == 8 ? TRITONSERVER_TYPE_BOOL : TRITONSERVER_TYPE_INVALID;
    case DL_INT:
      return t.bits == 8    ? TRITONSERVER_TYPE_INT8
             : t.bits == 16 ? TRITONSERVER_TYPE_INT16
             : t.bits == 32 ? TRITONSERVER_TYPE_INT32
             : t.bits == 64 ? TRITONSERVER_TYPE_INT64
                            : TRITONSERVER_TYPE_INVALID;
    case DL_UINT:
      return t.bits == 8    ? TRITONSERVER_TYPE_UINT8
             : t.bits == 16 ? TRITONSERVER_TYPE_UINT16
             : t.bits == 32 ? TRITONSERVER_TYPE_UINT32
             : t.bits == 64 ? TRITONSERVER_TYPE_UINT64
                            : TRITONSERVER_TYPE_INVALID;
    case DL_FLOAT:
      return t.bits == 16   ? TRITONSERVER_TYPE_FP16
             : t.bits == 32 ? TRITONSERVER_TYPE_FP32
             : t.bits == 64 ? TRITONSERVER_TYPE_FP64
                            : TRITONSERVER_TYPE_INVALID;
    case DL_BFLOAT: return t.bits == 16 ? TRITONSERVER_TYPE_BF16 : TRITONSERVER_TYPE_INVALID;
    default: return TRITONSERVER_TYPE_INVALID;
  }
}

static int dl_of(TRITONSERVER_DataType t, DLDataType* out)
{
  out->lanes = 1;
  out->bits = (uint8_t)(dtype_size(t) * 8);
  switch (t) {
    case TRITONSERVER_TYPE_BOOL: out->code = DL_BOOL; return 0;
    case TRITONSERVER_TYPE_INT8:
    case TRITONSERVER_TYPE_INT16:
    case TRITONSERVER_TYPE_INT32:
    case TRITONSERVER_TYPE_INT64: out->code = DL_INT; return 0;
    case TRITONSERVER_TYPE_UINT8:
    case TRITONSERVER_TYPE_UINT16:
    case TRITONSERVER_TYPE_UINT32:
    case TRITONSERVER_TYPE_UINT64: out->code = DL_UINT; return 0;
    case TRITONSERVER_TYPE_FP16:
    case TRITONSERVER_TYPE_FP32:
    case TRITONSERVER_TYPE_FP64: out->code = DL_FLOAT; return 0;
    case TRITONSERVER_TYPE_BF16: out->code = DL_BFLOAT, out->bits = 16; return 0;
    default: return -1;
  }
}

/* ---- DeviceArray ------------------------------------------------------- */

typedef struct {
  PyObject_HEAD
  void* ptr;
  size_t nbytes;
  int ndim;
  int64_t shape[MAX_DIMS];
  TRITONSERVER_DataType dtype;
  int device;
  int owns;        /* the memory is ours: cudaFree when the array goes */
  PyObject* owner; /* or what keeps it alive: a request's hold, a shared-memory region, ... */
} DeviceArrayObject;

PyTypeObject DeviceArrayType;

int is_device_array(PyObject* o)
{
  return Py_TYPE(o) == &DeviceArrayType;
}

PyObject* device_array_new(void* ptr, size_t nbytes, int ndim, const int64_t* shape,
                           TRITONSERVER_DataType dtype, int device, int owns, PyObject* owner)
{
  DeviceArrayObject* a = PyObject_New(DeviceArrayObject, &DeviceArrayType);
  if (a == NULL) {
    if (owns) cuda_free(ptr);
    return NULL;
  }
  a->ptr = ptr;
  a->nbytes = nbytes;
  a->ndim = ndim < 0 ? 0 : ndim > MAX_DIMS ? MAX_DIMS : ndim;
  for (int d = 0; d < a->ndim; d++) a->shape[d] = shape[d];
  a->dtype = dtype;
  a->device = device;
  a->owns = owns;
  a->owner = Py_XNewRef(owner);
  return (PyObject*)a;
}

/* A new device block of nbytes on device, owned by the array returned (NULL: exception). */
PyObject* device_array_alloc(size_t nbytes, int ndim, const int64_t* shape,
                             TRITONSERVER_DataType dtype, int device)
{
  void* ptr = NULL;
  const char* why = cuda_alloc(&ptr, nbytes, device);
  if (why != NULL) {
    char msg[256];
    snprintf(msg, sizeof msg, "cannot allocate %zu bytes on GPU %d: %s", nbytes, device, why);
    return raise_triton(TRITONSERVER_ERROR_UNAVAILABLE, msg);
  }
  return device_array_new(ptr, nbytes, ndim, shape, dtype, device, 1, NULL);
}

void* device_array_ptr(PyObject* o)
{
  return ((DeviceArrayObject*)o)->ptr;
}
size_t device_array_nbytes(PyObject* o)
{
  return ((DeviceArrayObject*)o)->nbytes;
}
int device_array_device(PyObject* o)
{
  return ((DeviceArrayObject*)o)->device;
}

static void device_array_dealloc(DeviceArrayObject* a)
{
  if (a->owns) cuda_free(a->ptr);
  Py_XDECREF(a->owner);
  PyObject_Free(a);
}

/* __dlpack__'s tensor: the array stays alive until the consumer calls the deleter. */
typedef struct {
  DLManagedTensor managed;
  int64_t shape[MAX_DIMS];
} Exported;

static void exported_delete(DLManagedTensor* m)
{
  PyGILState_STATE g = PyGILState_Ensure(); /* consumers may delete from any thread */
  Py_DECREF((PyObject*)m->manager_ctx);
  PyGILState_Release(g);
  free(m);
}

static void dltensor_capsule_free(PyObject* capsule)
{
  if (!PyCapsule_IsValid(capsule, "dltensor")) return; /* consumed: renamed used_dltensor */
  DLManagedTensor* m = PyCapsule_GetPointer(capsule, "dltensor");
  if (m != NULL && m->deleter != NULL) m->deleter(m);
}

static PyObject* da_dlpack(DeviceArrayObject* a, PyObject* args, PyObject* kwargs)
{
  (void)args, (void)kwargs; /* stream, max_version, dl_device, copy: the data is ready on
                               every stream (copies into it were waited for) */
  DLDataType dt;
  if (dl_of(a->dtype, &dt) < 0)
    return raise_triton(TRITONSERVER_ERROR_UNSUPPORTED, "this datatype has no DLPack equivalent");
  Exported* e = calloc(1, sizeof(Exported));
  if (e == NULL) return PyErr_NoMemory();
  memcpy(e->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
  e->managed.dl_tensor.data = a->ptr;
  e->managed.dl_tensor.device.device_type = DL_CUDA;
  e->managed.dl_tensor.device.device_id = a->device;
  e->managed.dl_tensor.ndim = a->ndim;
  e->managed.dl_tensor.dtype = dt;
  e->managed.dl_tensor.shape = e->shape;
  e->managed.dl_tensor.strides = NULL;
  e->managed.dl_tensor.byte_offset = 0;
  e->managed.manager_ctx = Py_NewRef((PyObject*)a);
  e->managed.deleter = exported_delete;
  PyObject* capsule = PyCapsule_New(&e->managed, "dltensor", dltensor_capsule_free);
  if (capsule == NULL) {
    Py_DECREF((PyObject*)a);
    free(e);
  }
  return capsule;
}

static PyObject* da_dlpack_device(DeviceArrayObject* a, PyObject* unused)
{
  (void)unused;
  return Py_BuildValue("(ii)", DL_CUDA, a->device);
}

static PyObject* shape_tuple(DeviceArrayObject* a)
{
  PyObject* t = PyTuple_New(a->ndim);
  for (int d = 0; t != NULL && d < a->ndim; d++)
    PyTuple_SET_ITEM(t, d, PyLong_FromLongLong(a->shape[d]));
  return t;
}

static PyObject* da_shape(DeviceArrayObject* a, void* c)
{
  return (void)c, shape_tuple(a);
}

static PyObject* da_dtype(DeviceArrayObject* a, void* c)
{
  (void)c;
  int typenum = numpy_typenum_of(a->dtype);
  if (typenum < 0) return PyUnicode_FromString(dtype_name(a->dtype)); /* BF16: no numpy dtype */
  return (PyObject*)PyArray_DescrFromType(typenum);
}

static PyObject* da_device(DeviceArrayObject* a, void* c)
{
  return (void)c, PyLong_FromLong(a->device);
}
static PyObject* da_ptr(DeviceArrayObject* a, void* c)
{
  return (void)c, PyLong_FromVoidPtr(a->ptr);
}
static PyObject* da_nbytes(DeviceArrayObject* a, void* c)
{
  return (void)c, PyLong_FromSize_t(a->nbytes);
}

static PyObject* da_cai(DeviceArrayObject* a, void* c)
{
  (void)c;
  int typenum = numpy_typenum_of(a->dtype);
  if (typenum < 0) {
    PyErr_SetString(PyExc_AttributeError, "this datatype has no __cuda_array_interface__ typestr");
    return NULL;
  }
  PyArray_Descr* descr = PyArray_DescrFromType(typenum);
  PyObject* typestr = descr ? PyObject_GetAttrString((PyObject*)descr, "str") : NULL;
  Py_XDECREF(descr);
  PyObject* shape = shape_tuple(a);
  PyObject* r =
      typestr && shape
          ? Py_BuildValue("{s:O,s:O,s:(NO),s:i,s:O}", "shape", shape, "typestr", typestr, "data",
                          PyLong_FromVoidPtr(a->ptr), Py_False, "version", 3, "strides", Py_None)
          : NULL;
  Py_XDECREF(typestr);
  Py_XDECREF(shape);
  return r;
}

static PyObject* da_to_numpy(DeviceArrayObject* a, PyObject* unused)
{
  (void)unused;
  int typenum = numpy_typenum_of(a->dtype);
  if (typenum < 0)
    return raise_triton(TRITONSERVER_ERROR_UNSUPPORTED, "this datatype has no numpy equivalent");
  npy_intp dims[MAX_DIMS];
  for (int d = 0; d < a->ndim; d++) dims[d] = (npy_intp)a->shape[d];
  PyObject* arr = PyArray_SimpleNew(a->ndim, dims, typenum);
  if (arr == NULL) return NULL;
  size_t n = (size_t)PyArray_NBYTES((PyArrayObject*)arr);
  const char* why =
      cuda_copy(PyArray_DATA((PyArrayObject*)arr), a->ptr, n < a->nbytes ? n : a->nbytes);
  if (why != NULL) {
    Py_DECREF(arr);
    return raise_triton(TRITONSERVER_ERROR_INTERNAL, why);
  }
  return arr;
}

static PyObject* da_repr(DeviceArrayObject* a)
{
  PyObject* shape = shape_tuple(a);
  PyObject* r = shape ? PyUnicode_FromFormat("DeviceArray(shape=%R, dtype=%s, device=%d)", shape,
                                             dtype_name(a->dtype), a->device)
                      : NULL;
  Py_XDECREF(shape);
  return r;
}

static PyMethodDef da_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))da_dlpack, METH_VARARGS | METH_KEYWORDS,
     "A DLPack capsule of this memory (no copy); the array lives until the consumer lets go."},
    {"__dlpack_device__", (PyCFunction)da_dlpack_device, METH_NOARGS, "(kDLCUDA, device id)"},
    {"to_numpy", (PyCFunction)da_to_numpy, METH_NOARGS, "A host copy as a numpy array."},
    {NULL, NULL, 0, NULL}};
static PyGetSetDef da_getset[] = {
    {"shape", (getter)da_shape, NULL, "the shape", NULL},
    {"dtype", (getter)da_dtype, NULL, "the numpy dtype ('BF16' for bfloat16)", NULL},
    {"device", (getter)da_device, NULL, "the CUDA device id", NULL},
    {"data_ptr", (getter)da_ptr, NULL, "the device address", NULL},
    {"nbytes", (getter)da_nbytes, NULL, "the size in bytes", NULL},
    {"__cuda_array_interface__", (getter)da_cai, NULL, "CUDA array interface, version 3", NULL},
    {NULL, NULL, NULL, NULL, NULL}};
PyTypeObject DeviceArrayType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "embedtriton.DeviceArray",
    .tp_basicsize = sizeof(DeviceArrayObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc =
        "C-contiguous GPU memory (an output in GPU memory, a view of a GPU input): hand it "
        "to cupy.from_dlpack or torch.from_dlpack (no copy); it lives as long as they use it.",
    .tp_dealloc = (destructor)device_array_dealloc,
    .tp_repr = (reprfunc)da_repr,
    .tp_methods = da_methods,
    .tp_getset = da_getset,
};

/* device_array(ptr, shape, dtype, device, owner) -> DeviceArray: a view of device memory that
 * keeps owner alive (dtype None: bytes). */
PyObject* py_device_array(PyObject* self, PyObject* args)
{
  (void)self;
  PyObject *ptr_obj, *shape_obj, *dtype_obj, *owner;
  int device;
  if (!PyArg_ParseTuple(args, "OOOiO:device_array", &ptr_obj, &shape_obj, &dtype_obj, &device,
                        &owner))
    return NULL;
  void* ptr = PyLong_AsVoidPtr(ptr_obj);
  if (PyErr_Occurred()) return NULL;
  TRITONSERVER_DataType dtype = TRITONSERVER_TYPE_UINT8;
  if (dtype_obj != Py_None) {
    PyArray_Descr* descr = NULL;
    if (!PyArray_DescrConverter(dtype_obj, &descr)) return NULL;
    PyObject* probe = PyArray_Zeros(0, NULL, descr, 0); /* steals descr */
    if (probe == NULL) return NULL;
    dtype = triton_dtype_of((PyArrayObject*)probe);
    Py_DECREF(probe);
    if (dtype == TRITONSERVER_TYPE_INVALID || dtype == TRITONSERVER_TYPE_BYTES)
      return raise_triton(TRITONSERVER_ERROR_INVALID_ARG,
                          "a device array holds numbers or booleans, not this dtype");
  }
  PyObject* seq = PySequence_Fast(shape_obj, "shape must be a sequence of ints");
  if (seq == NULL) return NULL;
  Py_ssize_t ndim = PySequence_Fast_GET_SIZE(seq);
  int64_t shape[MAX_DIMS];
  size_t count = 1;
  for (Py_ssize_t d = 0; d < ndim && d < MAX_DIMS; d++) {
    shape[d] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, d));
    if (shape[d] < 0) PyErr_Format(PyExc_ValueError, "negative dimension");
    count *= (size_t)(shape[d] < 0 ? 0 : shape[d]);
  }
  Py_DECREF(seq);
  if (ndim > MAX_DIMS) PyErr_Format(PyExc_ValueError, "at most %d dimensions", MAX_DIMS);
  if (PyErr_Occurred()) return NULL;
  return device_array_new(ptr, count * dtype_size(dtype), (int)ndim, shape, dtype, device, 0,
                          owner);
}

/* ---- a request's hold ---------------------------------------------------
 * Views of a request's GPU inputs keep a hold on it. If the callable still uses one when its
 * batch is answered (a cupy array it stored), the request is released when the last view
 * goes, not before: Triton frees its input buffers at the release. */
typedef struct {
  PyObject_HEAD
  TRITONBACKEND_Request* request; /* the request it belongs to */
  int armed;                      /* releasing it is the hold's job now */
} HoldObject;

static void hold_dealloc(HoldObject* h)
{
  if (h->armed) api.TRITONBACKEND_RequestRelease(h->request, TRITONSERVER_REQUEST_RELEASE_ALL);
  PyObject_Free(h);
}

PyTypeObject HoldType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "embedtriton._native.Hold",
    .tp_basicsize = sizeof(HoldObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Keeps a request's GPU inputs alive while views of them are used.",
    .tp_dealloc = (destructor)hold_dealloc,
};

PyObject* hold_new(TRITONBACKEND_Request* request)
{
  HoldObject* h = PyObject_New(HoldObject, &HoldType);
  if (h != NULL) h->request = request, h->armed = 0;
  return (PyObject*)h;
}

int is_hold(PyObject* o)
{
  return Py_TYPE(o) == &HoldType;
}

/* With the GIL, at the end of a batch: drop the batch's reference to a hold. Returns the
 * request when views still use it (the hold releases it later), else NULL. */
TRITONBACKEND_Request* hold_drop(PyObject* o)
{
  HoldObject* h = (HoldObject*)o;
  TRITONBACKEND_Request* kept = NULL;
  if (Py_REFCNT(o) > 1) h->armed = 1, kept = h->request;
  Py_DECREF(o);
  return kept;
}

/* ---- GPU arrays returned by a callable ---------------------------------- */

/* If value is an array in CUDA memory (cupy, torch, anything with __dlpack_device__ saying so),
 * fill g (its DLPack tensor, consumed: gpu_value_done lets it go) and return 1; 0 for anything
 * else (host arrays go through numpy); -1 with *err. */
int gpu_value(PyObject* value, GpuValue* g, const char* name, TRITONSERVER_Error** err)
{
  if (PyArray_Check(value)) return 0;
  if (is_device_array(value)) {
    DeviceArrayObject* a = (DeviceArrayObject*)value;
    g->holder = Py_NewRef(value);
    g->managed = NULL;
    g->data = a->ptr;
    g->ndim = a->ndim;
    memcpy(g->shape, a->shape, sizeof(int64_t) * (size_t)a->ndim);
    g->dtype = a->dtype;
    g->device = a->device;
    g->nbytes = a->nbytes;
    return 1;
  }
  PyObject* where = PyObject_GetAttrString(value, "__dlpack_device__");
  if (where == NULL) {
    PyErr_Clear();
    return 0;
  }
  PyObject* dev = PyObject_CallNoArgs(where);
  Py_DECREF(where);
  int type = -1, id = 0;
  if (dev == NULL || !PyArg_ParseTuple(dev, "ii", &type, &id)) {
    Py_XDECREF(dev);
    PyErr_Clear();
    return 0;
  }
  Py_DECREF(dev);
  if (type != DL_CUDA) return 0;
  PyObject* capsule = PyObject_CallMethod(value, "__dlpack__", NULL);
  DLManagedTensor* m = capsule ? PyCapsule_GetPointer(capsule, "dltensor") : NULL;
  if (m == NULL) {
    Py_XDECREF(capsule);
    *err = error_from_python("a GPU output's __dlpack__() failed");
    return -1;
  }
  PyCapsule_SetName(capsule, "used_dltensor");
  PyCapsule_SetDestructor(capsule, NULL);
  Py_DECREF(capsule);
  DLTensor* t = &m->dl_tensor;
  g->holder = NULL;
  g->managed = m;
  g->dtype = dl_dtype(t->dtype);
  g->device = t->device.device_id;
  g->ndim = t->ndim;
  if (g->dtype == TRITONSERVER_TYPE_INVALID || t->ndim < 0 || t->ndim > MAX_DIMS) {
    *err = new_error(TRITONSERVER_ERROR_INTERNAL,
                     "output '%s': a GPU array of DLPack dtype (code %u, %u bits) or %d "
                     "dimensions cannot be returned",
                     name, t->dtype.code, t->dtype.bits, t->ndim);
    gpu_value_done(g);
    return -1;
  }
  size_t count = 1;
  int64_t expected = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    if (t->strides != NULL && t->shape[d] > 1 && t->strides[d] != expected) {
      *err = new_error(TRITONSERVER_ERROR_INTERNAL,
                       "output '%s' is a GPU array that is not C-contiguous; return a "
                       "contiguous one (cupy.ascontiguousarray(x), x.contiguous())",
                       name);
      gpu_value_done(g);
      return -1;
    }
    expected *= t->shape[d];
    count *= (size_t)t->shape[d];
  }
  for (int d = 0; d < t->ndim; d++) g->shape[d] = t->shape[d];
  g->data = (const char*)t->data + t->byte_offset;
  g->nbytes = count * dtype_size(g->dtype);
  return 1;
}

void gpu_value_done(GpuValue* g)
{
  if (g->managed != NULL && g->managed->deleter != NULL) g->managed->deleter(g->managed);
  g->managed = NULL;
  Py_CLEAR(g->holder);
}
