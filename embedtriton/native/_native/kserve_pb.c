/* The KServe-v2 protobuf subset that kserve.c answers in C: a bounded, zero-copy decoder of
 * ModelInferRequest (ks_decode: slices of the received message; ks_plain: the Python path's
 * checks it passes as it is) and the encoder of ModelInferResponse from Triton's output buffers
 * (ks_encode, into a message of the _h2 reply interface). No Python here but the tests' hook
 * kserve_decode(). Every length is checked against the bytes present, varints have at most 10
 * bytes, at most KS_MAX_TENSORS inputs and outputs, nothing is allocated from a declared size.
 *
 * ModelInferRequest: model_name=1 model_version=2 id=3 parameters=4 inputs=5
 *   (name=1 datatype=2 shape=3 parameters=4 contents=5) outputs=6 (name=1
 *   parameters=2) raw_input_contents=7.
 * ModelInferResponse: model_name=1 model_version=2 id=3 outputs=5 (name=1
 *   datatype=2 shape=3) raw_output_contents=6, written in field order as
 *   protobuf serializes them. */
#include "kserve_pb.h"

#include "cuda.h"

#include "h2_reply.h"

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
  in->name = in->datatype = (Slice){m.p, 0}; /* (absent: empty, as protobuf reads it) */
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

int slice_eq(Slice a, Slice b)
{
  return a.n == b.n && memcmp(a.p, b.p, a.n) == 0;
}

static int slice_is(Slice a, const char* s)
{
  return a.n == strlen(s) && memcmp(a.p, s, a.n) == 0;
}

/* A numeric datatype's Triton type, or INVALID (BYTES, BF16 and unknown names: not plain). */
TRITONSERVER_DataType numeric_type(Slice name)
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
int ks_decode(const uint8_t* data, size_t len, KsRequest* r)
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
int ks_plain(const KsRequest* r)
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
  KsTensor t;
  size_t packed; /* bytes of its packed shape */
  size_t tensor; /* bytes of its InferOutputTensor */
} KsOutput;

int ks_output(TRITONSERVER_InferenceResponse* resp, uint32_t i, KsTensor* t)
{
  int64_t mtype_id;
  void* userp;
  TRITONSERVER_Error* err =
      api.TRITONSERVER_InferenceResponseOutput(resp, i, &t->name, &t->dtype, &t->shape, &t->ndim,
                                               &t->base, &t->size, &t->mtype, &mtype_id, &userp);
  if (err == NULL) return 0;
  api.TRITONSERVER_ErrorDelete(err);
  return -1;
}

/* Encode the ModelInferResponse of a response into a message of the _h2 interface (NULL with
 * *e set when it cannot be). */
void* ks_encode(const H2Reply* h2, Slice model, Slice version, Slice id,
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
    if (ks_output(resp, i, &o->t) < 0) {
      *e = (KsError){TRITONSERVER_ERROR_INTERNAL, "cannot read Triton's response"};
      goto fail;
    }
    if ((o->t.dtype != TRITONSERVER_TYPE_BYTES && numpy_typenum_of(o->t.dtype) < 0) ||
        o->t.ndim > MAX_DIMS) {
      *e = no_numpy;
      goto fail;
    }
    for (uint64_t d = 0; d < o->t.ndim; d++) o->packed += varint_size((uint64_t)o->t.shape[d]);
    o->tensor = text_size(strlen(o->t.name)) + text_size(strlen(dtype_name(o->t.dtype))) +
                (o->t.ndim ? field_size(o->packed) : 0);
    total += field_size(o->tensor) + field_size(o->t.size);
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
    const char* dt = dtype_name(o->t.dtype);
    *p++ = 5 << 3 | WIRE_LEN;
    p = put_varint(p, o->tensor);
    p = put_text(p, 1, o->t.name, strlen(o->t.name));
    p = put_text(p, 2, dt, strlen(dt));
    if (o->t.ndim) {
      *p++ = 3 << 3 | WIRE_LEN;
      p = put_varint(p, o->packed);
      for (uint64_t d = 0; d < o->t.ndim; d++) p = put_varint(p, (uint64_t)o->t.shape[d]);
    }
  }
  for (uint32_t i = 0; i < count; i++) {
    KsOutput* o = &outs[i];
    *p++ = 6 << 3 | WIRE_LEN;
    p = put_varint(p, o->t.size);
    if (o->t.mtype == TRITONSERVER_MEMORY_GPU) {
      const char* why = cuda_copy(p, o->t.base, o->t.size);
      if (why != NULL) {
        h2->discard(message);
        *e = (KsError){TRITONSERVER_ERROR_INTERNAL, why};
        goto fail;
      }
    } else if (o->t.size) {
      memcpy(p, o->t.base, o->t.size);
    }
    p += o->t.size;
  }
  free(outs);
  return message;
fail:
  free(outs);
  return NULL;
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
