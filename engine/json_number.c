/* json_number: JSON numbers as automata, for JSON Schema's number and integer types.
 *
 * DESIGN. A bounded number is built from its decimal digits, never from a float compare: a
 * bound is read back as the shortest decimal that gives the same double (what the schema's
 * author wrote: 0.1 is "0.1", not 0.1000000000000000055...), split into an integer part and 15
 * fraction digits, and a magnitude in [A, B] is an integer part strictly between A's and B's
 * with any fraction, or A's integer part with a fraction at or above A's, or B's with one at or
 * below B's (both at once when the two are equal). The fraction's automaton walks the bound's
 * digits while the output equals them ("tight") and frees itself at the first digit that
 * differs; it only builds digits after which some ending satisfies the bounds (an exclusive
 * bound of 0.999999999999999 leaves no fraction for integer part 0, and that branch is not
 * built), which keeps the automaton small and makes bounds with nothing between them an error
 * here rather than a grammar that accepts nothing (the DFA's pruning, grammar_dfa.c, would drop
 * the dead branches too). Negative numbers are "-" and a magnitude above 0 (no "-0"). Bounded
 * numbers have no exponent; every number has at most 15 integer and 15 fraction digits.
 * multipleOf: a power of ten below 1 caps the fraction digits (the same walk, shorter); an
 * integer k lists its multiples within the bounds as literals up to JN_LIST_MAX of them (a
 * multiple-of-k automaton over decimal digits has k states per digit position, most of them
 * for no gain), or for k = 10^m writes the quotient's range and m zeros; another decimal (0.5,
 * 0.25) lists its multiples within the bounds, each in its shortest writing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar_impl.h"

static struct frag digit(struct gb *b, const void *ctx)
{
    (void)ctx;
    return gb_byte_range(b, '0', '9');
}

static struct frag digits(struct gb *b, int min, int max)
{
    return gb_repeat(b, digit, NULL, min, max);
}

struct frag jn_number(struct gb *b, bool integer)
{
    struct frag f = gb_opt(b, gb_lits(b, "-"));
    struct frag ip = gb_alt_begin(b);
    gb_alt_add(b, ip, gb_lits(b, "0"));
    gb_alt_add(b, ip, gb_seq(b, gb_byte_range(b, '1', '9'), digits(b, 0, JN_DIGITS - 1)));
    f = gb_seq(b, f, ip);
    if (integer) return f;
    f = gb_seq(b, f, gb_opt(b, gb_seq(b, gb_lits(b, "."), digits(b, 1, JN_DIGITS))));
    struct frag e = gb_alt_begin(b);
    gb_alt_add(b, e, gb_lits(b, "e"));
    gb_alt_add(b, e, gb_lits(b, "E"));
    struct frag sign = gb_alt_begin(b);
    gb_alt_add(b, sign, gb_lits(b, "+"));
    gb_alt_add(b, sign, gb_lits(b, "-"));
    e = gb_seq(b, e, gb_opt(b, sign));
    e = gb_seq(b, e, digits(b, 1, 3));
    return gb_seq(b, f, gb_opt(b, e));
}

/* Decimal strings of length L - pos that are >= s[pos..] (ge) or <= s[pos..] (le). */
static struct frag digits_cmp(struct gb *b, const char *s, int pos, int L, bool ge)
{
    if (pos == L) return gb_empty(b);
    struct frag f = gb_alt_begin(b);
    gb_alt_add(b, f, gb_seq(b, gb_lit(b, s + pos, 1), digits_cmp(b, s, pos + 1, L, ge)));
    if (ge && s[pos] < '9')
        gb_alt_add(b, f,
                   gb_seq(b, gb_byte_range(b, (uint8_t)(s[pos] + 1), '9'),
                          digits(b, L - pos - 1, L - pos - 1)));
    if (!ge && s[pos] > '0')
        gb_alt_add(b, f,
                   gb_seq(b, gb_byte_range(b, '0', (uint8_t)(s[pos] - 1)),
                          digits(b, L - pos - 1, L - pos - 1)));
    return f;
}

