/* The KServe-v2 JSON subset that kserve.c answers in C for HTTP/REST, the reading side: a bounded
 * decoder of an inference request body (kj_decode: the JSON, and the binary tensor data
 * extension's bytes after it) into the KsRequest that gRPC's decoder fills (the answers are
 * kserve_json_write.c's). No Python here but the tests' hook kserve_json_decode().
 *
 * The decoder takes what the Python path (frontends/http/rest.py decode_infer) reads the same way
 * and declines (-1) the rest, which that path then words: strings are printable ASCII without
 * escapes (keys included); numbers follow json.loads' grammar (NaN and Infinity declined); no
 * null; a key named twice is declined; unknown keys are skipped (validated, nesting at most
 * KJ_MAX_DEPTH). Request parameters: binary_data_output only; input parameters:
 * binary_data_size only; output parameters: binary_data only. An input's data is nested arrays of
 * numbers (booleans for BOOL), as many as its shape holds: integers within their datatype's range
 * for the integer datatypes (no fraction), any number for FP32/FP64 (an integer of at most 15
 * digits), no FP16/BF16/BYTES. Nothing is allocated from a declared size: the values are counted
 * in the bytes received before their buffer is allocated. */
#include "kserve_json.h"

#include "kserve_pb.h"
#include "numtext.h"

#include <math.h>

#define KJ_MAX_DEPTH 40 /* nested arrays in data (MAX_DIMS and some), or in a skipped value */

typedef struct {
  const uint8_t *p, *end;
} Lex;

static inline void ws(Lex* l)
{
  while (l->p < l->end && (*l->p == ' ' || *l->p == '\t' || *l->p == '\n' || *l->p == '\r')) l->p++;
}

static inline int eat(Lex* l, int ch)
{
  ws(l);
  if (l->p < l->end && *l->p == ch) {
    l->p++;
    return 1;
  }
  return 0;
}

static int literal(Lex* l, const char* word)
{
  size_t n = strlen(word);
  ws(l);
  if ((size_t)(l->end - l->p) < n || memcmp(l->p, word, n) != 0) return -1;
  l->p += n;
  return 0;
}

/* A string of printable ASCII without escapes (what the C path takes): its bytes. */
static int plain_string(Lex* l, Slice* s)
{
  if (!eat(l, '"')) return -1;
  const uint8_t* b = l->p;
  while (l->p < l->end && *l->p != '"') {
    if (*l->p < 0x20 || *l->p >= 0x7f || *l->p == '\\') return -1;
    l->p++;
  }
  if (l->p >= l->end) return -1;
  *s = (Slice){b, (size_t)(l->p - b)};
  l->p++;
  return 0;
}

/* Any valid JSON string of ASCII (escapes included): skipped. */
static int skip_string(Lex* l)
{
  if (!eat(l, '"')) return -1;
  while (l->p < l->end && *l->p != '"') {
    uint8_t c = *l->p++;
    if (c < 0x20 || c >= 0x80) return -1;
    if (c != '\\') continue;
    if (l->p >= l->end) return -1;
    c = *l->p++;
    if (c == 'u') {
      for (int i = 0; i < 4; i++, l->p++)
        if (l->p >= l->end || !isxdigit(*l->p)) return -1;
    } else if (!strchr("\"\\/bfnrt", c) || c == 0) {
      return -1;
    }
  }
  if (l->p >= l->end) return -1;
  l->p++;
  return 0;
}

static inline int is_digit(const uint8_t* p, const uint8_t* end)
{
  return p < end && *p >= '0' && *p <= '9';
}

