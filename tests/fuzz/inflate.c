/* libFuzzer target: gRPC message decompression (_h2/compress.c, inflate_message) and its inverse
 * (deflate_message, the responses' compression).
 *
 * The input's first byte picks the encoding (deflate or gzip) and the limit (max_message_bytes);
 * the rest is taken twice: as a compressed message from a client, and as a message to compress.
 *
 * Invariants, besides ASan, UBSan and LeakSanitizer:
 *  - what inflates is never over the limit, and is what zlib itself inflates (the reference:
 *    zlib's uncompress-style loop into a buffer of the limit plus one);
 *  - what it refuses has a gRPC status (RESOURCE_EXHAUSTED over the limit, INTERNAL when corrupt)
 *    and a message, and nothing allocated;
 *  - inflate(deflate(x)) == x for every x, within a limit of x's size. */
#include "h2.h"

#include <zlib.h>

#include "fuzz.h"

/* zlib's own answer: the inflated bytes (up to cap), whether the stream ended cleanly with all
 * input used. */
static int reference(int enc, const uint8_t* in, size_t n, uint8_t* out, size_t cap, size_t* got)
{
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  if (inflateInit2(&zs, enc == ENC_GZIP ? 31 : 15) != Z_OK) abort();
  zs.next_in = (Bytef*)in;
  zs.avail_in = (uInt)n;
  zs.next_out = out;
  zs.avail_out = (uInt)cap;
  int r = inflate(&zs, Z_FINISH);
  *got = cap - zs.avail_out;
  int ok = r == Z_STREAM_END && zs.avail_in == 0;
  inflateEnd(&zs);
  return ok;
}

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size)
{
  if (size < 1) return 0;
  int enc = data[0] & 1 ? ENC_GZIP : ENC_DEFLATE;
  static const size_t limits[] = {0, 1, 100, 4096, 1 << 20};
  size_t max = limits[(data[0] >> 1) % 5];
  size_t n = size - 1;
  uint8_t* in = exact_copy(data + 1, n);

  uint8_t* out = NULL;
  size_t outlen = 0;
  char err[200] = "";
  int code = inflate_message(enc, in, n, max, &out, &outlen, err, sizeof err);
  uint8_t* ref = malloc(max + 1);
  size_t reflen;
  if (!ref) abort();
  int ref_ok = reference(enc, in, n, ref, max + 1, &reflen);
  if (code == 0) {
    CHECK(outlen <= max, "inflated %zu bytes past the limit of %zu", outlen, max);
    CHECK(ref_ok && reflen == outlen && (outlen == 0 || memcmp(ref, out, outlen) == 0),
          "inflated %zu bytes where zlib gives %zu (ok %d)", outlen, reflen, ref_ok);
    free(out);
  } else {
    CHECK(code == 8 || code == 13, "status %d", code);
    CHECK(err[0] != 0, "a refusal without a message");
    if (code == 8 && strstr(err, "larger than max"))
      CHECK(reflen > max, "refused as over %zu bytes, zlib gives %zu", max, reflen);
    else if (code == 13) CHECK(!ref_ok || reflen > max, "refused as corrupt what zlib inflates");
  }
  free(ref);

  /* the other way round: what we compress comes back */
  OutBuf* z = deflate_message(enc, in, n);
  if (z) {
    CHECK(z->len > 5 && z->data[0] == 1, "a compressed message without its flag");
    size_t zl =
        (size_t)z->data[1] << 24 | (size_t)z->data[2] << 16 | (size_t)z->data[3] << 8 | z->data[4];
    CHECK(zl == z->len - 5 && zl < n, "prefix says %zu, message %zu, from %zu", zl, z->len - 5, n);
    uint8_t* back = NULL;
    size_t backlen = 0;
    int rc = inflate_message(enc, z->data + 5, zl, n, &back, &backlen, err, sizeof err);
    CHECK(rc == 0 && backlen == n && memcmp(back, in, n) == 0,
          "deflate then inflate: %d, %zu of %zu", rc, backlen, n);
    free(back);
    free(z);
  }
  free(in);
  return 0;
}
