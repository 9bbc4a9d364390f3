/* Numbers as JSON text for kserve_json.c, in C++ for its standard library's conversions:
 * std::to_chars gives the shortest text that reads back (Python's repr picks the same digits) and
 * std::from_chars reads a number correctly rounded, as Python's float() does; neither depends on
 * the locale, and both are an order of magnitude faster than printf and strtod (see
 * docs/performance.md). C linkage; no exceptions, no allocation. */
#include <charconv>
#include <cstring>
#include <system_error>

extern "C" {
int nt_shortest(double v, char* digits, int* exp10);
int nt_parse_double(const char* first, const char* last, double* out);
}

/* The fewest significant digits of a finite v > 0 that read back: into digits (at most 17),
 * with the decimal exponent of the first; returns their count. */
int nt_shortest(double v, char* digits, int* exp10)
{
  char text[40];
  std::to_chars_result r =
      std::to_chars(text, text + sizeof text, v, std::chars_format::scientific);
  if (r.ec != std::errc()) return 0;
  int n = 0;
  const char* p = text;
  for (; p < r.ptr && *p != 'e'; p++)
    if (*p >= '0' && *p <= '9') digits[n++] = *p;
  int e = 0, neg = 0;
  if (p < r.ptr) p++;
  if (p < r.ptr && (*p == '-' || *p == '+')) neg = *p++ == '-';
  for (; p < r.ptr; p++) e = e * 10 + (*p - '0');
  *exp10 = neg ? -e : e;
  return n;
}

/* A JSON number's text (validated) as a double, correctly rounded: 0, or -1 when it is out of
 * the double's range (Python's float() reads inf or 0 there: its path says what follows). */
int nt_parse_double(const char* first, const char* last, double* out)
{
  std::from_chars_result r = std::from_chars(first, last, *out);
  return r.ec == std::errc() && r.ptr == last ? 0 : -1;
}