/* Decimal strings of equal length L in [a, b]. */
static struct frag digits_between(struct gb *b, const char *a, const char *z, int pos, int L)
{
    if (pos == L) return gb_empty(b);
    if (a[pos] == z[pos])
        return gb_seq(b, gb_lit(b, a + pos, 1), digits_between(b, a, z, pos + 1, L));
    struct frag f = gb_alt_begin(b);
    gb_alt_add(b, f, gb_seq(b, gb_lit(b, a + pos, 1), digits_cmp(b, a, pos + 1, L, true)));
    if (z[pos] - a[pos] > 1)
        gb_alt_add(b, f,
                   gb_seq(b, gb_byte_range(b, (uint8_t)(a[pos] + 1), (uint8_t)(z[pos] - 1)),
                          digits(b, L - pos - 1, L - pos - 1)));
    gb_alt_add(b, f, gb_seq(b, gb_lit(b, z + pos, 1), digits_cmp(b, z, pos + 1, L, false)));
    return f;
}

/* Non-negative integers in [lo, hi] without leading zeros. */
static struct frag uint_range(struct gb *b, uint64_t lo, uint64_t hi)
{
    char a[24], z[24];
    int la = snprintf(a, sizeof a, "%llu", (unsigned long long)lo);
    int lz = snprintf(z, sizeof z, "%llu", (unsigned long long)hi);
    struct frag f = gb_alt_begin(b);
    for (int L = la; L <= lz; L++) {
        char x[24], y[24];
        if (L == la)
            memcpy(x, a, (size_t)L + 1);
        else {
            x[0] = '1';
            memset(x + 1, '0', (size_t)L - 1);
            x[L] = 0;
        }
        if (L == lz)
            memcpy(y, z, (size_t)L + 1);
        else {
            memset(y, '9', (size_t)L);
            y[L] = 0;
        }
        gb_alt_add(b, f, digits_between(b, x, y, 0, L));
    }
    return f;
}

struct frag jn_int_range(struct gb *b, int64_t lo, int64_t hi)
{
    struct frag f = gb_alt_begin(b);
    if (hi >= 0) gb_alt_add(b, f, uint_range(b, lo > 0 ? (uint64_t)lo : 0, (uint64_t)hi));
    if (lo < 0) {
        uint64_t mlo = hi < 0 ? (uint64_t)(-hi) : 1, mhi = (uint64_t)(-lo);
        gb_alt_add(b, f, gb_seq(b, gb_lits(b, "-"), uint_range(b, mlo, mhi)));
    }
    return f;
}

/* ---- decimal bounds ---- */

/* A non-negative bound: integer part and exactly JN_DIGITS fraction digits ('0'-padded),
 * whether it excludes itself, and the most fraction digits a number may write (mf, the same in
 * both bounds of a range). */
struct bound {
    uint64_t ip;
    char fd[JN_DIGITS + 1];
    bool ex;
    int mf;
};

/* v >= 0 as the shortest decimal that reads back as v; -1 when it needs more than JN_DIGITS
 * integer or fraction digits. */
static int bound_of(double v, bool ex, struct bound *d)
{
    char s[64];
    for (int p = 1; p <= 17; p++) {
        snprintf(s, sizeof s, "%.*e", p - 1, v);
        if (strtod(s, NULL) == v) break;
    }
    char dig[24];
    int nd = 0;
    const char *c = s;
    for (; *c && *c != 'e'; c++)
        if (*c >= '0' && *c <= '9') dig[nd++] = *c;
    int e = *c ? atoi(c + 1) : 0; /* v = dig[0].dig[1..] x 10^e: digit k's place is e - k */
    if (e >= JN_DIGITS) return -1;
    d->ip = 0;
    for (int place = e; place >= 0; place--) {
        int k = e - place;
        d->ip = d->ip * 10 + (uint64_t)(k < nd ? dig[k] - '0' : 0);
    }
    for (int i = 0; i < JN_DIGITS; i++) {
        int k = e + 1 + i; /* place -(i + 1) */
        d->fd[i] = k >= 0 && k < nd ? dig[k] : '0';
    }
    d->fd[JN_DIGITS] = 0;
    for (int k = e + 1 + JN_DIGITS; k < nd; k++)
        if (k >= 0 && dig[k] != '0') return -1;
    d->ex = ex;
    d->mf = JN_DIGITS;
    return 0;
}

static bool rest_zero(const struct bound *d, int i)
{
    for (; i < JN_DIGITS; i++)
        if (d->fd[i] != '0') return false;
    return true;
}

/* Fraction digits [0, i) written, equal to lo's where tl and to hi's where th: may the number
 * end here? Equal to a bound's digits so far, it is below the bound when the bound has nonzero
 * digits left, else equal. */
