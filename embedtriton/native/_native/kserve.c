/* A unary gRPC ModelInfer answered in C: the ModelInferRequest protobuf decoded
 * straight into a Triton request (inputs point into the received message, no
 * copy, where they are aligned for their datatype) and handed to Triton; the
 * ModelInferResponse is encoded from Triton's output buffers on Triton's thread
 * and handed to the _h2 stream through its C interface (h2_reply.h), without
 * the GIL: no Python on the completion path.
 *
 * grpc_model_infer() takes only plain requests and declines the rest (None): the Python
 * path (frontends/grpc/infer.py) then runs as before and words any error. Plain:
 * well-formed protobuf in the subset below; ASCII strings without NUL (names and the id at
 * most 255 characters); no tensor parameters; no request parameters but one that a unary
 * call ignores; raw contents only (no typed contents); numeric datatypes; at most MAX_DIMS
 * non-negative dimensions; no empty batch; distinct input names; each input's raw bytes
 * exactly filling its shape; a model that Python's table admits (a bound model, not
 * decoupled, no optional inputs, no batch rule) with no queue gate; and a request that
 * Triton takes. The decoder is bounded: every length is checked against the bytes present,
 * varints have at most 10 bytes, at most KS_MAX_TENSORS inputs and outputs, nothing is
 * allocated from a declared size.
 *
 * ModelInferRequest: model_name=1 model_version=2 id=3 parameters=4 inputs=5
 *   (name=1 datatype=2 shape=3 parameters=4 contents=5) outputs=6 (name=1
 *   parameters=2) raw_input_contents=7.
 * ModelInferResponse: model_name=1 model_version=2 id=3 outputs=5 (name=1
 *   datatype=2 shape=3) raw_output_contents=6, written in field order as
 *   protobuf serializes them. */
#include "native.h"

#include "h2_reply.h"

#define KS_MAX_TENSORS 64

typedef struct {
  const uint8_t* p;
  size_t n;
} Slice;

typedef struct {
  Slice name, datatype;
  int ndim;
  int64_t shape[MAX_DIMS];
} KsInput;

typedef struct {
  Slice model, version, id;
  int n_inputs, n_outputs, n_raw;
  KsInput inputs[KS_MAX_TENSORS];
  Slice outputs[KS_MAX_TENSORS];
  Slice raw[KS_MAX_TENSORS]; /* (those past the inputs are not used, as in the Python path) */
} KsRequest;

/* ---- decoding ------------------------------------------------------------ */

enum { WIRE_VARINT = 0, WIRE_I64 = 1, WIRE_LEN = 2, WIRE_I32 = 5 };

static int get_varint(const uint8_t** p, const uint8_t* end, uint64_t* v)
{
  uint64_t r = 0;
  for (int i = 0; i < 10 && *p < end; i++) {
    uint8_t b = *(*p)++;
    r |= (uint64_t)(b & 0x7f) << (7 * i);
    if (!(b & 0x80)) {
      *v = r;
      return 0;
    }
  }
  return -1;
}

/* The next field's number and wire type; -1 for what protobuf refuses or this decoder does not
 * take (field 0, groups, wire types 6 and 7). */
static int get_tag(const uint8_t** p, const uint8_t* end, uint32_t* field, int* wire)
{
  uint64_t tag;
  if (get_varint(p, end, &tag) < 0 || tag > UINT32_MAX) return -1;
  *field = (uint32_t)(tag >> 3);
  *wire = (int)(tag & 7);
  return *field == 0 || (*wire != WIRE_VARINT && *wire != WIRE_I64 && *wire != WIRE_LEN &&
                         *wire != WIRE_I32)
             ? -1
             : 0;
}

static int get_len(const uint8_t** p, const uint8_t* end, Slice* s)
{
  uint64_t n;
  if (get_varint(p, end, &n) < 0 || n > (uint64_t)(end - *p)) return -1;
  s->p = *p;
  s->n = (size_t)n;
  *p += n;
  return 0;
}

/* A string field: ASCII without NUL (protobuf checks UTF-8 and Triton's C strings end at a NUL:
 * the Python path words those cases). */
