/* stop_match: where stop strings lie in a streamed text that is held back before it is sent.
 *
 * The engine keeps a sequence's detokenized text that has not yet been sent in a hold buffer:
 * text that contains a stop string is cut at it, and a tail that may still become one is held
 * until a later token settles it. These are the two questions it asks of the buffer, pure
 * functions so the hold-back can be fuzzed alone (tests/fuzz/fuzz_detok.c). */
#ifndef QUERN_STOP_MATCH_H
#define QUERN_STOP_MATCH_H

/* The earliest offset in text[0..n) where one of the n_stops stop strings (non-empty,
 * NUL-terminated) begins, or -1. text may be NULL when n is 0 (nothing held yet). */
int stop_find(const char *text, int n, char *const *stops, int n_stops);

/* The length of the longest suffix of text[0..n) that is a proper prefix of a stop string
 * (0 when none): the bytes to hold back. */
int stop_partial_suffix(const char *text, int n, char *const *stops, int n_stops);

#endif