static bool frac_end_ok(const struct bound *lo, bool tl, const struct bound *hi, bool th, int i)
{
    bool lo_ok = !tl || (rest_zero(lo, i) && !lo->ex);
    bool hi_ok = !th || !rest_zero(hi, i) || !hi->ex;
    return lo_ok && hi_ok;
}

static bool frac_viable(const struct bound *lo, bool tl, const struct bound *hi, bool th, int i);

/* The digits position i may hold while tight: [first, last]; first (tl) keeps lo tight, last
 * (th) keeps hi tight, and [*lo_free, *hi_free] frees both. */
static void frac_digit_span(const struct bound *lo, bool tl, const struct bound *hi, bool th, int i,
                            char *first, char *last, char *lo_free, char *hi_free)
{
    *first = tl ? lo->fd[i] : '0';
    *last = th ? hi->fd[i] : '9';
    *lo_free = (char)(*first + (tl ? 1 : 0));
    *hi_free = (char)(*last - (th && !(tl && *first == *last) ? 1 : 0));
}

/* Whether some digit at position i leaves a way to end within the bounds. */
static bool frac_digit_viable(const struct bound *lo, bool tl, const struct bound *hi, bool th,
                              int i)
{
    if (i == lo->mf) return false;
    char first, last, lo_free, hi_free;
    frac_digit_span(lo, tl, hi, th, i, &first, &last, &lo_free, &hi_free);
    if (first > last) return false;
    if (lo_free <= hi_free) return true;
    if (tl && frac_viable(lo, true, hi, th && first == last, i + 1)) return true;
    return th && !(tl && first == last) && frac_viable(lo, false, hi, true, i + 1);
}

static bool frac_viable(const struct bound *lo, bool tl, const struct bound *hi, bool th, int i)
{
    return (!tl && !th) || frac_end_ok(lo, tl, hi, th, i) || frac_digit_viable(lo, tl, hi, th, i);
}

/* The fraction digits from position i on (an end where frac_end_ok allows it, unless
 * at_least_one), only those after which an ending is left. */
static struct frag frac_digits(struct gb *b, const struct bound *lo, bool tl,
                               const struct bound *hi, bool th, int i, bool at_least_one)
{
    if (!tl && !th) return digits(b, at_least_one ? 1 : 0, lo->mf - i);
    struct frag f = gb_alt_begin(b);
    if (!at_least_one && frac_end_ok(lo, tl, hi, th, i)) gb_alt_add(b, f, gb_empty(b));
    if (i == lo->mf) return f;
    char first, last, lo_free, hi_free;
    frac_digit_span(lo, tl, hi, th, i, &first, &last, &lo_free, &hi_free);
    if (first > last) return f;
    bool t2 = th && first == last;
    if (tl && frac_viable(lo, true, hi, t2, i + 1))
        gb_alt_add(b, f,
                   gb_seq(b, gb_lit(b, &first, 1), frac_digits(b, lo, true, hi, t2, i + 1, false)));
    if (th && !(tl && first == last) && frac_viable(lo, false, hi, true, i + 1))
        gb_alt_add(
            b, f,
            gb_seq(b, gb_lit(b, &last, 1), frac_digits(b, lo, false, hi, true, i + 1, false)));
    if (lo_free <= hi_free)
        gb_alt_add(b, f,
                   gb_seq(b, gb_byte_range(b, (uint8_t)lo_free, (uint8_t)hi_free),
                          digits(b, 0, lo->mf - i - 1)));
    return f;
}

/* After an integer part: no fraction, or "." and at least one digit, within the bounds whose
 * integer part it equals (lo: tl, hi: th; neither: any fraction). */
static struct frag fraction(struct gb *b, const struct bound *lo, bool tl, const struct bound *hi,
                            bool th)
{
    struct frag f = gb_alt_begin(b);
    if (frac_end_ok(lo, tl, hi, th, 0)) gb_alt_add(b, f, gb_empty(b));
    if (lo->mf > 0 && ((!tl && !th) || frac_digit_viable(lo, tl, hi, th, 0)))
        gb_alt_add(b, f, gb_seq(b, gb_lits(b, "."), frac_digits(b, lo, tl, hi, th, 0, true)));
    return f;
}

