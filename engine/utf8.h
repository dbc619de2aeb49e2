/* utf8: strict UTF-8 classification shared by the tokenizer and its streaming decoder.
 *
 * "Strict" per RFC 3629 / Unicode Table 3-7: no overlong forms, no surrogates, nothing above
 * U+10FFFF. An invalid sequence is reported by its maximal subpart (the longest prefix that
 * could still have begun a valid sequence), which is how a decoder replacing errors with U+FFFD
 * should advance (Unicode 15, section 3.9, "U+FFFD Substitution of Maximal Subparts"). */
#ifndef QUERN_UTF8_H
#define QUERN_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* Classifies the bytes at s[0..len), len >= 1. Returns n > 0 for a valid n-byte sequence (and
 * sets *cp), 0 when s is a valid but incomplete prefix that more bytes could finish, or -k when
 * the first k bytes (k >= 1) are an invalid sequence to be replaced by one U+FFFD. */
static inline int utf8_next(const unsigned char *s, size_t len, uint32_t *cp)
{
    unsigned char c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int n;
    unsigned char lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    uint32_t v;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
        v = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        v = c & 0x0F;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        v = c & 0x07;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return -1;
    }
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= len) return 0;
        unsigned char b = s[i];
        if (b < lo || b > hi) return -i;
        lo = 0x80;
        hi = 0xBF;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return n;
}

/* Offset of the first byte that does not start a complete valid sequence, or len when all of
 * s[0..len) is valid UTF-8. */
static inline size_t utf8_check(const char *s, size_t len)
{
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        if (u[i] < 0x80) {
            i++;
            continue;
        }
        uint32_t cp;
        int r = utf8_next(u + i, len - i, &cp);
        if (r <= 0) return i;
        i += (size_t)r;
    }
    return len;
}

/* Writes cp (<= U+10FFFF, not a surrogate) as UTF-8 into out[0..4); returns the byte count. */
static inline int utf8_put(uint32_t cp, char *out)
{
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

#endif
