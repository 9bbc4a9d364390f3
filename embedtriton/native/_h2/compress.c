/* gRPC message compression with zlib: request messages inflated within max_message_bytes (IO
 * thread, no GIL), and response messages deflated in Call.send() (without the GIL when they are
 * large). gRPC's "deflate" is the zlib format (RFC 1950) and "gzip" the gzip format (RFC 1952),
 * both with a 32 KiB window; responses are compressed at zlib's default level and sent compressed
 * only when that makes them smaller, as grpc-core does. */
#include "h2.h"

#include <limits.h>
#include <stdio.h>
#include <zlib.h>

int encoding_of(const char* v, size_t n)
{
  if (n == 8 && !memcmp(v, "identity", 8)) return ENC_IDENTITY;
  if (n == 7 && !memcmp(v, "deflate", 7)) return ENC_DEFLATE;
  if (n == 4 && !memcmp(v, "gzip", 4)) return ENC_GZIP;
  return ENC_UNKNOWN;
}

const char* encoding_name(int enc)
{
  return enc == ENC_DEFLATE ? "deflate" : enc == ENC_GZIP ? "gzip" : "identity";
}

static int window_bits(int enc)
{
  return enc == ENC_GZIP ? 15 + 16
                         : 15; /* +16: zlib writes and reads a gzip wrapper instead of a zlib one */
}

/* The first output buffer of an inflate: four times the input, at least this much, then doubling.
 */
#define INFLATE_FIRST (16 * 1024)

int inflate_message(int enc, const uint8_t* in, size_t n, size_t max, uint8_t** out, size_t* outlen,
                    char* err, size_t errsize)
{
  /* A small message may inflate to gigabytes (a "zip bomb"): the output never grows past max + 1
   * bytes, the one byte over telling a message that is too large, whatever the input claims or
   * holds. */
  size_t limit = max < SIZE_MAX ? max + 1 : max;
  size_t cap = n < limit / 4 ? 4 * n : limit;
  if (cap < INFLATE_FIRST) cap = INFLATE_FIRST < limit ? INFLATE_FIRST : limit;
  const char* why = NULL;
  int code = 13;
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  uint8_t* buf = malloc(cap);
  if (!buf || inflateInit2(&zs, window_bits(enc)) != Z_OK) {
    free(buf);
    snprintf(err, errsize, "out of memory to decompress the request message");
    return 8;
  }
  zs.next_in = (Bytef*)in;
  zs.avail_in = (uInt)n; /* n <= UINT32_MAX: it came in a gRPC length prefix */
  size_t have = 0;
  int r;
  for (;;) {
    if (have == cap) {
      if (cap == limit) break; /* max + 1 bytes: too large, whatever follows */
      size_t grown = cap <= limit / 2 ? cap * 2 : limit;
      uint8_t* g = realloc(buf, grown);
      if (!g) {
        why = "out of memory";
        code = 8;
        break;
      }
      buf = g;
      cap = grown;
    }
    size_t room = cap - have;
    if (room > UINT_MAX) room = UINT_MAX;
    zs.next_out = buf + have;
    zs.avail_out = (uInt)room;
    r = inflate(&zs, Z_NO_FLUSH);
    have += room - zs.avail_out;
    if (r == Z_STREAM_END) {
      if (zs.avail_in)
        why = "not all input consumed"; /* e.g. a second gzip member, as grpc-core refuses it */
      break;
    }
    if (r == Z_OK || (r == Z_BUF_ERROR && have == cap)) continue;
    if (r == Z_BUF_ERROR)
      why = "truncated data"; /* all input read, output room left, and no end of stream */
    else if (r == Z_NEED_DICT) why = "a preset dictionary";
    else why = zs.msg ? zs.msg : "zlib error";
    break;
  }
  inflateEnd(&zs);
  if (!why && have > max) {
    free(buf);
    snprintf(err, errsize,
             "received message after decompression larger than max (more than %zu bytes)", max);
    return 8;
  }
  if (why) {
    free(buf);
    snprintf(err, errsize, "Decompression failed due to %s (grpc-encoding %s)", why,
             encoding_name(enc));
    return code;
  }
  *out = buf;
  *outlen = have;
  return 0;
}

OutBuf* deflate_message(int enc, const uint8_t* in, size_t n)
{
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  if (n > UINT_MAX || deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, window_bits(enc), 8,
                                   Z_DEFAULT_STRATEGY) != Z_OK)
    return NULL;
  uLong bound = deflateBound(&zs, (uLong)n);
  OutBuf* ob = bound <= UINT_MAX ? malloc(sizeof *ob + 5 + bound) : NULL;
  if (ob) {
    zs.next_in = (Bytef*)in;
    zs.avail_in = (uInt)n;
    zs.next_out = ob->data + 5;
    zs.avail_out = (uInt)bound;
    int r = deflate(&zs, Z_FINISH);
    size_t len = bound - zs.avail_out;
    if (r != Z_STREAM_END || len >= n) { /* not smaller: the caller sends the message as it is */
      free(ob);
      ob = NULL;
    } else {
      OutBuf* shrunk = realloc(ob, sizeof *ob + 5 + len);
      if (shrunk) ob = shrunk;
      ob->next = NULL;
      ob->len = 5 + len;
      ob->off = 0;
      ob->data[0] = 1;
      ob->data[1] = (uint8_t)(len >> 24);
      ob->data[2] = (uint8_t)(len >> 16);
      ob->data[3] = (uint8_t)(len >> 8);
      ob->data[4] = (uint8_t)len;
    }
  }
  deflateEnd(&zs);
  return ob;
}
