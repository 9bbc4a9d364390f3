/* The Python module embedtriton._h2: its types (Server, Call), functions
 * (library, _stop_all, which is registered with atexit) and _REPLY, the capsule of
 * h2_reply.h that _native answers ModelInfer calls through. */
#include "h2.h"

static PyMethodDef module_methods[] = {
    {"_stop_all", stop_all_servers, METH_NOARGS,
     "stop every running server (registered with atexit)"},
    {"library", (PyCFunction)(void (*)(void))library_info, METH_VARARGS | METH_KEYWORDS,
     "library(libpath=None) -> dict: the libnghttp2 in use (loaded now if no Server loaded it "
     "yet): path, version, "
     "reset_rate_limit and max_continuations (whether its rapid-reset and CONTINUATION-flood "
     "limits are set)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "embedtriton._h2",
    "The network transports: gRPC over HTTP/2 (libnghttp2) and HTTP/1.1, each on one IO thread.",
    -1,
    module_methods,
    NULL,
    NULL,
    NULL,
    NULL};

PyMODINIT_FUNC PyInit__h2(void)
{
  if (PyType_Ready(&ServerType) < 0 || PyType_Ready(&CallType) < 0) return NULL;
  PyObject* m = PyModule_Create(&module_def);
  if (!m) return NULL;
  PyObject* reply = PyCapsule_New((void*)&h2_reply, H2_REPLY_CAPSULE, NULL);
  Py_INCREF(&ServerType);
  Py_INCREF(&CallType);
  if (PyModule_AddObject(m, "Server", (PyObject*)&ServerType) < 0 ||
      PyModule_AddObject(m, "Call", (PyObject*)&CallType) < 0 || http1_add_types(m) < 0 || !reply ||
      PyModule_AddObjectRef(m, "_REPLY", reply) < 0) {
    Py_XDECREF(reply);
    Py_DECREF(m);
    return NULL;
  }
  Py_DECREF(reply);
  PyObject* atexit = PyImport_ImportModule("atexit");
  PyObject* fn = atexit ? PyObject_GetAttrString(m, "_stop_all") : NULL;
  PyObject* r = fn ? PyObject_CallMethod(atexit, "register", "O", fn) : NULL;
  Py_XDECREF(r);
  Py_XDECREF(fn);
  Py_XDECREF(atexit);
  if (!r) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
