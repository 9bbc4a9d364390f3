/* numtext.cc: numbers as JSON text, with the C++ standard library's conversions (C linkage; no
 * exceptions, no allocation). Needs no other header. */
#ifndef EMBEDTRITON_NUMTEXT_H
#define EMBEDTRITON_NUMTEXT_H

/* The fewest significant digits of a finite v > 0 that read back: into digits (at most 17),
 * with the decimal exponent of the first; returns their count. */
int nt_shortest(double v, char* digits, int* exp10);
/* A JSON number's text (validated) as a double, correctly rounded: 0, or -1 when it is out of
 * the double's range (Python's float() reads inf or 0 there: its path says what follows). */
int nt_parse_double(const char* first, const char* last, double* out);

#endif
