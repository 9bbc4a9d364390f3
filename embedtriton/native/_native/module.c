/* The Python module embedtriton._native: the Triton API resolved from the
 * runtime Python loaded, the hooks Python installs (both kept in api.c), and the
 * module's function table (the functions themselves live in the other files, see
 * common.h). */
#define NATIVE_IMPORTS_ARRAY /* this file's import_array() fills the numpy API table */
#include "common.h"

#include "backend.h"
#include "cancel.h"
#include "complete.h"
#include "cuda.h"
#include "device_array.h"
#include "gates.h"
#include "graveyard.h"
#include "kserve.h"
#include "kserve_grpc.h"
#include "kserve_http.h"
#include "kserve_json.h"
#include "kserve_pb.h"
#include "many.h"
#include "memory.h"
#include "servers.h"
#include "streams.h"
#include "submit.h"
#include "threads.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <unistd.h>

/* ---- module ------------------------------------------------------------ */

/* load(handle): resolve the Triton functions from the runtime Python loaded. */
static PyObject* py_load(PyObject* self, PyObject* arg)
{
  (void)self;
  void* handle = PyLong_AsVoidPtr(arg);
  if (PyErr_Occurred()) return NULL;
  if (api_loaded) Py_RETURN_NONE;
  et_api_t loaded;
#define ET_RESOLVE(ret, name, params)                                                             \
  *(void**)&loaded.name = dlsym(handle, #name);                                                   \
  if (loaded.name == NULL)                                                                        \
    return PyErr_Format(PyExc_RuntimeError, "the Triton runtime lacks %s: it is older than 2.51", \
                        #name);
  ET_TRITON_FUNCTIONS(ET_RESOLVE)
#undef ET_RESOLVE
  api = loaded;
  TRITONSERVER_Error* err = api.TRITONSERVER_ResponseAllocatorNew(&allocator, response_alloc_fn,
                                                                  response_release_fn, NULL);
  if (err != NULL) return raise_from(err, 1);
  api_loaded = 1;
  Py_RETURN_NONE;
}

static PyObject* py_set_hooks(PyObject* self, PyObject* args)
{
  (void)self;
  PyObject *bindings, *request_type, *make_error, *decode, *encode, *request_done;
  if (!PyArg_ParseTuple(args, "O!OOOOO", &PyDict_Type, &bindings, &request_type, &make_error,
                        &decode, &encode, &request_done))
    return NULL;
  Py_XSETREF(g_request_done, Py_NewRef(request_done));
  Py_XSETREF(g_bindings, Py_NewRef(bindings));
  Py_XSETREF(g_request_type, Py_NewRef(request_type));
  Py_XSETREF(g_make_error, Py_NewRef(make_error));
  Py_XSETREF(g_decode_bytes, Py_NewRef(decode));
  Py_XSETREF(g_encode_bytes, Py_NewRef(encode));
  Py_RETURN_NONE;
}

static PyObject* py_in_model(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  return PyBool_FromLong(t_in_execute || t_model_thread);
}

static PyObject* py_mark_model_thread(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  t_model_thread = 1;
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"load", py_load, METH_O, "Resolve the Triton C API from a dlopen handle."},
    {"set_hooks", py_set_hooks, METH_VARARGS, "Install the Python hooks."},
    {"submit", (PyCFunction)(void (*)(void))py_submit, METH_FASTCALL,
     "Submit one inference request."},
    {"submit_many", (PyCFunction)(void (*)(void))py_submit_many, METH_FASTCALL,
     "Submit many requests, a window at a time; wait for all of them."},
    {"stream_next", (PyCFunction)(void (*)(void))py_stream_next, METH_FASTCALL,
     "Next response of a stream."},
    {"stream_close", py_stream_close, METH_O, "Close a stream (cancels it if unfinished)."},
    {"cancel", py_cancel, METH_O,
     "Cancel a request by the handle submit() gave (cancellable=True)."},
    {"grpc_model_infer", (PyCFunction)(void (*)(void))py_grpc_model_infer, METH_FASTCALL,
     "Take a unary gRPC ModelInfer in C (its cancel handle), or decline it (None)."},
    {"release_answered", py_release_answered, METH_NOARGS,
     "Let go of the calls the C paths answered since a request last took them; how many."},
    {"linger_stats", py_linger_stats, METH_NOARGS,
     "(lingers, caught): model threads' lingers after an execute, and those that met a request."},
    {"response_stats", py_response_stats, METH_NOARGS,
     "(kept, buried): responses deleted on the thread that sent them, and buried ones."},
    {"grpc_stats", py_grpc_stats, METH_NOARGS,
     "(taken, declined): ModelInfer calls grpc_model_infer took and declined."},
    {"http_stats", py_http_stats, METH_NOARGS,
     "(taken, declined): HTTP/REST inference requests the C path took and declined."},
    {"kserve_json_decode", (PyCFunction)(void (*)(void))py_kserve_json_decode, METH_FASTCALL,
     "What the HTTP C path reads of an inference request body (None: not plain)."},
    {"kserve_json_double", py_kserve_json_double, METH_O,
     "A float as the C path's JSON answers write it (Python's repr)."},
    {"kserve_decode", py_kserve_decode, METH_O,
     "What grpc_model_infer reads of a ModelInferRequest (None: not plain)."},
    {"_complete", (PyCFunction)(void (*)(void))py_complete, METH_FASTCALL,
     "Finish an asyncio call (event loop side)."},
    {"pending", py_pending, METH_O, "(calls not completed, requests Triton holds) of a server."},
    {"cancel_all", py_cancel_all, METH_O, "Cancel every request Triton holds for a server."},
    {"fail_pending", py_fail_pending, METH_O,
     "Fail every call of a server that Triton has not completed (stop's deadline)."},
    {"abort_pending", py_abort_pending, METH_O,
     "Fail every call of a deleted server that Triton never completed."},
    {"open_server", py_open_server, METH_O, "Accept requests for a server."},
    {"close_server", py_close_server, METH_O,
     "Stop accepting requests for a server (but model-to-model calls, until fail_pending)."},
    {"in_model", py_in_model, METH_NOARGS, "Whether this thread is running a model's callable."},
    {"mark_model_thread", py_mark_model_thread, METH_NOARGS,
     "This thread runs async callables (the library's event loop)."},
    {"finish_batch", py_finish_batch, METH_VARARGS,
     "finish_batch(batch, result): answer an async callable's batch (event loop side)."},
    {"delete_released", py_delete_released, METH_NOARGS,
     "Delete the requests and responses Triton released long enough ago; returns how many wait."},
    {"gate_stats", py_gate_stats, METH_O,
     "gate_stats(server) -> [(model, version, waiting, waited_ns, rejected, rejected_ns, "
     "cancelled, cancelled_ns)] of the queue policies' gates (queues.c)."},
    {"map_shared", py_map_shared, METH_VARARGS,
     "map_shared(fd, length) -> Mapping: map a shared-memory file, guarded against SIGBUS."},
    {"cuda_init", py_cuda_init, METH_O,
     "cuda_init(path) -> number of GPUs: load the CUDA runtime for device copies (once)."},
    {"device_array", py_device_array, METH_VARARGS,
     "device_array(ptr, shape, dtype, device, owner) -> DeviceArray: a view of device memory."},
    {"cuda_ipc_open", py_cuda_ipc_open, METH_VARARGS,
     "cuda_ipc_open(handle, device) -> int: open a CUDA IPC memory handle (64 bytes)."},
    {"cuda_ipc_close", py_cuda_ipc_close, METH_VARARGS,
     "cuda_ipc_close(ptr, device=0): close what cuda_ipc_open opened."},
    {"cuda_allocation_size", py_cuda_allocation_size, METH_VARARGS,
     "cuda_allocation_size(ptr, device) -> int: bytes from ptr to the end of its allocation."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, methods};

#define INTERN(var, text) \
  if ((var = PyUnicode_InternFromString(text)) == NULL) return NULL;

PyMODINIT_FUNC PyInit__native(void)
{
  import_array();
  const char* spin = getenv("EMBEDTRITON_SPIN_US");
  if (spin != NULL) spin_ns = strtoull(spin, NULL, 10) * 1000;
  const char* linger_us = getenv("EMBEDTRITON_LINGER_US");
  if (linger_us != NULL) linger_ns = strtoull(linger_us, NULL, 10) * 1000;
  long page = sysconf(_SC_PAGESIZE);
  if (page > 0) page_size = (uintptr_t)page;
  if (PyType_Ready(&MappingType) < 0 || PyType_Ready(&DeviceArrayType) < 0 ||
      PyType_Ready(&HoldType) < 0)
    return NULL;
  PyObject* m = PyModule_Create(&module);
  if (m == NULL) return NULL;
  if (PyModule_AddObjectRef(m, "DeviceArray", (PyObject*)&DeviceArrayType) < 0) return NULL;
  PyObject* fast = http_fast_capsule(); /* for _h2's HttpServer.set_fast */
  if (fast == NULL || PyModule_AddObject(m, "_HTTP_FAST", fast) < 0) {
    Py_XDECREF(fast);
    return NULL;
  }
  INTERN(s_call_soon_threadsafe, "call_soon_threadsafe");
  INTERN(s_parameters, "parameters");
  INTERN(s_execute, "execute");
  INTERN(s_max_batch_size, "max_batch_size");
  INTERN(s_output_specs, "output_specs");
  INTERN(s_name, "name");
  INTERN(s_done, "done");
  INTERN(s_set_result, "set_result");
  INTERN(s_set_exception, "set_exception");
  g_complete = PyObject_GetAttrString(m, "_complete");
  if (g_complete == NULL) return NULL;
  PyObject* threading = PyImport_ImportModule("threading");
  PyObject* main = threading ? PyObject_CallMethod(threading, "main_thread", NULL) : NULL;
  PyObject* ident = main ? PyObject_GetAttrString(main, "ident") : NULL;
  main_thread_ident = ident ? PyLong_AsUnsignedLong(ident) : 0;
  Py_XDECREF(ident), Py_XDECREF(main), Py_XDECREF(threading);
  if (PyErr_Occurred()) return NULL;
  return m;
}
