/* libFuzzer target: numbers as JSON text (_native/numtext.cc and the JSON reader and writer that
 * use it): what is written reads back, and what is read is what the C library reads.
 *
 * Invariants, besides ASan, UBSan and LeakSanitizer:
 *  - kj_double_text (the writer; Python's repr) of any double, from the input's first 8 bytes, is
 *    at most 25 bytes and reads back to the same double, through strtod and through
 * nt_parse_double;
 *  - nt_parse_double on the input as text, in an exactly sized buffer (no NUL after it), reads
 *    nothing past it and, where it takes the text, agrees with strtod;
 *  - kj_decode's number reading (exact decimal arithmetic for short numbers, numtext.cc beyond)
 *    of the input as an FP64, FP32 and INT64 element agrees with strtod / strtoll, correctly
 *    rounded (FP32: the double rounded to float, as Python's path does it). */
#include "numtext.h"
#include "kserve_json.h"

#include <errno.h>
#include <math.h>

#include "fuzz.h"

static void writes_and_reads_back(double v)
{
  char text[64];
  char* end = kj_double_text(text, v);
  size_t n = (size_t)(end - text);
  CHECK(n <= 25, "%zu bytes for %a", n, v);
  if (!isfinite(v)) return;
  *end = 0;
  double back = strtod(text, NULL);
  CHECK(memcmp(&back, &v, sizeof v) == 0, "%a written as %s reads back as %a", v, text, back);
  double mine;
  CHECK(nt_parse_double(text, end, &mine) == 0 && memcmp(&mine, &v, sizeof v) == 0,
        "%a written as %s: nt_parse_double reads %a", v, text, mine);
}

/* The text as one element of datatype dt in a request body: the decoded bytes, or -1. */
static int decode_one(const char* dt, const uint8_t* num, size_t n, void* out, size_t size)
{
  static const char head[] = "{\"inputs\":[{\"name\":\"x\",\"datatype\":\"";
  static const char mid[] = "\",\"shape\":[1],\"data\":[";
  static const char tail[] = "]}]}";
  size_t len = strlen(head) + strlen(dt) + strlen(mid) + n + strlen(tail);
  uint8_t* body = malloc(len);
  if (!body) abort();
  uint8_t* p = body;
  memcpy(p, head, strlen(head)), p += strlen(head);
  memcpy(p, dt, strlen(dt)), p += strlen(dt);
  memcpy(p, mid, strlen(mid)), p += strlen(mid);
  memcpy(p, num, n), p += n;
  memcpy(p, tail, strlen(tail));
  KjRequest* q = malloc(sizeof *q);
  if (!q) abort();
  int rc = kj_decode(body, len, -1, q);
  if (rc == 0) {
    CHECK(q->r.n_inputs == 1 && q->r.raw[0].n == size, "one element decoded to %zu bytes",
          q->r.raw[0].n);
    memcpy(out, q->r.raw[0].p, size);
    kj_clear(q);
  }
  free(q);
  free(body);
  return rc;
}

/* A number in JSON's grammar, nothing around it. */
static int json_number(const uint8_t* p, size_t n)
{
  size_t i = 0;
  if (i < n && p[i] == '-') i++;
  if (i == n || p[i] < '0' || p[i] > '9') return 0;
  if (p[i] == '0') i++;
  else
    while (i < n && p[i] >= '0' && p[i] <= '9') i++;
  if (i < n && p[i] == '.') {
    if (++i == n || p[i] < '0' || p[i] > '9') return 0;
    while (i < n && p[i] >= '0' && p[i] <= '9') i++;
  }
  if (i < n && (p[i] == 'e' || p[i] == 'E')) {
    i++;
    if (i < n && (p[i] == '+' || p[i] == '-')) i++;
    if (i == n || p[i] < '0' || p[i] > '9') return 0;
    while (i < n && p[i] >= '0' && p[i] <= '9') i++;
  }
  return i == n;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
  if (size >= 8) {
    double v;
    memcpy(&v, data, 8);
    writes_and_reads_back(v);
  }
  if (size > 400) return 0;
  /* the input as number text */
  char* exact = (char*)exact_copy(data, size);
  char text[401];
  memcpy(text, data, size);
  text[size] = 0;
  double parsed;
  if (size && nt_parse_double(exact, exact + size, &parsed) == 0 && memchr(text, 0, size) == NULL) {
    char* end;
    errno = 0;
    double ref = strtod(text, &end);
    /* (strtod takes hex, inf, nan and leading spaces, which from_chars does not: compared where
     * both read the whole text as a decimal number) */
    if (end == text + size && errno != ERANGE && strpbrk(text, "xXnNiI ") == NULL)
      CHECK(memcmp(&ref, &parsed, sizeof ref) == 0, "'%s': nt_parse_double %a, strtod %a", text,
            parsed, ref);
  }
  free(exact);
  if (!json_number(data, size)) return 0; /* (a decoder's business: kserve_json) */
  double d;
  if (decode_one("FP64", data, size, &d, 8) == 0) {
    errno = 0;
    double ref = strtod(text, NULL);
    CHECK(memcmp(&ref, &d, 8) == 0, "'%s' as FP64: %a, strtod %a", text, d, ref);
  }
  float f;
  if (decode_one("FP32", data, size, &f, 4) == 0) {
    float ref = (float)strtod(text, NULL);
    CHECK(memcmp(&ref, &f, 4) == 0, "'%s' as FP32: %a, strtod %a", text, (double)f, (double)ref);
  }
  int64_t i;
  if (decode_one("INT64", data, size, &i, 8) == 0) {
    errno = 0;
    long long ref = strtoll(text, NULL, 10);
    CHECK(errno == 0 && ref == i, "'%s' as INT64: %lld, strtoll %lld", text, (long long)i, ref);
  }
  return 0;
}
