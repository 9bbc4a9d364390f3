/* libFuzzer target: the KServe-v2 JSON request decoder of the HTTP C path (_native/kserve_json.c,
 * kj_decode), with and without the binary tensor data extension.
 *
 * The input's first byte says whether the body has a binary part; if so the next two bytes are
 * Inference-Header-Content-Length (taken as given: it may exceed the body). The rest is the body,
 * in an exactly sized heap buffer.
 *
 * Invariants, besides ASan, UBSan and LeakSanitizer:
 *  - every decoded string (id, names, datatypes, outputs) lies inside the JSON part;
 *  - an input sent as binary_data_size points inside the binary part, the binary parts tile it
 *    exactly, in order; an input sent as JSON data points inside the decoded values, and holds as
 *    many elements as its shape (counted independently here, in the body's data array);
 *  - ks_plain (the checks the C path applies next) reads the result without error;
 *  - what it declines is declined whole: nothing is left allocated. */
#include "kserve_json.h"

#include "fuzz.h"

static int inside(Slice s, const uint8_t* lo, const uint8_t* hi)
{
  return s.n == 0 || (s.p >= lo && s.p + s.n <= hi && s.p + s.n >= s.p);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
  if (size < 3) return 0;
  int binary = data[0] & 1;
  int64_t header_len = binary ? (int64_t)(data[1] | data[2] << 8) : -1;
  size_t len = size - 3;
  uint8_t* body = exact_copy(data + 3, len);
  KjRequest* q = malloc(sizeof *q);
  if (!q) abort();
  if (kj_decode(body, len, header_len, q) < 0) {
    CHECK(q->values == NULL, "a declined body left its values allocated");
    free(q);
    free(body);
    return 0;
  }
  KsRequest* r = &q->r;
  size_t json_end = header_len >= 0 ? (size_t)header_len : len;
  CHECK(json_end <= len, "JSON part of %zu bytes in a body of %zu", json_end, len);
  CHECK(r->n_inputs >= 0 && r->n_inputs <= KS_MAX_TENSORS, "%d inputs", r->n_inputs);
  CHECK(r->n_outputs >= 0 && r->n_outputs <= KS_MAX_TENSORS, "%d outputs", r->n_outputs);
  CHECK(r->n_raw == r->n_inputs, "%d raw for %d inputs", r->n_raw, r->n_inputs);
  CHECK(inside(r->id, body, body + json_end), "id outside the JSON");
  for (int i = 0; i < r->n_outputs; i++)
    CHECK(inside(r->outputs[i], body, body + json_end), "output %d's name outside the JSON", i);
  /* the decoded values: one block (64-byte aligned pieces), its size recomputed here */
  size_t values = 0;
  const uint8_t* next_binary = body + json_end;
  for (int i = 0; i < r->n_inputs; i++) {
    const KsInput* in = &r->inputs[i];
    CHECK(inside(in->name, body, body + json_end), "input %d's name outside the JSON", i);
    CHECK(inside(in->datatype, body, body + json_end), "input %d's datatype outside the JSON", i);
    CHECK(in->ndim >= 0 && in->ndim <= MAX_DIMS, "input %d: %d dimensions", i, in->ndim);
    TRITONSERVER_DataType t = numeric_type(in->datatype);
    CHECK(t != TRITONSERVER_TYPE_INVALID, "input %d taken with a datatype it cannot convert", i);
    uint64_t count = 1;
    for (int d = 0; d < in->ndim; d++) {
      CHECK(in->shape[d] >= 0, "input %d: dimension %d is %lld", i, d, (long long)in->shape[d]);
      CHECK(!__builtin_mul_overflow(count, (uint64_t)in->shape[d], &count), "shape overflows");
    }
    Slice raw = r->raw[i];
    if (raw.n && raw.p >= body && raw.p < body + len) { /* binary */
      CHECK(raw.p == next_binary, "input %d's binary data is not the next in the body", i);
      CHECK(inside(raw, body + json_end, body + len), "input %d's binary data past the body", i);
      next_binary += raw.n;
    } else if (raw.n) { /* converted from JSON */
      CHECK(q->values != NULL, "values without their block");
      CHECK(raw.n == count * dtype_size(t), "input %d: %zu bytes for %llu elements of %zu", i,
            raw.n, (unsigned long long)count, (size_t)dtype_size(t));
      CHECK((const uint8_t*)raw.p >= (const uint8_t*)q->values + values,
            "input %d's values overlap", i);
      values = (size_t)((const uint8_t*)raw.p - (const uint8_t*)q->values) +
               ((raw.n + 63) & ~(size_t)63);
      volatile uint8_t sum = 0; /* (every byte of it read: ASan says if the block is short) */
      for (size_t k = 0; k < raw.n; k++) sum += raw.p[k];
      (void)sum;
    }
  }
  if (header_len >= 0)
    CHECK(next_binary == body + len, "%zu bytes of the binary part not claimed by any input",
          (size_t)(body + len - next_binary));
  (void)ks_plain(r);
  kj_clear(q);
  free(q);
  free(body);
  return 0;
}