static int get_text(const uint8_t** p, const uint8_t* end, int wire, Slice* s)
{
  if (wire != WIRE_LEN || get_len(p, end, s) < 0) return -1;
  for (size_t i = 0; i < s->n; i++)
    if (s->p[i] == 0 || s->p[i] >= 0x80) return -1;
  return 0;
}

static int skip(const uint8_t** p, const uint8_t* end, int wire)
{
  uint64_t v;
  Slice s;
  size_t n = wire == WIRE_I64 ? 8 : 4;
  switch (wire) {
    case WIRE_VARINT: return get_varint(p, end, &v);
    case WIRE_LEN: return get_len(p, end, &s);
    default:
      if ((size_t)(end - *p) < n) return -1;
      *p += n;
      return 0;
  }
}

static int add_dim(KsInput* in, uint64_t v)
{
  if (in->ndim >= MAX_DIMS || (int64_t)v < 0) return -1;
  in->shape[in->ndim++] = (int64_t)v;
  return 0;
}

static int decode_input(Slice m, KsInput* in)
{
  const uint8_t *p = m.p, *end = m.p + m.n;
  memset(in, 0, sizeof *in);
  while (p < end) {
    uint32_t field;
    int wire;
    uint64_t v;
    Slice s;
    if (get_tag(&p, end, &field, &wire) < 0) return -1;
    if (field == 1) {
      if (get_text(&p, end, wire, &in->name) < 0) return -1;
    } else if (field == 2) {
      if (get_text(&p, end, wire, &in->datatype) < 0) return -1;
    } else if (field == 3 && wire == WIRE_VARINT) {
      if (get_varint(&p, end, &v) < 0 || add_dim(in, v) < 0) return -1;
    } else if (field == 3 && wire == WIRE_LEN) { /* packed */
      if (get_len(&p, end, &s) < 0) return -1;
      const uint8_t *q = s.p, *qend = s.p + s.n;
      while (q < qend)
        if (get_varint(&q, qend, &v) < 0 || add_dim(in, v) < 0) return -1;
    } else if (field <= 5) { /* parameters, contents, or a known field with another wire type */
      return -1;
    } else if (skip(&p, end, wire) < 0) {
      return -1;
    }
  }
  return 0;
}

static int decode_output(Slice m, Slice* name)
{
  const uint8_t *p = m.p, *end = m.p + m.n;
  name->p = m.p;
  name->n = 0;
  while (p < end) {
    uint32_t field;
    int wire;
    if (get_tag(&p, end, &field, &wire) < 0) return -1;
    if (field == 1) {
      if (get_text(&p, end, wire, name) < 0) return -1;
    } else if (field == 2 || skip(&p, end, wire) < 0) { /* parameters: not plain */
      return -1;
    }
  }
  return 0;
}

static int slice_eq(Slice a, Slice b)
{
  return a.n == b.n && memcmp(a.p, b.p, a.n) == 0;
}

static int slice_is(Slice a, const char* s)
{
  return a.n == strlen(s) && memcmp(a.p, s, a.n) == 0;
}

/* A numeric datatype's Triton type, or INVALID (BYTES, BF16 and unknown names: not plain). */
static TRITONSERVER_DataType numeric_type(Slice name)
{
  for (int t = TRITONSERVER_TYPE_BOOL; t <= TRITONSERVER_TYPE_FP64; t++)
    if (t != TRITONSERVER_TYPE_BYTES && slice_is(name, dtype_name(t)))
      return (TRITONSERVER_DataType)t;
  return TRITONSERVER_TYPE_INVALID;
}

/* A well-formed InferParameter value (any of its kinds): 0, else -1. */
static int parameter_value(Slice m)
{
  const uint8_t *p = m.p, *end = m.p + m.n;
  while (p < end) {
    uint32_t field;
    int wire;
    Slice s;
    if (get_tag(&p, end, &field, &wire) < 0) return -1;
    if (field == 3) {
      if (get_text(&p, end, wire, &s) < 0) return -1;
    } else if (field <= 5 && wire != (field == 4 ? WIRE_I64 : WIRE_VARINT)) {
      return -1;
    } else if (skip(&p, end, wire) < 0) {
      return -1;
    }
  }
  return 0;
}