static bool fraction_exists(const struct bound *lo, bool tl, const struct bound *hi, bool th)
{
    return frac_end_ok(lo, tl, hi, th, 0) || frac_digit_viable(lo, tl, hi, th, 0);
}

/* Magnitudes m with lo <= m <= hi (each bound exclusive where it says); false when none. */
static bool magnitude_range(struct gb *b, const struct bound *lo, const struct bound *hi,
                            struct frag *out)
{
    struct frag f = gb_alt_begin(b);
    bool any = false;
    if (lo->ip < hi->ip) {
        if (fraction_exists(lo, true, hi, false)) {
            gb_alt_add(b, f,
                       gb_seq(b, uint_range(b, lo->ip, lo->ip), fraction(b, lo, true, hi, false)));
            any = true;
        }
        if (lo->ip + 1 < hi->ip) {
            gb_alt_add(b, f,
                       gb_seq(b, uint_range(b, lo->ip + 1, hi->ip - 1),
                              fraction(b, lo, false, hi, false)));
            any = true;
        }
        if (fraction_exists(lo, false, hi, true)) {
            gb_alt_add(b, f,
                       gb_seq(b, uint_range(b, hi->ip, hi->ip), fraction(b, lo, false, hi, true)));
            any = true;
        }
    } else if (lo->ip == hi->ip && fraction_exists(lo, true, hi, true)) {
        gb_alt_add(b, f, gb_seq(b, uint_range(b, lo->ip, lo->ip), fraction(b, lo, true, hi, true)));
        any = true;
    }
    *out = f;
    return any;
}

int jn_decimal_range(struct gb *b, double lo, bool lo_ex, double hi, bool hi_ex, int max_frac,
                     struct frag *out, const char **why)
{
    *why = NULL;
    struct bound A, B;
    struct frag f = gb_alt_begin(b), m;
    bool any = false;
    /* x >= 0: m = x in [max(lo, 0), hi] */
    if (hi > 0 || (hi == 0 && !hi_ex)) {
        if (bound_of(lo > 0 ? lo : 0, lo >= 0 && lo_ex, &A) || bound_of(hi, hi_ex, &B)) goto digits;
        A.mf = B.mf = max_frac;
        if (magnitude_range(b, &A, &B, &m)) {
            gb_alt_add(b, f, m);
            any = true;
        }
    }
    /* x < 0: "-" and m = -x in [max(-hi, 0), -lo], above 0 (no "-0") */
    if (lo < 0) {
        if (bound_of(hi < 0 ? -hi : 0, hi < 0 ? hi_ex : true, &A) || bound_of(-lo, lo_ex, &B))
            goto digits;
        A.mf = B.mf = max_frac;
        if (magnitude_range(b, &A, &B, &m)) {
            gb_alt_add(b, f, gb_seq(b, gb_lits(b, "-"), m));
            any = true;
        }
    }
    if (!any) {
        *why = "the number bounds leave nothing";
        return QERR_INVALID;
    }
    *out = f;
    return 0;
digits:
    *why = "bounds of more than 15 integer or 15 fraction digits";
    return QERR_UNSUPPORTED;
}

int jn_power_of_ten(double d)
{
    struct bound x;
    if (!(d > 0) || bound_of(d, false, &x)) return INT32_MIN;
    if (x.ip > 0) {
        if (!rest_zero(&x, 0)) return INT32_MIN;
        int m = 0;
        for (uint64_t v = x.ip; v > 1; v /= 10, m++)
            if (v % 10) return INT32_MIN;
        return m;
    }
    int n = 0;
    while (n < JN_DIGITS && x.fd[n] == '0') n++;
    if (n == JN_DIGITS || x.fd[n] != '1' || !rest_zero(&x, n + 1)) return INT32_MIN;
    return -(n + 1);
}

static int64_t pow10i(int n)
{
    int64_t p = 1;
    while (n-- > 0) p *= 10;
    return p;
}

/* The quotients q with lo <= q * k <= hi (k > 0): ceiling and floor of signed division. */
static void quotients(int64_t lo, int64_t hi, int64_t k, int64_t *ql, int64_t *qh)
{
    *ql = lo / k + (lo % k > 0 ? 1 : 0);
    *qh = hi / k - (hi % k < 0 ? 1 : 0);
}

