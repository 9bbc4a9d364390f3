/* What every file reads and module.c fills once: the Triton API table resolved from the runtime
 * Python loaded (load()), Triton's response allocator (memory.c's functions), Python's hooks
 * (set_hooks()) and the interned names (the module's init); and what this thread is. Defined here,
 * at the bottom of the layers, so that the files below module.c need nothing of it. */
#include "common.h"

et_api_t api;
int api_loaded = 0;
TRITONSERVER_ResponseAllocator* allocator = NULL;

/* Hooks installed from Python by set_hooks(). */
PyObject* g_bindings = NULL;     /* dict: model directory -> Binding */
PyObject* g_request_type = NULL; /* embedtriton.backend.request.Request */
PyObject* g_make_error = NULL;   /* (code, message) -> TritonError */
PyObject* g_decode_bytes = NULL; /* (bytes, shape) -> object array */
PyObject* g_encode_bytes = NULL; /* array -> bytes (Triton BYTES) */
PyObject* g_complete = NULL;     /* our own _complete, for asyncio */
PyObject* g_request_done = NULL; /* (request key) -> None: close its generator */
PyObject *s_call_soon_threadsafe, *s_parameters, *s_execute, *s_max_batch_size, *s_output_specs,
    *s_name, *s_done, *s_set_result, *s_set_exception;

/* What this thread is doing (threads.c's waits, graveyard.c's deletes and servers.c's drain ask).
 */
__thread int t_in_execute = 0;
__thread int t_model_thread = 0;
