/* The KServe-v2 JSON subset that kserve.c answers in C for HTTP/REST, the writing side: the answer
 * to an inference request from Triton's output buffers (kj_encode: JSON, or the binary tensor
 * data extension's JSON header and the outputs' bytes) and error answers (kj_error), written as
 * json.dumps writes the Python path's answer: the same keys in the same order, ", " and ": "
 * separators, floats as Python's repr (the shortest text that reads back), NaN/Infinity as
 * json.dumps spells them, strings with ensure_ascii's escapes. No Python here but the tests' hook
 * kserve_json_double(). */
#include "kserve_json.h"

#include "cuda.h"
#include "kserve_pb.h"
#include "numtext.h"

#include <math.h>

static char* put(char* p, const char* s)
{
  size_t n = strlen(s);
  memcpy(p, s, n);
  return p + n;
}

/* A string as json.dumps writes it (ensure_ascii): UTF-8 read as code points, escaped past
 * ASCII; a byte that is no UTF-8 is U+FFFD. At most 12 bytes out per byte in, and 2. */
static char* put_string(char* p, const uint8_t* s, size_t n)
{
  static const char hex[] = "0123456789abcdef";
  *p++ = '"';
  for (size_t i = 0; i < n;) {
    uint32_t c = s[i];
    size_t k = 1;
    if (c >= 0x80) { /* a UTF-8 sequence, checked as Python's decoder does */
      int more = c >= 0xf0 ? (c <= 0xf4 ? 3 : -1) : c >= 0xe0 ? 2 : c >= 0xc2 ? 1 : -1;
      uint32_t v = more == 3 ? c & 7 : more == 2 ? c & 15 : c & 31;
      int ok = more > 0 && i + (size_t)more < n;
      for (int j = 1; ok && j <= more; j++) {
        if ((s[i + j] & 0xc0) != 0x80) ok = 0;
        else v = v << 6 | (s[i + j] & 63);
      }
      if (ok && ((more == 2 && (v < 0x800 || (v >= 0xd800 && v < 0xe000))) ||
                 (more == 3 && (v < 0x10000 || v > 0x10ffff))))
        ok = 0;
      c = ok ? v : 0xfffd;
      k = ok ? (size_t)more + 1 : 1;
    }
    i += k;
    if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') {
      *p++ = (char)c;
    } else if (c == '"' || c == '\\') {
      *p++ = '\\';
      *p++ = (char)c;
    } else if (c == '\n' || c == '\r' || c == '\t' || c == '\b' || c == '\f') {
      *p++ = '\\';
      *p++ = c == '\n' ? 'n' : c == '\r' ? 'r' : c == '\t' ? 't' : c == '\b' ? 'b' : 'f';
    } else {
      uint32_t units[2] = {c, 0};
      int nu = 1;
      if (c >= 0x10000) {
        units[0] = 0xd800 | ((c - 0x10000) >> 10);
        units[1] = 0xdc00 | ((c - 0x10000) & 0x3ff);
        nu = 2;
      }
      for (int u = 0; u < nu; u++) {
        p = put(p, "\\u");
        for (int sh = 12; sh >= 0; sh -= 4) *p++ = hex[(units[u] >> sh) & 15];
      }
    }
  }
  *p++ = '"';
  return p;
}

static char* put_u64(char* p, uint64_t v)
{
  char tmp[24];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (n) *p++ = tmp[--n];
  return p;
}

static char* put_i64(char* p, int64_t v)
{
  if (v < 0) {
    *p++ = '-';
    return put_u64(p, (uint64_t)0 - (uint64_t)v);
  }
  return put_u64(p, (uint64_t)v);
}

/* A double as Python's repr: the fewest significant digits that read back, fixed notation for
 * decimal exponents -4..15 ("3.0", "0.0001"), scientific beyond ("1e+16", "1.5e-05"); json.dumps'
 * NaN and Infinity. At most 25 bytes. */