/* A number in json.loads' grammar: its text; *frac: it has a fraction or an exponent. */
static int number(Lex* l, Slice* s, int* frac)
{
  ws(l);
  const uint8_t *p = l->p, *e = l->end;
  if (p < e && *p == '-') p++;
  if (!is_digit(p, e)) return -1;
  if (*p == '0') p++;
  else
    while (is_digit(p, e)) p++;
  *frac = 0;
  if (p < e && *p == '.') {
    if (!is_digit(++p, e)) return -1;
    while (is_digit(p, e)) p++;
    *frac = 1;
  }
  if (p < e && (*p == 'e' || *p == 'E')) {
    p++;
    if (p < e && (*p == '+' || *p == '-')) p++;
    if (!is_digit(p, e)) return -1;
    while (is_digit(p, e)) p++;
    *frac = 1;
  }
  *s = (Slice){l->p, (size_t)(p - l->p)};
  l->p = p;
  return 0;
}

static int skip_value(Lex* l, int depth)
{
  if (depth > KJ_MAX_DEPTH) return -1;
  ws(l);
  int c = l->p < l->end ? *l->p : -1;
  Slice s;
  int frac;
  switch (c) {
    case '"': return skip_string(l);
    case '{':
      l->p++;
      if (eat(l, '}')) return 0;
      do {
        if (skip_string(l) < 0 || !eat(l, ':') || skip_value(l, depth + 1) < 0) return -1;
      } while (eat(l, ','));
      return eat(l, '}') ? 0 : -1;
    case '[':
      l->p++;
      if (eat(l, ']')) return 0;
      do {
        if (skip_value(l, depth + 1) < 0) return -1;
      } while (eat(l, ','));
      return eat(l, ']') ? 0 : -1;
    case 't': return literal(l, "true");
    case 'f': return literal(l, "false");
    case 'n': return literal(l, "null");
    default: return number(l, &s, &frac);
  }
}

static int is_key(Slice k, const char* name)
{
  size_t n = strlen(name);
  return k.n == n && memcmp(k.p, name, n) == 0;
}

/* true / false: 1 / 0, -1 for anything else. */
static int boolean(Lex* l)
{
  ws(l);
  if (l->p < l->end && *l->p == 't') return literal(l, "true") == 0 ? 1 : -1;
  return literal(l, "false") == 0 ? 0 : -1;
}

/* An integer token (no fraction, no sign) of at most 18 digits. */
static int small_count(Lex* l, int64_t* v)
{
  Slice s;
  int frac;
  if (number(l, &s, &frac) < 0 || frac || s.p[0] == '-' || s.n > 18) return -1;
  int64_t r = 0;
  for (size_t i = 0; i < s.n; i++) r = r * 10 + (s.p[i] - '0');
  *v = r;
  return 0;
}

/* An object's members: calls member(l, key, ctx) for each, with the key. */
static int members(Lex* l, int (*member)(Lex*, Slice, void*), void* ctx)
{
  if (!eat(l, '{')) return -1;
  if (eat(l, '}')) return 0;
  do {
    Slice key;
    if (plain_string(l, &key) < 0 || !eat(l, ':') || member(l, key, ctx) < 0) return -1;
  } while (eat(l, ','));
  return eat(l, '}') ? 0 : -1;
}

/* ---- data: counted first, converted once its buffer is allocated --------- */

enum { K_INT = 1, K_FRAC = 2, K_BOOL = 4 };

typedef struct {
  const uint8_t *p, *end; /* the data's array, validated */
  size_t count;           /* its scalars */
  int kinds;
  int64_t binary; /* binary_data_size, -1 without one */
  int seen;       /* bits: name, datatype, shape, data, parameters */
} KjData;

