/* Conversions: Triton datatypes to and from numpy's, and errors between Triton
 * (TRITONSERVER_Error) and Python (the TritonError subclasses). */
#include "common.h"

#include <stdarg.h>
#include <stdio.h>

static const char* const dtype_names[] = {"INVALID", "BOOL", "UINT8", "UINT16", "UINT32",
                                          "UINT64",  "INT8", "INT16", "INT32",  "INT64",
                                          "FP16",    "FP32", "FP64",  "BYTES",  "BF16"};

const char* dtype_name(int t)
{
  return (t >= 0 && t <= TRITONSERVER_TYPE_BF16) ? dtype_names[t] : "INVALID";
}

/* numpy's name for a Triton datatype (np.<name> in a fix-it message). */
const char* numpy_dtype_name(int t)
{
  static const char* const names[] = {"?",       "bool",    "uint8",   "uint16",  "uint32",
                                      "uint64",  "int8",    "int16",   "int32",   "int64",
                                      "float16", "float32", "float64", "object_", "bfloat16"};
  return (t >= 0 && t <= TRITONSERVER_TYPE_BF16) ? names[t] : "?";
}

/* ---- tensor names as str ---------------------------------------------- */

/* With the GIL: a tensor name as an interned str (a new reference), from a small cache:
 * the same input and output names come back on every call, and making the str each time
 * (PyDict_SetItemString's way: a new str, then interned) cost several hundred instructions
 * a name. A slot holds the last name that hashed to it. NULL with an exception. */
#define NAME_SLOTS 64
static struct {
  char* text;
  PyObject* str;
} name_slots[NAME_SLOTS];

PyObject* name_str(const char* name)
{
  uint32_t h = 2166136261u; /* FNV-1a */
  for (const unsigned char* p = (const unsigned char*)name; *p; p++) h = (h ^ *p) * 16777619u;
  __typeof__(name_slots[0])* slot = &name_slots[h % NAME_SLOTS];
  if (slot->text != NULL && strcmp(slot->text, name) == 0) return Py_NewRef(slot->str);
  PyObject* str = PyUnicode_FromString(name);
  if (str == NULL) return NULL;
  PyUnicode_InternInPlace(&str);
  char* text = strdup(name);
  if (text == NULL) return str; /* (not kept) */
  free(slot->text);
  Py_XSETREF(slot->str, Py_NewRef(str));
  slot->text = text;
  return str;
}

/* With the GIL: d[name] = value, with name from name_str. */
int dict_set_name(PyObject* d, const char* name, PyObject* value)
{
  PyObject* key = name_str(name);
  int rc = key != NULL ? PyDict_SetItem(d, key, value) : -1;
  Py_XDECREF(key);
  return rc;
}

/* ---- dtype mapping ----------------------------------------------------- */

/* Triton datatype of a numpy array; BYTES for object/bytes/str arrays. */
TRITONSERVER_DataType triton_dtype_of(PyArrayObject* a)
{
  PyArray_Descr* d = PyArray_DESCR(a);
  npy_intp size = PyArray_ITEMSIZE(a);
  switch (d->kind) {
    case 'b': return TRITONSERVER_TYPE_BOOL;
    case 'i':
      return size == 1   ? TRITONSERVER_TYPE_INT8
             : size == 2 ? TRITONSERVER_TYPE_INT16
             : size == 4 ? TRITONSERVER_TYPE_INT32
             : size == 8 ? TRITONSERVER_TYPE_INT64
                         : TRITONSERVER_TYPE_INVALID;
    case 'u':
      return size == 1   ? TRITONSERVER_TYPE_UINT8
             : size == 2 ? TRITONSERVER_TYPE_UINT16
             : size == 4 ? TRITONSERVER_TYPE_UINT32
             : size == 8 ? TRITONSERVER_TYPE_UINT64
                         : TRITONSERVER_TYPE_INVALID;
    case 'f':
      return size == 2   ? TRITONSERVER_TYPE_FP16
             : size == 4 ? TRITONSERVER_TYPE_FP32
             : size == 8 ? TRITONSERVER_TYPE_FP64
                         : TRITONSERVER_TYPE_INVALID;
    case 'O':
    case 'S':
    case 'U': return TRITONSERVER_TYPE_BYTES;
    default: return TRITONSERVER_TYPE_INVALID;
  }
}

int numpy_typenum_of(TRITONSERVER_DataType t)
{
  switch (t) {
    case TRITONSERVER_TYPE_BOOL: return NPY_BOOL;
    case TRITONSERVER_TYPE_UINT8: return NPY_UINT8;
    case TRITONSERVER_TYPE_UINT16: return NPY_UINT16;
    case TRITONSERVER_TYPE_UINT32: return NPY_UINT32;
    case TRITONSERVER_TYPE_UINT64: return NPY_UINT64;
    case TRITONSERVER_TYPE_INT8: return NPY_INT8;
    case TRITONSERVER_TYPE_INT16: return NPY_INT16;
    case TRITONSERVER_TYPE_INT32: return NPY_INT32;
    case TRITONSERVER_TYPE_INT64: return NPY_INT64;
    case TRITONSERVER_TYPE_FP16: return NPY_FLOAT16;
    case TRITONSERVER_TYPE_FP32: return NPY_FLOAT32;
    case TRITONSERVER_TYPE_FP64: return NPY_FLOAT64;
    default: return -1;
  }
}

