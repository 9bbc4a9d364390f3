/* libFuzzer target: the ModelInferRequest decoder of the gRPC C path (_native/kserve_pb.c,
 * ks_decode and ks_plain), on an exactly sized heap copy of the message (the differential against
 * the protobuf library is kserve_pb_diff.py).
 *
 * Invariants, besides ASan, UBSan and LeakSanitizer:
 *  - every slice (model, version, id, names, datatypes, outputs, raw contents) lies inside the
 *    message; at most KS_MAX_TENSORS inputs and outputs, at most MAX_DIMS non-negative dimensions;
 *  - a request ks_plain takes has one raw content per input of exactly the size its shape and
 *    datatype make, and no two inputs of the same name;
 *  - the decoder is a function of the bytes: decoding the same message twice gives the same. */
#include "kserve_pb.h"

#include "fuzz.h"

static int inside(Slice s, const uint8_t* lo, const uint8_t* hi)
{
  return s.n == 0 ? (s.p >= lo && s.p <= hi) : (s.p >= lo && s.p + s.n <= hi && s.p + s.n > s.p);
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
  uint8_t* msg = exact_copy(data, size);
  const uint8_t* end = msg + size;
  KsRequest* r = malloc(sizeof *r);
  KsRequest* again = malloc(sizeof *again);
  if (!r || !again) abort();
  int rc = ks_decode(msg, size, r);
  CHECK(ks_decode(msg, size, again) == rc, "two decodings of one message disagree");
  if (rc == 0) {
    CHECK(r->n_inputs == again->n_inputs && r->n_outputs == again->n_outputs &&
              r->n_raw == again->n_raw && slice_eq(r->model, again->model),
          "two decodings of one message disagree");
    CHECK(inside(r->model, msg, end) && inside(r->version, msg, end) && inside(r->id, msg, end),
          "model, version or id outside the message");
    CHECK(r->n_inputs >= 0 && r->n_inputs <= KS_MAX_TENSORS, "%d inputs", r->n_inputs);
    CHECK(r->n_outputs >= 0 && r->n_outputs <= KS_MAX_TENSORS, "%d outputs", r->n_outputs);
    CHECK(r->n_raw >= 0, "%d raw contents", r->n_raw);
    for (int i = 0; i < r->n_inputs; i++) {
      const KsInput* in = &r->inputs[i];
      CHECK(inside(in->name, msg, end) && inside(in->datatype, msg, end),
            "input %d's name or datatype outside the message", i);
      CHECK(in->ndim >= 0 && in->ndim <= MAX_DIMS, "input %d: %d dimensions", i, in->ndim);
      for (int d = 0; d < in->ndim; d++)
        CHECK(in->shape[d] >= 0, "input %d: negative dimension", i);
    }
    for (int i = 0; i < r->n_outputs; i++)
      CHECK(inside(r->outputs[i], msg, end), "output %d outside the message", i);
    int kept = r->n_raw < KS_MAX_TENSORS ? r->n_raw : KS_MAX_TENSORS;
    for (int i = 0; i < kept; i++)
      CHECK(inside(r->raw[i], msg, end), "raw %d outside the message", i);
    if (ks_plain(r) == 0) {
      CHECK(r->model.n > 0, "a plain request without a model name");
      CHECK(r->n_inputs <= r->n_raw, "%d inputs for %d raw contents", r->n_inputs, r->n_raw);
      for (int i = 0; i < r->n_inputs; i++) {
        const KsInput* in = &r->inputs[i];
        TRITONSERVER_DataType t = numeric_type(in->datatype);
        CHECK(t != TRITONSERVER_TYPE_INVALID,
              "input %d: a plain request of a datatype it cannot read", i);
        uint64_t bytes = dtype_size(t);
        for (int d = 0; d < in->ndim; d++) bytes *= (uint64_t)in->shape[d];
        CHECK(bytes == r->raw[i].n, "input %d: %zu raw bytes for %llu", i, r->raw[i].n,
              (unsigned long long)bytes);
        for (int j = 0; j < i; j++)
          CHECK(!slice_eq(in->name, r->inputs[j].name), "inputs %d and %d share a name", j, i);
      }
    }
  }
  free(again);
  free(r);
  free(msg);
  return 0;
}