/* A request parameter (a map entry: key=1, value=2) that a unary ModelInfer ignores: 0, else -1.
 * Only triton_enable_empty_final_response (which perf_analyzer sends) is: it matters to streams
 * alone (kserve.apply_parameters drops it). */
static int ignored_parameter(Slice m)
{
  const uint8_t *p = m.p, *end = m.p + m.n;
  Slice key = {m.p, 0}, value;
  while (p < end) {
    uint32_t field;
    int wire;
    if (get_tag(&p, end, &field, &wire) < 0) return -1;
    if (field == 1) {
      if (get_text(&p, end, wire, &key) < 0) return -1;
    } else if (field == 2) {
      if (wire != WIRE_LEN || get_len(&p, end, &value) < 0 || parameter_value(value) < 0) return -1;
    } else if (skip(&p, end, wire) < 0) {
      return -1;
    }
  }
  return slice_is(key, "triton_enable_empty_final_response") ? 0 : -1;
}

/* Decode a ModelInferRequest into r: 0 for a plain request, -1 for anything else. */
static int ks_decode(const uint8_t* data, size_t len, KsRequest* r)
{
  const uint8_t *p = data, *end = data + len;
  r->model = r->version = r->id = (Slice){data, 0};
  r->n_inputs = r->n_outputs = r->n_raw = 0;
  while (p < end) {
    uint32_t field;
    int wire;
    Slice s;
    if (get_tag(&p, end, &field, &wire) < 0) return -1;
    switch (field) {
      case 1:
        if (get_text(&p, end, wire, &r->model) < 0) return -1;
        break;
      case 2:
        if (get_text(&p, end, wire, &r->version) < 0) return -1;
        break;
      case 3:
        if (get_text(&p, end, wire, &r->id) < 0) return -1;
        break;
      case 5:
        if (wire != WIRE_LEN || get_len(&p, end, &s) < 0 || r->n_inputs == KS_MAX_TENSORS ||
            decode_input(s, &r->inputs[r->n_inputs++]) < 0)
          return -1;
        break;
      case 6:
        if (wire != WIRE_LEN || get_len(&p, end, &s) < 0 || r->n_outputs == KS_MAX_TENSORS ||
            decode_output(s, &r->outputs[r->n_outputs++]) < 0)
          return -1;
        break;
      case 7:
        if (wire != WIRE_LEN || get_len(&p, end, &s) < 0) return -1;
        if (r->n_raw < KS_MAX_TENSORS) r->raw[r->n_raw] = s;
        if (r->n_raw < INT_MAX) r->n_raw++;
        break;
      case 4: /* request parameters: the Python path interprets them, all but one */
        if (wire != WIRE_LEN || get_len(&p, end, &s) < 0 || ignored_parameter(s) < 0) return -1;
        break;
      default:
        if (skip(&p, end, wire) < 0) return -1;
    }
  }
  return 0;
}

/* The checks of the Python path (Inference.decode, kserve.array_from_bytes) that the request
 * passes as it is: 0, or -1 where the Python path would refuse it or read it another way. */
static int ks_plain(const KsRequest* r)
{
  if (r->model.n == 0 || r->n_inputs > r->n_raw) return -1;
  for (int i = 0; i < r->n_inputs; i++) {
    const KsInput* in = &r->inputs[i];
    TRITONSERVER_DataType t = numeric_type(in->datatype);
    if (t == TRITONSERVER_TYPE_INVALID || (in->ndim > 0 && in->shape[0] == 0)) return -1;
    uint64_t bytes = dtype_size(t);
    for (int d = 0; d < in->ndim; d++)
      if (__builtin_mul_overflow(bytes, (uint64_t)in->shape[d], &bytes)) return -1;
    if (bytes != r->raw[i].n) return -1;
    for (int j = 0; j < i; j++)
      if (slice_eq(in->name, r->inputs[j].name)) return -1;
  }
  return 0;
}

/* ---- encoding ------------------------------------------------------------ */