char* kj_double_text(char* p, double v)
{
  if (isnan(v)) return put(p, "NaN");
  if (isinf(v)) return put(p, v > 0 ? "Infinity" : "-Infinity");
  if (v == 0) return put(p, signbit(v) ? "-0.0" : "0.0");
  if (v < 0) {
    *p++ = '-';
    v = -v;
  }
  char digits[24];
  int n = 0, exp10 = 0;
  if (v < 1e15 && v == (double)(int64_t)v) { /* an integer: its digits */
    char* e = put_u64(digits, (uint64_t)v);
    n = (int)(e - digits);
    exp10 = n - 1;
  } else {
    n = nt_shortest(v, digits, &exp10);
  }
  while (n > 1 && digits[n - 1] == '0') n--;
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 < 0) {
      p = put(p, "0.");
      for (int i = -1; i > exp10; i--) *p++ = '0';
      memcpy(p, digits, (size_t)n);
      return p + n;
    }
    for (int i = 0; i <= exp10; i++) *p++ = i < n ? digits[i] : '0';
    *p++ = '.';
    if (n <= exp10 + 1) {
      *p++ = '0';
      return p;
    }
    memcpy(p, digits + exp10 + 1, (size_t)(n - exp10 - 1));
    return p + n - exp10 - 1;
  }
  *p++ = digits[0];
  if (n > 1) {
    *p++ = '.';
    memcpy(p, digits + 1, (size_t)(n - 1));
    p += n - 1;
  }
  *p++ = 'e';
  *p++ = exp10 < 0 ? '-' : '+';
  int x = exp10 < 0 ? -exp10 : exp10;
  if (x < 10) *p++ = '0';
  return put_u64(p, (uint64_t)x);
}

static double half_to_double(uint16_t h)
{
  int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(m + 1024, e - 25);
  return sign ? -v : v;
}

/* One element of a numeric output as json.dumps writes what tolist() gives. */
static char* put_element(char* p, TRITONSERVER_DataType t, const uint8_t* at)
{
  union {
    int8_t i8;
    int16_t i16;
    int32_t i32;
    int64_t i64;
    uint8_t u8;
    uint16_t u16;
    uint32_t u32;
    uint64_t u64;
    float f32;
    double f64;
  } v;
  memcpy(&v, at, dtype_size(t));
  switch (t) {
    case TRITONSERVER_TYPE_BOOL: return put(p, v.u8 ? "true" : "false");
    case TRITONSERVER_TYPE_UINT8: return put_u64(p, v.u8);
    case TRITONSERVER_TYPE_UINT16: return put_u64(p, v.u16);
    case TRITONSERVER_TYPE_UINT32: return put_u64(p, v.u32);
    case TRITONSERVER_TYPE_UINT64: return put_u64(p, v.u64);
    case TRITONSERVER_TYPE_INT8: return put_i64(p, v.i8);
    case TRITONSERVER_TYPE_INT16: return put_i64(p, v.i16);
    case TRITONSERVER_TYPE_INT32: return put_i64(p, v.i32);
    case TRITONSERVER_TYPE_INT64: return put_i64(p, v.i64);
    case TRITONSERVER_TYPE_FP16: return kj_double_text(p, half_to_double(v.u16));
    case TRITONSERVER_TYPE_FP32: return kj_double_text(p, v.f32);
    default: return kj_double_text(p, v.f64);
  }
}

typedef struct {
  KsTensor t;
  int binary;
  void* host; /* a copy of GPU memory */
} KjOutput;

/* One output's object in the answer's "outputs" (after a ", " unless it is the first): its name,
 * datatype, shape and then its data, or, a binary one, its size (its bytes follow the JSON). */
static char* put_output(char* p, const KjOutput* o, int first)
{
  const char* dt = dtype_name(o->t.dtype);
  p = put(p, first ? "{\"name\": " : ", {\"name\": ");
  p = put_string(p, (const uint8_t*)o->t.name, strlen(o->t.name));
  p = put(p, ", \"datatype\": ");
  p = put_string(p, (const uint8_t*)dt, strlen(dt));
  p = put(p, ", \"shape\": [");
  for (uint64_t d = 0; d < o->t.ndim; d++) {
    if (d) p = put(p, ", ");
    p = put_i64(p, o->t.shape[d]);
  }
  if (o->binary) {
    p = put(p, "], \"parameters\": {\"binary_data_size\": ");
    p = put_u64(p, o->t.size);
    return put(p, "}}");
  }
  p = put(p, "], \"data\": [");
  size_t step = dtype_size(o->t.dtype);
  for (size_t k = 0; k < o->t.size; k += step) {
    if (k) p = put(p, ", ");
    p = put_element(p, o->t.dtype, (const uint8_t*)o->t.base + k);
  }
  return put(p, "]}");
}

