/* The C interface _h2 offers _native (a PyCapsule, embedtriton._h2._REPLY): answering a unary
 * call from any thread without the GIL, for ModelInfer requests that _native completes itself
 * (kserve.c). The two modules are separate extensions: _native fetches the table once.
 *
 *   message(len, &payload): a response message buffer (owned by the caller until reply()): write
 *       len bytes at payload; NULL when out of memory.
 *   reply(call, message, code, text): with message (may be NULL), send it as Call.send() would
 *       (max message size: RESOURCE_EXHAUSTED; the call's response compression; the buffered-bytes
 *       limits) and then, or without one, finish the call with code and text (NUL-terminated), as
 *       Call.finish(). Takes the message over. Returns whether the call was still open. The caller
 *       holds a reference to call (an embedtriton._h2.Call) until reply() returns, which needs no
 *       GIL and no Python.
 *   call_type: embedtriton._h2.Call, to check the object handed over.
 *   http_reply(call, status, fields, body, len): answer an HTTP/1.1 request (an
 *       embedtriton._h2.HttpCall, http_call_type) whole, as HttpCall.respond() does: the status
 *       line, `fields` ("Name: value\r\n" lines, NUL-terminated, trusted), Content-Length and the
 *       body (copied). Returns whether the request was still open. Any thread, no GIL; takes
 *       the caller's reference to call over (the server's IO thread releases it).
 *   http_on_gone(call, fn): with the GIL, as setting HttpCall.on_gone: fn (a callable, or None) is
 *       called once, with no arguments, if the request's client leaves before its answer is
 *       complete (at once if it already has). 0, or -1 with an exception. */
#ifndef EMBEDTRITON_H2_REPLY_H
#define EMBEDTRITON_H2_REPLY_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#define H2_REPLY_CAPSULE "embedtriton._h2._REPLY"

typedef struct H2Reply {
  void* (*message)(size_t len, uint8_t** payload);
  int (*reply)(PyObject* call, void* message, int code, const char* text);
  void (*discard)(void* message);
  PyTypeObject* call_type;
  int (*http_reply)(PyObject* call, int status, const char* fields, const void* body, size_t len);
  PyTypeObject* http_call_type;
  int (*http_on_gone)(PyObject* call, PyObject* fn);
} H2Reply;

/* The other way round: the C handler _native offers _h2's HttpServer for plain HTTP/REST
 * inference requests (a PyCapsule, embedtriton._native._HTTP_FAST, set_fast()). The IO thread hands
 * a batch of requests over in two steps, so that the GIL is held only for the Python objects:
 *
 *   prepare(call, url, url_len, body, body_len, header_len, ctx): with the GIL, before on_request:
 *       the request's state when the handler may take it (its model is in the table: the Python
 *       objects it needs are made and held), NULL when it declines (on_request gets it).
 *       header_len: Inference-Header-Content-Length, -1 without one. ctx: set_fast()'s.
 *   submit(state): without the GIL, on the same thread: decode and hand the request to Triton.
 *       1 taken: the handler answers the call (http_reply) and let go of the state; 0 declined.
 *   abandon(state): with the GIL, after submit() declined: let go of the state (then on_request
 *       gets the request, which words what is wrong with it). */
#define H1_FAST_CAPSULE "embedtriton._native._HTTP_FAST"

typedef struct H1FastOps {
  void* (*prepare)(PyObject* call, const char* url, size_t url_len, const uint8_t* body,
                   size_t body_len, long long header_len, PyObject* ctx);
  int (*submit)(void* state);
  void (*abandon)(void* state);
} H1FastOps;

#endif