static size_t varint_size(uint64_t v)
{
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static uint8_t* put_varint(uint8_t* p, uint64_t v)
{
  while (v >= 0x80) {
    *p++ = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  *p++ = (uint8_t)v;
  return p;
}

/* A length-delimited field (numbers below 16: a one-byte tag). */
static size_t field_size(size_t n)
{
  return 1 + varint_size(n) + n;
}

static uint8_t* put_field(uint8_t* p, int field, const void* data, size_t n)
{
  *p++ = (uint8_t)(field << 3 | WIRE_LEN);
  p = put_varint(p, n);
  if (n) memcpy(p, data, n);
  return p + n;
}

/* A string field as proto3 writes it: not at all when empty. */
static size_t text_size(size_t n)
{
  return n ? field_size(n) : 0;
}

static uint8_t* put_text(uint8_t* p, int field, const void* data, size_t n)
{
  return n ? put_field(p, field, data, n) : p;
}

typedef struct {
  const char* name;
  TRITONSERVER_DataType dtype;
  const int64_t* shape;
  uint64_t ndim;
  const void* base;
  size_t size;
  TRITONSERVER_MemoryType mtype;
  size_t packed; /* bytes of its packed shape */
  size_t tensor; /* bytes of its InferOutputTensor */
} KsOutput;

/* The error of an encoding that failed (code, text), as the Python path reports it. */
typedef struct {
  int code;
  const char* text;
} KsError;

/* Encode the ModelInferResponse of a response into a message of the _h2 interface (NULL with
 * *e set when it cannot be). */
static void* ks_encode(const H2Reply* h2, Slice model, Slice version, Slice id,
                       TRITONSERVER_InferenceResponse* resp, KsError* e)
{
  static KsError no_numpy = {TRITONSERVER_ERROR_UNSUPPORTED,
                             "output datatype has no numpy equivalent"};
  uint32_t count = 0;
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceResponseOutputCount(resp, &count);
  KsOutput* outs = err == NULL ? calloc(count ? count : 1, sizeof(KsOutput)) : NULL;
  if (outs == NULL) {
    if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
    *e = (KsError){TRITONSERVER_ERROR_INTERNAL, "cannot read Triton's response"};
    return NULL;
  }
  if (version.n == 0) version = (Slice){(const uint8_t*)"1", 1}; /* as encode() does */
  size_t total = text_size(model.n) + text_size(version.n) + text_size(id.n);
  for (uint32_t i = 0; i < count; i++) {
    KsOutput* o = &outs[i];
    int64_t mtype_id;
    void* userp;
    if ((err = api.TRITONSERVER_InferenceResponseOutput(resp, i, &o->name, &o->dtype, &o->shape,
                                                        &o->ndim, &o->base, &o->size, &o->mtype,
                                                        &mtype_id, &userp))) {
      api.TRITONSERVER_ErrorDelete(err);
      *e = (KsError){TRITONSERVER_ERROR_INTERNAL, "cannot read Triton's response"};
      goto fail;
    }
    if ((o->dtype != TRITONSERVER_TYPE_BYTES && numpy_typenum_of(o->dtype) < 0) ||
        o->ndim > MAX_DIMS) {
      *e = no_numpy;
      goto fail;
    }
    for (uint64_t d = 0; d < o->ndim; d++) o->packed += varint_size((uint64_t)o->shape[d]);
    o->tensor = text_size(strlen(o->name)) + text_size(strlen(dtype_name(o->dtype))) +
                (o->ndim ? field_size(o->packed) : 0);
    total += field_size(o->tensor) + field_size(o->size);
  }
  uint8_t* p;
  void* message = h2->message(total, &p);
  if (message == NULL) {
    *e = (KsError){TRITONSERVER_ERROR_UNAVAILABLE, "out of memory encoding the response"};
    goto fail;
  }
  p = put_text(p, 1, model.p, model.n);
  p = put_text(p, 2, version.p, version.n);
  p = put_text(p, 3, id.p, id.n);
  for (uint32_t i = 0; i < count; i++) {
    KsOutput* o = &outs[i];
    const char* dt = dtype_name(o->dtype);
    *p++ = 5 << 3 | WIRE_LEN;
    p = put_varint(p, o->tensor);
    p = put_text(p, 1, o->name, strlen(o->name));
    p = put_text(p, 2, dt, strlen(dt));
    if (o->ndim) {
      *p++ = 3 << 3 | WIRE_LEN;
      p = put_varint(p, o->packed);
      for (uint64_t d = 0; d < o->ndim; d++) p = put_varint(p, (uint64_t)o->shape[d]);
    }
  }
  for (uint32_t i = 0; i < count; i++) {
    KsOutput* o = &outs[i];
    *p++ = 6 << 3 | WIRE_LEN;
    p = put_varint(p, o->size);
    if (o->mtype == TRITONSERVER_MEMORY_GPU) {
      const char* why = cuda_copy(p, o->base, o->size);
      if (why != NULL) {
        h2->discard(message);
        *e = (KsError){TRITONSERVER_ERROR_INTERNAL, why};
        goto fail;
      }
    } else if (o->size) {
      memcpy(p, o->base, o->size);
    }
    p += o->size;
  }
  free(outs);
  return message;
fail:
  free(outs);
  return NULL;
}

/* ---- the call ------------------------------------------------------------ */

/* Triton's error codes as gRPC status codes (frontends/grpc/transport.py code_of, of the
 * exception errors.error_for_code makes). */
static int grpc_code(int code)
{
  static const int codes[] = {13, 13, 5, 3, 14, 12, 6, 1};
  return code >= 0 && code < (int)(sizeof codes / sizeof codes[0]) ? codes[code] : 13;
}

/* A Triton error message without its "[request id: ...] " prefix (error_for_code). */
static const char* without_request_id(const char* m)
{
  if (strncmp(m, "[request id: ", 13) == 0) {
    const char* end = strstr(m, "] ");
    if (end != NULL && end > m) return end + 2;
  }
  return m;
}

typedef struct GrpcCall {
  Call c;                   /* first: the Call is freed as a whole (calls.c) */
  PyObject* call;           /* the _h2 call (c.future holds the reference) */
  Slice model, version, id; /* in the message (c.keep[0]) */
  void* copies;             /* inputs not aligned in the message, copied */
  struct GrpcCall* answered_next;
} GrpcCall;

static const H2Reply* h2 = NULL;
static atomic_llong n_taken, n_declined;

/* Calls answered on Triton's threads: their _h2 call (which holds the cancel handle, which holds
 * the call) and the caller's reference are let go of by the next grpc_release, with the GIL. */
static _Atomic(GrpcCall*) answered = NULL;

/* With the GIL: let go of what answered calls hold, and free those that are done. */
static void grpc_release(void)
{
  GrpcCall* g = atomic_load_explicit(&answered, memory_order_relaxed)
                    ? atomic_exchange(&answered, NULL)
                    : NULL;
  while (g != NULL) {
    GrpcCall* next = g->answered_next;
    Py_CLEAR(g->c.future);
    call_unref(&g->c); /* the caller's */
    g = next;
  }
  call_free_later();
}

/* Triton's final response completed the call (its thread, no GIL): answer it. */
static void grpc_finish(Call* c)
{
  GrpcCall* g = (GrpcCall*)c;
  TRITONSERVER_InferenceResponse* resp = atomic_load(&c->response);
  TRITONSERVER_Error* err = resp != NULL ? api.TRITONSERVER_InferenceResponseError(resp) : NULL;
  void* message = NULL;
  KsError e = {0, ""};
  if (resp == NULL) {
    e = (KsError){TRITONSERVER_ERROR_INTERNAL, "Triton completed the request without a response"};
  } else if (err != NULL) {
    e = (KsError){api.TRITONSERVER_ErrorCode(err),
                  without_request_id(api.TRITONSERVER_ErrorMessage(err))};
  } else {
    message = ks_encode(h2, g->model, g->version, g->id, resp, &e);
  }
  h2->reply(g->call, message, message != NULL ? 0 : grpc_code(e.code), message ? "" : e.text);
  resp = atomic_exchange(&c->response, NULL);
  if (resp != NULL) bury(NULL, resp); /* (its model may go once Triton deleted it) */
  g->answered_next = atomic_load(&answered);
  while (!atomic_compare_exchange_weak(&answered, &g->answered_next, g)) {
  }
}

/* With the GIL: stop() completed the call (claimed) before Triton did. */
static void grpc_wake(Call* c)
{
  h2->reply(((GrpcCall*)c)->call, NULL, 14, "the server stopped before this request completed");
  Py_CLEAR(c->future);
  call_unref(c);
}

/* With the GIL (call_free_later): the message Triton read from, and copies of it. */
static void grpc_destroy(Call* c)
{
  call_drop_inputs(c);
  free(((GrpcCall*)c)->copies);
}

static const CallOps grpc_ops = {.response = call_one_response,
                                 .finish = grpc_finish,
                                 .wake = grpc_wake,
                                 .destroy = grpc_destroy,
                                 .free_later = 1};

static void handle_free(PyObject* capsule)
{
  Call* c = (Call*)PyCapsule_GetPointer(capsule, "embedtriton.request");
  if (c != NULL) call_unref(c);
}

static int load_h2(void)
{
  if (h2 == NULL) {
    h2 = PyCapsule_Import(H2_REPLY_CAPSULE, 0);
    if (h2 == NULL) PyErr_Clear();
  }
  return h2 != NULL ? 0 : -1;
}

/* Whether a Triton call succeeded (its error dropped). */
static int fine(TRITONSERVER_Error* err)
{
  if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
  return err == NULL;
}

/* With servers_lock held (read): the request to Triton, built from r, answered on call. Returns
 * the call, or NULL when it is declined (nothing left behind). */
static GrpcCall* ks_submit(TRITONSERVER_Server* server, const char* model, long long version,
                           const KsRequest* r, PyObject* call, PyObject* data)
{
  char text[256]; /* one name at a time, NUL-terminated for Triton (which copies it) */
#define TEXT(s) (s.n < sizeof text ? (memcpy(text, s.p, s.n), text[s.n] = 0, text) : NULL)
  TRITONSERVER_InferenceRequest* req = NULL;
  if (!fine(api.TRITONSERVER_InferenceRequestNew(&req, server, model, version))) return NULL;
  GrpcCall* g = calloc(1, sizeof(GrpcCall));
  int ok = g != NULL;
  /* Inputs point into the message. One whose bytes are not aligned there for its datatype is
   * copied (into one block for all of them): the model's arrays are aligned, as they are on the
   * Python path, where protobuf copies each raw content into a bytes object of its own. */
  size_t copied = 0;
  for (int i = 0; i < r->n_inputs; i++)
    if ((uintptr_t)r->raw[i].p % dtype_size(numeric_type(r->inputs[i].datatype)))
      copied += (r->raw[i].n + 63) & ~(size_t)63;
  if (ok && copied && posix_memalign(&g->copies, 64, copied) != 0) {
    g->copies = NULL;
    ok = 0;
  }
  char* copy = g != NULL ? g->copies : NULL;
  for (int i = 0; ok && i < r->n_inputs; i++) {
    const KsInput* in = &r->inputs[i];
    TRITONSERVER_DataType t = numeric_type(in->datatype);
    const void* bytes = r->raw[i].p;
    if ((uintptr_t)bytes % dtype_size(t)) {
      memcpy(copy, bytes, r->raw[i].n);
      bytes = copy;
      copy += (r->raw[i].n + 63) & ~(size_t)63;
    }
    const char* name = TEXT(in->name);
    ok = name != NULL &&
         fine(api.TRITONSERVER_InferenceRequestAddInput(req, name, t, in->shape,
                                                        (uint64_t)in->ndim)) &&
         fine(api.TRITONSERVER_InferenceRequestAppendInputData(req, name, bytes, r->raw[i].n,
                                                               TRITONSERVER_MEMORY_CPU, 0));
  }
  for (int i = 0; ok && i < r->n_outputs; i++) {
    int again = 0; /* an output named twice is asked for once (kserve.requested_outputs) */
    for (int j = 0; j < i; j++) again |= slice_eq(r->outputs[i], r->outputs[j]);
    const char* name = again ? NULL : TEXT(r->outputs[i]);
    ok = again ||
         (name != NULL && fine(api.TRITONSERVER_InferenceRequestAddRequestedOutput(req, name)));
  }
  if (ok && r->id.n) {
    const char* id = TEXT(r->id);
    ok = id != NULL && fine(api.TRITONSERVER_InferenceRequestSetId(req, id));
  }
#undef TEXT
  Call* c = ok ? &g->c : NULL;
  ok = ok && fine(api.TRITONSERVER_InferenceRequestSetReleaseCallback(req, release_cb, c)) &&
       fine(api.TRITONSERVER_InferenceRequestSetResponseCallback(req, allocator, NULL, response_cb,
                                                                 c));
  if (!ok) { /* the Python path words what went wrong */
    api.TRITONSERVER_InferenceRequestDelete(req);
    if (g != NULL) free(g->copies);
    free(g);
    return NULL;
  }
  c->server = server;
  c->request = req;
  c->out_device = -1;
  c->keep = c->keep_inline;
  c->keep[c->n_keep++] = Py_NewRef(data);
  c->future = Py_NewRef(call);
  g->call = call;
  g->model = r->model;
  g->version = r->version;
  g->id = r->id;
  call_set_ops(c, &grpc_ops);
  /* the caller's (dropped once it answered), Triton's two, the cancel handle's */
  atomic_init(&c->refs, 4);
  held_add(c);
  atomic_fetch_add(&in_flight, 1);
  /* With the GIL, as submit() hands over an asynchronous call: letting it go for the hand-over,
   * which does not block, would let the model thread in and leave the IO thread queueing for
   * the GIL behind it at each request (a convoy under load). (A model with a batch rule, whose
   * batcher calls Python, is not taken.) */
  TRITONSERVER_Error* err = api.TRITONSERVER_ServerInferAsync(server, req, NULL);
  if (!fine(err)) { /* not taken: no callbacks; the Python path says why */
    held_release(c);
    call_claim(c);
    api.TRITONSERVER_InferenceRequestDelete(req);
    call_drop_inputs(c);
    Py_CLEAR(c->future);
    free(g->copies);
    free(g);
    return NULL;
  }
  return g;
}

/* grpc_model_infer(call, data, table, bound, server): see the top of this file. table maps
 * (model_name, model_version) to (binding, version) for a model the C path may take, version
 * None for one it may not; bound is the server's name -> binding (an entry holds while its
 * binding is still the bound one). Returns the cancel handle of a call taken; None for one
 * declined; (model_name, model_version) when the table has no valid entry for them. */
PyObject* py_grpc_model_infer(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs != 5 || !PyBytes_Check(args[1]) || !PyDict_Check(args[2]) || !PyDict_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "grpc_model_infer(call, data: bytes, table, bound, server)");
    return NULL;
  }
  grpc_release();
  PyObject *call = args[0], *data = args[1], *server_arg = args[4];
  KsRequest* r = malloc(sizeof(KsRequest));
  PyObject *key = NULL, *result = Py_None;
  if (r == NULL || !api_loaded || server_arg == Py_None || load_h2() < 0 ||
      !PyObject_TypeCheck(call, h2->call_type) ||
      ks_decode((const uint8_t*)PyBytes_AS_STRING(data), (size_t)PyBytes_GET_SIZE(data), r) < 0 ||
      ks_plain(r) < 0)
    goto decline;
  key = Py_BuildValue("(s#s#)", (const char*)r->model.p, (Py_ssize_t)r->model.n,
                      (const char*)r->version.p, (Py_ssize_t)r->version.n);
  PyObject* entry = key != NULL ? PyDict_GetItemWithError(args[2], key) : NULL;
  PyObject* bound =
      entry != NULL ? PyDict_GetItemWithError(args[3], PyTuple_GET_ITEM(key, 0)) : NULL;
  if (PyErr_Occurred()) goto fail;
  if (bound == NULL) bound = Py_None; /* (not bound: the entry says None) */
  if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 2 ||
      bound != PyTuple_GET_ITEM(entry, 0)) {
    result = key; /* Python decides, and calls again */
    key = NULL;
    goto done;
  }
  if (PyTuple_GET_ITEM(entry, 1) == Py_None) goto decline;
  long long version = PyLong_AsLongLong(PyTuple_GET_ITEM(entry, 1));
  TRITONSERVER_Server* server = (TRITONSERVER_Server*)PyLong_AsVoidPtr(server_arg);
  if (PyErr_Occurred()) goto fail;
  const char* model = PyUnicode_AsUTF8(PyTuple_GET_ITEM(key, 0));
  if (model == NULL) goto fail;
  pthread_rwlock_rdlock(&servers_lock);
  Gate* gate = server_is_open(server) ? gate_find(server, model, version) : NULL;
  GrpcCall* g = NULL;
  if (server_is_open(server) && gate == NULL) g = ks_submit(server, model, version, r, call, data);
  pthread_rwlock_unlock(&servers_lock);
  if (gate != NULL) gate_release_ref(gate);
  if (g == NULL) goto decline;
  atomic_fetch_add(&n_taken, 1);
  delete_buried(GRAVE_STEP_ASYNC); /* (as submit() does for an asynchronous call) */
  result = PyCapsule_New(&g->c, "embedtriton.request", handle_free);
  if (result == NULL) call_unref(&g->c);
  goto done;
