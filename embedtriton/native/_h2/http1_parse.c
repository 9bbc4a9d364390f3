/* The HTTP/1.1 request parser of the REST endpoint: a request head parsed line by line as its
 * bytes arrive (so that a head over the limit is refused before it is all in), bounded by
 * max_header_bytes and, as received, by head_raw_limit(), with the checks the endpoint answers for
 * (400, 411, 413, 431). Lines end with CRLF or a bare LF. No Python and no IO here. */
#include "http1.h"

#include <stdio.h>
#include <strings.h>

static int is_tchar(uint8_t ch)
{
  if (ch >= 'a' && ch <= 'z') return 1;
  if (ch >= 'A' && ch <= 'Z') return 1;
  if (ch >= '0' && ch <= '9') return 1;
  return ch && strchr("!#$%&'*+-.^_`|~", ch) != NULL;
}

static int bad(char* err, size_t errsize, const char* why)
{
  snprintf(err, errsize, "malformed HTTP request: %s", why);
  return 400;
}

static int too_large(size_t max_hdr, char* err, size_t errsize)
{
  snprintf(err, errsize, "request headers over the limit of %zu bytes", max_hdr);
  return 431;
}

void head_reset(Head* h)
{
  Span* fields = h->fields;
  size_t cap = h->capfields;
  memset(h, 0, sizeof *h);
  h->fields = fields;
  h->capfields = cap;
  h->length = -1;
}

/* the comma-separated tokens of a Connection header */
static void connection_tokens(Head* h, const uint8_t* v, size_t n)
{
  size_t i = 0;
  while (i < n) {
    while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
    size_t s = i;
    while (i < n && v[i] != ',') i++;
    size_t e = i;
    while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
    if (e - s == 5 && strncasecmp((const char*)v + s, "close", 5) == 0) h->conn_close = 1;
    if (e - s == 10 && strncasecmp((const char*)v + s, "keep-alive", 10) == 0)
      h->conn_keep_alive = 1;
  }
}

static int request_line(Head* h, const uint8_t* base, size_t off, size_t n, size_t max_hdr,
                        char* err, size_t errsize)
{
  const uint8_t* p = base + off;
  size_t i = 0;
  while (i < n && is_tchar(p[i])) i++;
  if (i == 0 || i >= n || p[i] != ' ') return bad(err, errsize, "invalid method");
  h->method = (Span){(uint32_t)off, (uint32_t)i};
  size_t u = ++i;
  while (i < n && p[i] > 0x20 && p[i] != 0x7f) i++;
  if (i == u || i >= n || p[i] != ' ') return bad(err, errsize, "invalid URL");
  h->url = (Span){(uint32_t)(off + u), (uint32_t)(i - u)};
  i++;
  if (n - i != 8 || memcmp(p + i, "HTTP/1.", 7) != 0 || (p[i + 7] != '0' && p[i + 7] != '1'))
    return bad(err, errsize, "invalid HTTP version");
  h->minor = p[i + 7] - '0';
  h->counted += h->url.len;
  if (h->counted > max_hdr) return too_large(max_hdr, err, errsize);
  h->have_line = 1;
  return 0;
}

static int header_line(Head* h, const uint8_t* base, size_t off, size_t n, size_t max_hdr,
                       char* err, size_t errsize)
{
  const uint8_t* p = base + off;
  if (p[0] == ' ' || p[0] == '\t') return bad(err, errsize, "folded header line");
  size_t i = 0;
  while (i < n && is_tchar(p[i])) i++;
  if (i == 0 || i >= n || p[i] != ':') return bad(err, errsize, "invalid header name");
  size_t name_len = i++;
  while (i < n && (p[i] == ' ' || p[i] == '\t')) i++;
  size_t vs = i, ve = n;
  while (ve > vs && (p[ve - 1] == ' ' || p[ve - 1] == '\t')) ve--;
  for (size_t k = vs; k < ve; k++)
    if ((p[k] < 0x20 && p[k] != '\t') || p[k] == 0x7f)
      return bad(err, errsize, "invalid character in a header value");
  h->counted += name_len + (ve - vs);
  if (h->counted > max_hdr || h->nfields / 2 >= MAX_FIELDS) return too_large(max_hdr, err, errsize);
  if (h->nfields + 2 > h->capfields) {
    h->capfields = h->capfields ? h->capfields * 2 : 32;
    h->fields = xrealloc(h->fields, h->capfields * sizeof *h->fields);
  }
  h->fields[h->nfields++] = (Span){(uint32_t)off, (uint32_t)name_len};
  h->fields[h->nfields++] = (Span){(uint32_t)(off + vs), (uint32_t)(ve - vs)};
  const char* name = (const char*)p;
  const uint8_t* v = p + vs;
  size_t vl = ve - vs;
  if (name_len == 14 && strncasecmp(name, "content-length", 14) == 0) {
    if (h->length >= 0) return bad(err, errsize, "duplicate Content-Length");
    if (vl == 0) return bad(err, errsize, "invalid Content-Length");
    int64_t len = 0;
    for (size_t k = 0; k < vl; k++) {
      if (v[k] < '0' || v[k] > '9') return bad(err, errsize, "invalid Content-Length");
      if (len > (INT64_MAX - 9) / 10) len = INT64_MAX / 2; /* overflow: over any limit anyway */
      else len = len * 10 + (v[k] - '0');
    }
    h->length = len;
  } else if (name_len == 17 && strncasecmp(name, "transfer-encoding", 17) == 0) {
    h->chunked = 1;
  } else if (name_len == 10 && strncasecmp(name, "connection", 10) == 0) {
    connection_tokens(h, v, vl);
  }
  return 0;
}

int head_parse(Head* h, const uint8_t* buf, size_t len, size_t max_hdr, size_t max_body, char* err,
               size_t errsize)
{
  size_t raw_max = head_raw_limit(max_hdr);
  for (;;) {
    const uint8_t* nl = h->scan < len ? memchr(buf + h->scan, '\n', len - h->scan) : NULL;
    size_t off = h->scan, end = nl ? (size_t)(nl - buf) : len; /* the line, whole or partial */
    /* A line this long would count past the limit once in, and the head as received (its lines
     * padded or not, up to this line's end) is held to its raw limit: checked alike whether the
     * line is whole or still arriving, before anything else, so that the answer does not depend on
     * where the client's bytes were cut (a long line with a bad byte is 431 either way). */
    if (end - off > max_hdr + 256 || (nl ? end + 1 : len) > raw_max)
      return too_large(max_hdr, err, errsize);
    if (!nl) return 0;
    h->scan = end + 1;
    if (end > off && buf[end - 1] == '\r') end--;
    size_t n = end - off;
    for (size_t k = off; k < end; k++)
      if (buf[k] == '\r' || buf[k] == 0) return bad(err, errsize, "invalid character");
    int rc;
    if (!h->have_line) {
      rc = request_line(h, buf, off, n, max_hdr, err, errsize);
    } else if (n == 0) { /* the head is complete */
      if (h->length > (int64_t)max_body) {
        snprintf(err, errsize, "request body over the limit of %zu bytes", max_body);
        return 413;
      }
      if (h->chunked) {
        snprintf(err, errsize,
                 "a request body needs Content-Length (chunked transfer is not accepted)");
        return 411;
      }
      return 1;
    } else {
      rc = header_line(h, buf, off, n, max_hdr, err, errsize);
    }
    if (rc) return rc;
  }
}