char* kj_encode(const KjAnswer* a, TRITONSERVER_InferenceResponse* resp, size_t* len,
                size_t* header_len, KsError* e)
{
  uint32_t count = 0;
  TRITONSERVER_Error* err = api.TRITONSERVER_InferenceResponseOutputCount(resp, &count);
  KjOutput* outs = err == NULL ? calloc(count ? count : 1, sizeof(KjOutput)) : NULL;
  char* text = NULL;
  if (outs == NULL) {
    if (err != NULL) api.TRITONSERVER_ErrorDelete(err);
    *e = (KsError){TRITONSERVER_ERROR_INTERNAL, "cannot read Triton's response"};
    return NULL;
  }
  Slice version = a->version.n ? a->version : (Slice){(const uint8_t*)"1", 1};
  size_t bound = 96 + 6 * (a->model.n + version.n + a->id.n), blobs = 0;
  for (uint32_t i = 0; i < count; i++) {
    KjOutput* o = &outs[i];
    if (ks_output(resp, i, &o->t) < 0) {
      *e = (KsError){TRITONSERVER_ERROR_INTERNAL, "cannot read Triton's response"};
      goto fail;
    }
    uint64_t elements = 1;
    for (uint64_t d = 0; d < o->t.ndim; d++) elements *= (uint64_t)o->t.shape[d];
    if (o->t.dtype == TRITONSERVER_TYPE_BYTES || numpy_typenum_of(o->t.dtype) < 0 ||
        o->t.ndim > MAX_DIMS || elements * dtype_size(o->t.dtype) != o->t.size) {
      *e = (KsError){TRITONSERVER_ERROR_UNSUPPORTED, "output datatype has no numpy equivalent"};
      goto fail;
    }
    o->binary = a->binary_default;
    if (a->n_outputs) { /* asked for by name: its binary_data */
      o->binary = 0;
      size_t nl = strlen(o->t.name);
      for (int k = 0; k < a->n_outputs; k++)
        if (a->outputs[k].n == nl && memcmp(a->outputs[k].p, o->t.name, nl) == 0)
          o->binary |= (a->out_bits >> k) & 1;
    }
    if (o->t.mtype == TRITONSERVER_MEMORY_GPU && o->t.size) {
      o->host = malloc(o->t.size);
      const char* why = o->host ? cuda_copy(o->host, o->t.base, o->t.size) : "out of memory";
      if (why != NULL) {
        *e = (KsError){TRITONSERVER_ERROR_INTERNAL, why};
        goto fail;
      }
      o->t.base = o->host;
    }
    bound += 128 + 6 * strlen(o->t.name) + 22 * o->t.ndim;
    if (o->binary) blobs += o->t.size;
    else bound += (size_t)elements * 27;
  }
  text = malloc(bound + blobs);
  if (text == NULL) {
    *e = (KsError){TRITONSERVER_ERROR_UNAVAILABLE, "out of memory encoding the response"};
    goto fail;
  }
  char* p = put(text, "{\"model_name\": ");
  p = put_string(p, a->model.p, a->model.n);
  p = put(p, ", \"model_version\": ");
  p = put_string(p, version.p, version.n);
  p = put(p, ", \"outputs\": [");
  for (uint32_t i = 0; i < count; i++) p = put_output(p, &outs[i], i == 0);
  p = put(p, "]");
  if (a->id.n) {
    p = put(p, ", \"id\": ");
    p = put_string(p, a->id.p, a->id.n);
  }
  p = put(p, "}");
  *header_len = (size_t)(p - text);
  for (uint32_t i = 0; blobs && i < count; i++) {
    if (!outs[i].binary) continue;
    if (outs[i].t.size) memcpy(p, outs[i].t.base, outs[i].t.size);
    p += outs[i].t.size;
  }
  *len = (size_t)(p - text);
  if (!blobs) *header_len = 0;
  goto done;
fail:
  free(text);
  text = NULL;
done:
  for (uint32_t i = 0; i < count; i++) free(outs[i].host);
  free(outs);
  return text;
}

char* kj_error(const char* message, size_t* len)
{
  size_t n = strlen(message);
  char* text = malloc(16 + 12 * n);
  if (text == NULL) return NULL;
  char* p = put(text, "{\"error\": ");
  p = put_string(p, (const uint8_t*)message, n);
  p = put(p, "}");
  *len = (size_t)(p - text);
  return text;
}

/* kserve_json_double(x) -> str: kj_double_text's text (tests: Python's repr). */
PyObject* py_kserve_json_double(PyObject* self, PyObject* arg)
{
  (void)self;
  double v = PyFloat_AsDouble(arg);
  if (v == -1.0 && PyErr_Occurred()) return NULL;
  char text[40];
  char* end = kj_double_text(text, v);
  return PyUnicode_FromStringAndSize(text, end - text);
}