decline:
  atomic_fetch_add(&n_declined, 1);
  result = Py_NewRef(Py_None);
  goto done;
fail:
  result = NULL;
done:
  Py_XDECREF(key);
  free(r);
  return result;
}

/* grpc_release(): let go of the calls answered since the last grpc_model_infer (their _h2
 * calls and messages), e.g. as the endpoint stops. */
PyObject* py_grpc_release(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  grpc_release();
  Py_RETURN_NONE;
}

/* grpc_stats() -> (taken, declined): ModelInfer calls grpc_model_infer took and declined. */
PyObject* py_grpc_stats(PyObject* self, PyObject* unused)
{
  (void)self, (void)unused;
  return Py_BuildValue("(LL)", (long long)atomic_load(&n_taken),
                       (long long)atomic_load(&n_declined));
}

/* kserve_decode(data) -> dict or None: what grpc_model_infer reads of a ModelInferRequest (None:
 * not plain), for tests: model_name, model_version, id, inputs [(name, datatype, shape, raw)],
 * outputs [names]. */
PyObject* py_kserve_decode(PyObject* self, PyObject* arg)
{
  (void)self;
  if (!PyBytes_Check(arg)) {
    PyErr_SetString(PyExc_TypeError, "kserve_decode(data: bytes)");
    return NULL;
  }
  KsRequest* r = malloc(sizeof(KsRequest));
  if (r == NULL) return PyErr_NoMemory();
  if (ks_decode((const uint8_t*)PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg), r) < 0 ||
      ks_plain(r) < 0) {
    free(r);
    Py_RETURN_NONE;
  }
  PyObject* inputs = PyList_New(0);
  PyObject* outputs = PyList_New(0);
  for (int i = 0; inputs && i < r->n_inputs; i++) {
    const KsInput* in = &r->inputs[i];
    PyObject* shape = PyTuple_New(in->ndim);
    for (int d = 0; shape && d < in->ndim; d++)
      PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(in->shape[d]));
    PyObject* item = shape ? Py_BuildValue("(s#s#Ny#)", in->name.p, (Py_ssize_t)in->name.n,
                                           in->datatype.p, (Py_ssize_t)in->datatype.n, shape,
                                           r->raw[i].p, (Py_ssize_t)r->raw[i].n)
                           : NULL;
    if (item == NULL || PyList_Append(inputs, item) < 0) Py_CLEAR(inputs);
    Py_XDECREF(item);
  }
  for (int i = 0; outputs && i < r->n_outputs; i++) {
    PyObject* item =
        PyUnicode_FromStringAndSize((const char*)r->outputs[i].p, (Py_ssize_t)r->outputs[i].n);
    if (item == NULL || PyList_Append(outputs, item) < 0) Py_CLEAR(outputs);
    Py_XDECREF(item);
  }
  PyObject* result = inputs && outputs
                         ? Py_BuildValue("{s:s#,s:s#,s:s#,s:O,s:O}", "model_name", r->model.p,
                                         (Py_ssize_t)r->model.n, "model_version", r->version.p,
                                         (Py_ssize_t)r->version.n, "id", r->id.p,
                                         (Py_ssize_t)r->id.n, "inputs", inputs, "outputs", outputs)
                         : NULL;
  Py_XDECREF(inputs);
  Py_XDECREF(outputs);
  free(r);
  return result;
}