/* data: nested arrays of numbers and booleans, counted. */
static int scan_data(Lex* l, KjData* d)
{
  ws(l);
  d->p = l->p;
  d->count = 0;
  if (!eat(l, '[')) return -1;
  int depth = 1;
  if (eat(l, ']')) goto closed;
  for (;;) {
    if (eat(l, '[')) {
      if (++depth > KJ_MAX_DEPTH) return -1;
      if (!eat(l, ']')) continue; /* a value follows */
      depth--;                    /* [] */
    } else {
      ws(l);
      int c = l->p < l->end ? *l->p : -1;
      if (c == 't' || c == 'f') {
        if (boolean(l) < 0) return -1;
        d->kinds |= K_BOOL;
      } else {
        Slice s;
        int frac;
        if (number(l, &s, &frac) < 0) return -1;
        d->kinds |= frac ? K_FRAC : K_INT;
      }
      d->count++;
    }
    while (!eat(l, ',')) { /* after a value: another, or arrays closing */
      if (!eat(l, ']')) return -1;
      if (--depth == 0) goto closed;
    }
  }
closed:
  d->end = l->p;
  return 0;
}

/* A number's value as Python's float() reads it (correctly rounded): exact decimal arithmetic
 * for up to 15 significant digits and a power of ten up to 22, std::from_chars beyond
 * (numtext.cc). */