/* The numbers q * D * 10^-n for q in [ql, qh], listed, each in its shortest writing (2.5, 3). */
static struct frag list_multiples(struct gb *b, int64_t ql, int64_t qh, int64_t D, int n)
{
    const int64_t p = pow10i(n);
    struct frag f = gb_alt_begin(b);
    for (int64_t q = ql; q <= qh; q++) {
        int64_t x = q * D, a = x < 0 ? -x : x;
        char s[48];
        int k = snprintf(s, sizeof s, "%s%lld", x < 0 ? "-" : "", (long long)(a / p));
        if (a % p) {
            k += snprintf(s + k, sizeof s - (size_t)k, ".%0*lld", n, (long long)(a % p));
            while (s[k - 1] == '0') s[--k] = 0;
        }
        gb_alt_add(b, f, gb_lits(b, s));
    }
    return f;
}

/* q * 10^zeros written out: "0", or q's digits and the zeros. */
static struct frag zeros_after(struct gb *b, struct frag q, int zeros)
{
    for (int i = 0; i < zeros; i++) q = gb_seq(b, q, gb_lits(b, "0"));
    return q;
}

int jn_int_multiples(struct gb *b, int64_t l, int64_t h, int64_t k, struct frag *out,
                     const char **why)
{
    *why = NULL;
    int64_t ql, qh;
    quotients(l, h, k, &ql, &qh);
    if (ql > qh) {
        *why = "no multiple lies within the bounds";
        return QERR_INVALID;
    }
    if (qh - ql < JN_LIST_MAX) {
        *out = list_multiples(b, ql, qh, k, 0);
        return 0;
    }
    int zeros = 0;
    int64_t p = 1;
    while (p < k && zeros < JN_DIGITS) p *= 10, zeros++;
    if (p != k) {
        *why = "'multipleOf' of an integer not a power of ten, with more than 4096 multiples in "
               "the bounds";
        return QERR_UNSUPPORTED;
    }
    /* a power of ten: the quotient's digits, then the zeros ("0" alone for 0) */
    struct frag f = gb_alt_begin(b);
    if (qh > 0) gb_alt_add(b, f, zeros_after(b, jn_int_range(b, ql > 1 ? ql : 1, qh), zeros));
    if (ql <= 0 && qh >= 0) gb_alt_add(b, f, gb_lits(b, "0"));
    if (ql < 0) gb_alt_add(b, f, zeros_after(b, jn_int_range(b, ql, qh < -1 ? qh : -1), zeros));
    *out = f;
    return 0;
}

/* floor and ceiling of v * 10^n, from v's shortest decimal; false when out of range. */
static bool scaled(double v, int n, int64_t *fl, int64_t *ce)
{
    struct bound d;
    if (bound_of(fabs(v), false, &d)) return false;
    if (d.ip > (uint64_t)(INT64_MAX / 4 / pow10i(n))) return false;
    int64_t x = (int64_t)d.ip;
    for (int i = 0; i < n; i++) x = x * 10 + (d.fd[i] - '0');
    bool exact = rest_zero(&d, n);
    if (v >= 0) {
        *fl = x;
        *ce = x + !exact;
    } else {
        *fl = -x - !exact;
        *ce = -x;
    }
    return true;
}

int jn_decimal_multiples(struct gb *b, double lo, bool lo_ex, double hi, bool hi_ex, double d,
                         struct frag *out, const char **why)
{
    *why = NULL;
    struct bound m;
    if (bound_of(d, false, &m)) goto unsupported;
    int n = JN_DIGITS;
    while (n > 0 && m.fd[n - 1] == '0') n--;
    int64_t D, dc, lf, lc, hf, hc;
    if (n > 6 || !scaled(d, n, &D, &dc) || !scaled(lo, n, &lf, &lc) || !scaled(hi, n, &hf, &hc))
        goto unsupported;
    /* the scaled multiples x = q * D within the bounds */
    int64_t xl = lo_ex ? lf + 1 : lc, xh = hi_ex ? hc - 1 : hf;
    int64_t ql, qh;
    quotients(xl, xh, D, &ql, &qh);
    if (ql > qh) {
        *why = "no multiple lies within the bounds";
        return QERR_INVALID;
    }
    if (qh - ql >= JN_LIST_MAX) goto unsupported;
    *out = list_multiples(b, ql, qh, D, n);
    return 0;
unsupported:
    *why = "'multipleOf' other than an integer or a power of ten needs bounds with at most 4096 "
           "multiples between them, and at most 6 fraction digits";
    return QERR_UNSUPPORTED;
}