uintptr_t dtype_size(TRITONSERVER_DataType t)
{
  switch (t) {
    case TRITONSERVER_TYPE_UINT16:
    case TRITONSERVER_TYPE_INT16:
    case TRITONSERVER_TYPE_FP16: return 2;
    case TRITONSERVER_TYPE_UINT32:
    case TRITONSERVER_TYPE_INT32:
    case TRITONSERVER_TYPE_FP32: return 4;
    case TRITONSERVER_TYPE_UINT64:
    case TRITONSERVER_TYPE_INT64:
    case TRITONSERVER_TYPE_FP64: return 8;
    default: return 1;
  }
}

/* ---- errors ------------------------------------------------------------ */

/* Raise the TritonError subclass for code with message; returns NULL. Replaces
 * any exception already set (calling into Python with one set is an error). */
PyObject* raise_triton(int code, const char* message)
{
  PyErr_Clear();
  PyObject* exc = PyObject_CallFunction(g_make_error, "is", code, message);
  if (exc != NULL) {
    PyErr_SetObject((PyObject*)Py_TYPE(exc), exc);
    Py_DECREF(exc);
  }
  return NULL;
}

/* repr(value) for a message, cut to 80 characters (a new reference; NULL only when out of
 * memory): embedtriton.core.request.shown. */
PyObject* shown(PyObject* value)
{
  PyObject* text = PyObject_Repr(value);
  if (text == NULL || PyUnicode_AsUTF8(text) == NULL) {
    PyErr_Clear();
    Py_XDECREF(text);
    return PyUnicode_FromFormat("<%s object>", Py_TYPE(value)->tp_name);
  }
  if (PyUnicode_GET_LENGTH(text) > 80) {
    PyObject* head = PyUnicode_Substring(text, 0, 77);
    Py_SETREF(text, head != NULL ? PyUnicode_FromFormat("%U...", head) : NULL);
    Py_XDECREF(head);
  }
  return text;
}

/* Raise InvalidArgumentError "<option> must be <takes>, not <shown(value)><hint>" (the wording
 * of embedtriton.core.request.refusal), replacing any error set; returns NULL. */
PyObject* refuse(const char* option, const char* takes, PyObject* value, const char* hint)
{
  PyErr_Clear();
  PyObject* got = shown(value);
  PyObject* message = NULL;
  if (got != NULL)
    message = PyUnicode_FromFormat("%s must be %s, not %U%s", option, takes, got, hint);
  const char* text = message != NULL ? PyUnicode_AsUTF8(message) : NULL;
  if (text != NULL) raise_triton(TRITONSERVER_ERROR_INVALID_ARG, text);
  Py_XDECREF(got);
  Py_XDECREF(message);
  return NULL;
}

/* The UTF-8 text of a str for Triton's C strings, or NULL (no error set) for anything else,
 * a str that is not valid text (lone surrogates) or one with a NUL that would cut it. */
const char* text_of(PyObject* value)
{
  Py_ssize_t size;
  const char* text = PyUnicode_Check(value) ? PyUnicode_AsUTF8AndSize(value, &size) : NULL;
  if (text == NULL || (Py_ssize_t)strlen(text) != size) {
    PyErr_Clear();
    return NULL;
  }
  return text;
}

/* Raise from a Triton error; deletes it when owned. */
PyObject* raise_from(TRITONSERVER_Error* err, int owned)
{
  raise_triton(api.TRITONSERVER_ErrorCode(err), api.TRITONSERVER_ErrorMessage(err));
  if (owned) api.TRITONSERVER_ErrorDelete(err);
  return NULL;
}

TRITONSERVER_Error* new_error(int code, const char* fmt, ...)
{
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return api.TRITONSERVER_ErrorNew((TRITONSERVER_Error_Code)code, msg);
}

/* The pending Python exception as an INTERNAL Triton error (clears it). */
TRITONSERVER_Error* error_from_python(const char* context)
{
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  PyObject* text = value ? PyObject_Str(value) : NULL;
  const char* msg = text ? PyUnicode_AsUTF8(text) : NULL;
  TRITONSERVER_Error* err =
      new_error(TRITONSERVER_ERROR_INTERNAL, "%s: %s: %s", context,
                type ? ((PyTypeObject*)type)->tp_name : "error", msg ? msg : "");
  PyErr_Clear();
  Py_XDECREF(text);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return err;
}