static int to_double(Slice s, double* out)
{
  static const double tens[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
  const uint8_t *p = s.p, *e = s.p + s.n;
  int neg = *p == '-';
  p += neg;
  uint64_t m = 0;
  int sig = 0, exp10 = 0, after = 0;
  for (; p < e && (*p == '.' || (*p >= '0' && *p <= '9')); p++) {
    if (*p == '.') {
      after = 1;
      continue;
    }
    if (m == 0 && *p == '0') { /* leading zeros are not significant */
      exp10 -= after;
      continue;
    }
    if (++sig > 15) break;
    m = m * 10 + (uint64_t)(*p - '0');
    exp10 -= after;
  }
  if (sig <= 15 && p < e) { /* an exponent */
    p++;
    int eneg = *p == '-';
    p += *p == '+' || *p == '-';
    int x = 0;
    while (p < e && x < 1000) x = x * 10 + (*p++ - '0');
    exp10 += eneg ? -x : x;
  }
  if (sig <= 15 && exp10 >= -22 && exp10 <= 22) {
    double v = (double)m;
    v = exp10 < 0 ? v / tens[-exp10] : v * tens[exp10];
    *out = neg ? -v : v;
    return 0;
  }
  return nt_parse_double((const char*)s.p, (const char*)s.p + s.n, out);
}

/* An integer token as int64 (neg) or uint64: -1 past their range. */
static int to_integer(Slice s, int* neg, uint64_t* mag)
{
  const uint8_t *p = s.p, *e = s.p + s.n;
  *neg = *p == '-';
  p += *neg;
  uint64_t r = 0;
  for (; p < e; p++)
    if (__builtin_mul_overflow(r, 10, &r) || __builtin_add_overflow(r, (uint64_t)(*p - '0'), &r))
      return -1;
  *mag = r;
  return 0;
}

/* The data's values into out as datatype t (the scan validated the text): -1 for a value the
 * datatype does not take as it is. */
static int convert(const KjData* d, TRITONSERVER_DataType t, uint8_t* out)
{
  Lex l = {d->p, d->end};
  size_t size = dtype_size(t);
  for (;;) {
    ws(&l);
    if (l.p >= l.end) return 0;
    int c = *l.p;
    if (c == '[' || c == ']' || c == ',') {
      l.p++;
      continue;
    }
    if (c == 't' || c == 'f') {
      int b = boolean(&l);
      if (t != TRITONSERVER_TYPE_BOOL || b < 0) return -1;
      *out++ = (uint8_t)b;
      continue;
    }
    Slice s;
    int frac, neg;
    uint64_t mag;
    double v;
    if (number(&l, &s, &frac) < 0) return -1;
    switch (t) {
      case TRITONSERVER_TYPE_FP32:
      case TRITONSERVER_TYPE_FP64:
        if ((!frac && s.n - (s.p[0] == '-') > 15) || to_double(s, &v) < 0) return -1;
        if (t == TRITONSERVER_TYPE_FP64) {
          memcpy(out, &v, 8);
        } else {
          if (fabs(v) >= 0x1.ffffffp+127) return -1; /* (rounds to inf: Python's path says so) */
          float f = (float)v;
          memcpy(out, &f, 4);
        }
        break;
      case TRITONSERVER_TYPE_BOOL:
      case TRITONSERVER_TYPE_FP16:
      case TRITONSERVER_TYPE_BF16:
      case TRITONSERVER_TYPE_BYTES:
      case TRITONSERVER_TYPE_INVALID: return -1;
      default: { /* the integers */
        if (frac || to_integer(s, &neg, &mag) < 0) return -1;
        int is_signed = t == TRITONSERVER_TYPE_INT8 || t == TRITONSERVER_TYPE_INT16 ||
                        t == TRITONSERVER_TYPE_INT32 || t == TRITONSERVER_TYPE_INT64;
        int bits = (int)size * 8;
        if (is_signed) {
          uint64_t limit = (uint64_t)1 << (bits - 1); /* -limit .. limit-1 */
          if (neg ? mag > limit : mag >= limit) return -1;
          int64_t x = neg ? (int64_t)(0 - mag) : (int64_t)mag;
          memcpy(out, &x, size); /* (little-endian: the low bytes) */
        } else {
          if ((neg && mag) || (bits < 64 && mag >> bits)) return -1;
          memcpy(out, &mag, size);
        }
      }
    }
    out += size;
  }
}

/* ---- the request --------------------------------------------------------- */

typedef struct {
  KjRequest* q;
  KjData* data;
  int i;
  int out_flag; /* an output's binary_data: -1 unset */
  int seen;
} Ctx;

static int input_parameter(Lex* l, Slice key, void* ctx)
{
  KjData* d = ctx;
  if (!is_key(key, "binary_data_size") || d->binary >= 0) return -1;
  return small_count(l, &d->binary);
}

static int input_member(Lex* l, Slice key, void* ctx)
{
  Ctx* x = ctx;
  KsInput* in = &x->q->r.inputs[x->i];
  KjData* d = &x->data[x->i];
  int bit = is_key(key, "name")         ? 1
            : is_key(key, "datatype")   ? 2
            : is_key(key, "shape")      ? 4
            : is_key(key, "data")       ? 8
            : is_key(key, "parameters") ? 16
                                        : 0;
  if (bit & d->seen) return -1;
  d->seen |= bit;
  switch (bit) {
    case 1: return plain_string(l, &in->name);
    case 2: return plain_string(l, &in->datatype);
    case 4:
      in->ndim = 0;
      if (!eat(l, '[')) return -1;
      if (eat(l, ']')) return 0;
      do {
        if (in->ndim >= MAX_DIMS || small_count(l, &in->shape[in->ndim]) < 0) return -1;
        in->ndim++;
      } while (eat(l, ','));
      return eat(l, ']') ? 0 : -1;
    case 8: return scan_data(l, d);
    case 16: return members(l, input_parameter, d);
    default: return skip_value(l, 1);
  }
}

static int output_parameter(Lex* l, Slice key, void* ctx)
{
  Ctx* x = ctx;
  if (!is_key(key, "binary_data") || x->out_flag >= 0) return -1;
  return (x->out_flag = boolean(l)) < 0 ? -1 : 0;
}

static int output_member(Lex* l, Slice key, void* ctx)
{
  Ctx* x = ctx;
  int bit = is_key(key, "name") ? 1 : is_key(key, "parameters") ? 2 : 0;
  if (bit & x->seen) return -1;
  x->seen |= bit;
  if (bit == 1) return plain_string(l, &x->q->r.outputs[x->i]);
  if (bit == 2) return members(l, output_parameter, x);
  return skip_value(l, 1);
}

static int request_parameter(Lex* l, Slice key, void* ctx)
{
  KjRequest* q = ctx;
  if (!is_key(key, "binary_data_output") || q->binary_default >= 0) return -1;
  return (q->binary_default = boolean(l)) < 0 ? -1 : 0;
}

static int request_member(Lex* l, Slice key, void* ctx)
{
  Ctx* x = ctx;
  KjRequest* q = x->q;
  KsRequest* r = &q->r;
  int bit = is_key(key, "id")           ? 1
            : is_key(key, "inputs")     ? 2
            : is_key(key, "outputs")    ? 4
            : is_key(key, "parameters") ? 8
                                        : 0;
  if (bit & x->seen) return -1;
  x->seen |= bit;
  switch (bit) {
    case 1: return plain_string(l, &r->id);
    case 2:
      if (!eat(l, '[')) return -1;
      if (eat(l, ']')) return 0;
      do {
        if (r->n_inputs >= KS_MAX_TENSORS) return -1;
        Ctx one = {q, x->data, r->n_inputs, -1, 0};
        x->data[r->n_inputs] = (KjData){.binary = -1};
        r->inputs[r->n_inputs].ndim = 0;
        if (members(l, input_member, &one) < 0) return -1;
        KjData* d = &x->data[r->n_inputs];
        /* a name, a datatype, a shape, and data or binary_data_size (not both) */
        if ((d->seen & 7) != 7 || !(d->seen & 8) == (d->binary < 0)) return -1;
        r->n_inputs++;
      } while (eat(l, ','));
      return eat(l, ']') ? 0 : -1;
    case 4:
      if (!eat(l, '[')) return -1;
      if (eat(l, ']')) return 0;
      do {
        if (r->n_outputs >= KS_MAX_TENSORS) return -1;
        Ctx one = {q, NULL, r->n_outputs, -1, 0};
        if (members(l, output_member, &one) < 0 || !(one.seen & 1)) return -1;
        q->out_flag[r->n_outputs++] = (int8_t)one.out_flag;
      } while (eat(l, ','));
      return eat(l, ']') ? 0 : -1;
    case 8: return members(l, request_parameter, q);
    default: return skip_value(l, 1);
  }
}

void kj_clear(KjRequest* q)
{
  free(q->values);
  q->values = NULL;
}

int kj_decode(const uint8_t* body, size_t len, int64_t header_len, KjRequest* q)
{
  KsRequest* r = &q->r;
  r->model = r->version = r->id = (Slice){NULL, 0};
  r->n_inputs = r->n_outputs = r->n_raw = 0;
  q->binary_default = -1;
  q->values = NULL;
  Slice binary = {body + len, 0};
  if (header_len >= 0) {
    if ((uint64_t)header_len > len) return -1;
    binary = (Slice){body + header_len, len - (size_t)header_len};
    len = (size_t)header_len;
  }
  KjData data[KS_MAX_TENSORS];
  Ctx top = {q, data, 0, -1, 0};
  Lex l = {body, body + len};
  if (members(&l, request_member, &top) < 0 || !(top.seen & 2)) return -1;
  ws(&l);
  if (l.p != l.end) return -1;
  if (q->binary_default < 0) q->binary_default = 0;
  for (int i = 0; i < r->n_outputs; i++)
    if (q->out_flag[i] < 0) q->out_flag[i] = (int8_t)q->binary_default;
  /* the values: counted against their shapes before their buffer is allocated */
  size_t total = 0, offset = 0;
  for (int i = 0; i < r->n_inputs; i++) {
    const KsInput* in = &r->inputs[i];
    TRITONSERVER_DataType t = numeric_type(in->datatype);
    if (t == TRITONSERVER_TYPE_INVALID) return -1;
    uint64_t count = 1;
    for (int k = 0; k < in->ndim; k++)
      if (__builtin_mul_overflow(count, (uint64_t)in->shape[k], &count)) return -1;
    if (data[i].binary >= 0) {
      if ((uint64_t)data[i].binary > binary.n - offset) return -1;
      r->raw[i] = (Slice){binary.p + offset, (size_t)data[i].binary};
      offset += (size_t)data[i].binary;
    } else {
      if (count != data[i].count) return -1;
      total += (count * dtype_size(t) + 63) & ~(size_t)63;
    }
  }
  if (offset != binary.n) return -1;
  if (total && posix_memalign(&q->values, 64, total) != 0) {
    q->values = NULL;
    return -1;
  }
  uint8_t* at = q->values;
  for (int i = 0; i < r->n_inputs; i++) {
    if (data[i].binary >= 0) continue;
    TRITONSERVER_DataType t = numeric_type(r->inputs[i].datatype);
    size_t n = data[i].count * dtype_size(t);
    if (convert(&data[i], t, at) < 0) {
      kj_clear(q);
      return -1;
    }
    r->raw[i] = (Slice){at, n};
    at += (n + 63) & ~(size_t)63;
  }
  r->n_raw = r->n_inputs;
  return 0;
}

/* kserve_json_decode(body, header_len) -> dict or None: what the HTTP C path (kserve.c) reads of an
 * inference request body (None: not plain), for tests: id, inputs [(name, datatype, shape,
 * bytes)], outputs [(name, binary)], binary_data_output. */
PyObject* py_kserve_json_decode(PyObject* self, PyObject* const* args, Py_ssize_t nargs)
{
  (void)self;
  if (nargs != 2 || !PyBytes_Check(args[0]) || !PyLong_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "kserve_json_decode(body: bytes, header_len: int)");
    return NULL;
  }
  long long header_len = PyLong_AsLongLong(args[1]);
  if (header_len == -1 && PyErr_Occurred()) return NULL;
  KjRequest* q = malloc(sizeof(KjRequest));
  if (q == NULL) return PyErr_NoMemory();
  const uint8_t* body = (const uint8_t*)PyBytes_AS_STRING(args[0]);
  if (kj_decode(body, (size_t)PyBytes_GET_SIZE(args[0]), header_len, q) < 0) {
    free(q);
    Py_RETURN_NONE;
  }
  q->r.model = (Slice){(const uint8_t*)"m", 1};
  PyObject* result = NULL;
  PyObject* inputs = PyList_New(0);
  PyObject* outputs = PyList_New(0);
  if (ks_plain(&q->r) < 0) {
    result = Py_NewRef(Py_None);
    goto done;
  }
  for (int i = 0; inputs && i < q->r.n_inputs; i++) {
    const KsInput* in = &q->r.inputs[i];
    PyObject* shape = PyTuple_New(in->ndim);
    for (int d = 0; shape && d < in->ndim; d++)
      PyTuple_SET_ITEM(shape, d, PyLong_FromLongLong(in->shape[d]));
    PyObject* item = shape ? Py_BuildValue("(s#s#Ny#)", in->name.p, (Py_ssize_t)in->name.n,
                                           in->datatype.p, (Py_ssize_t)in->datatype.n, shape,
                                           q->r.raw[i].p, (Py_ssize_t)q->r.raw[i].n)
                           : NULL;
    if (item == NULL || PyList_Append(inputs, item) < 0) Py_CLEAR(inputs);
    Py_XDECREF(item);
  }
  for (int i = 0; outputs && i < q->r.n_outputs; i++) {
    PyObject* item = Py_BuildValue("(s#O)", q->r.outputs[i].p, (Py_ssize_t)q->r.outputs[i].n,
                                   q->out_flag[i] ? Py_True : Py_False);
    if (item == NULL || PyList_Append(outputs, item) < 0) Py_CLEAR(outputs);
    Py_XDECREF(item);
  }
  if (inputs && outputs)
    result = Py_BuildValue("{s:s#,s:O,s:O,s:O}", "id", q->r.id.n ? (const char*)q->r.id.p : "",
                           (Py_ssize_t)q->r.id.n, "inputs", inputs, "outputs", outputs,
                           "binary_data_output", q->binary_default ? Py_True : Py_False);
done:
  Py_XDECREF(inputs);
  Py_XDECREF(outputs);
  kj_clear(q);
  free(q);
  return result;
}
