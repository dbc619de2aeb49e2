/* json_schema_scalar: strings (minLength/maxLength, pattern, format; strings "not" keeps out)
 * and numbers (integer or not, bounds, multipleOf: json_number.c builds them). */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "json_schema_impl.h"

struct format {
    const char *name, *re;
};

/* calendar dates only (no February 30th; the 29th in leap years), years 0001-9999 as Python's
 * date takes them */
#define RE_YEAR "([0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)"
#define RE_LEAP "([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00)"
#define RE_DATE                                                                                    \
    "(" RE_YEAR "-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"   \
    "02-(0[1-9]|1[0-9]|2[0-8]))|" RE_LEAP "-02-29)"
#define RE_TIME                                                                                    \
    "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,6})?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9]" \
    ")"
#define RE_OCTET "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
/* RFC 4291's text forms, "::" included (no zone, no embedded IPv4) */
#define RE_H16 "[0-9a-fA-F]{1,4}"
#define RE_IPV6                                                                                    \
    "((" RE_H16 ":){7}" RE_H16 "|(" RE_H16 ":){1,7}:|(" RE_H16 ":){1,6}:" RE_H16 "|(" RE_H16       \
    ":){1,5}(:" RE_H16 "){1,2}|(" RE_H16 ":){1,4}(:" RE_H16 "){1,3}|(" RE_H16 ":){1,3}(:" RE_H16   \
    "){1,4}|(" RE_H16 ":){1,2}(:" RE_H16 "){1,5}|" RE_H16 ":(:" RE_H16 "){1,6}|:((:" RE_H16        \
    "){1,7}|:))"
/* RFC 1123 labels of up to 32 characters, up to 6 of them (within the 253 a name may have) */
#define RE_LABEL "[a-zA-Z0-9]([a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?"
/* RFC 3339 appendix A's duration, numbers of up to 9 digits */
#define RE_DUR_N "[0-9]{1,9}"
#define RE_DUR_TIME                                                                                \
    "T(" RE_DUR_N "H(" RE_DUR_N "M(" RE_DUR_N "S)?)?|" RE_DUR_N "M(" RE_DUR_N "S)?|" RE_DUR_N "S)"
#define RE_DUR_DATE                                                                                \
    "(" RE_DUR_N "D|" RE_DUR_N "M(" RE_DUR_N "D)?|" RE_DUR_N "Y(" RE_DUR_N "M(" RE_DUR_N "D)?)?)"

#define RE_UUIDV(v)                                                                                \
    "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-" v "[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}"
/* RFC 3986's characters: unreserved, reserved but '#', '[' and ']', and %-escapes */
#define RE_URI_CH   "([A-Za-z0-9._~:/?@!$&'()*+,;=-]|%[0-9A-Fa-f]{2})"
#define RE_URI_FRAG "(#" RE_URI_CH "{0,50})?"
#define RE_URI      "[a-zA-Z][a-zA-Z0-9+.-]{0,15}:" RE_URI_CH "{1,100}" RE_URI_FRAG
/* a relative reference: no scheme, so no ':' in its first segment (none at all, here) */
#define RE_RELREF  "([A-Za-z0-9._~/?@!$&'()*+,;=-]|%[0-9A-Fa-f]{2}){0,100}" RE_URI_FRAG
#define RE_BASE64  "([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"
#define RE_PREFIX4 "(3[0-2]|[12]?[0-9])"
#define RE_PREFIX6 "(12[0-8]|1[01][0-9]|[1-9]?[0-9])"
#define RE_NET4                                                                                    \
    "(" RE_OCTET "\\.0\\.0\\.0/8|(" RE_OCTET "\\.){2}0\\.0/16|(" RE_OCTET "\\.){3}0/24|(" RE_OCTET \
    "\\.){3}" RE_OCTET "(/32)?|0\\.0\\.0\\.0/0)"
#define RE_NET6                                                                                    \
    "((" RE_H16 ":):/16|(" RE_H16 ":){2}:/32|(" RE_H16 ":){3}:/48|(" RE_H16 ":){4}:/64|(" RE_H16   \
    ":){5}:/80|(" RE_H16 ":){6}:/96|(" RE_H16 ":){7}:/112|(" RE_IPV6 ")(/128)?|::/0)"

#define RE_EMAIL_LOCAL "[a-zA-Z0-9_%+-]{1,32}(\\.[a-zA-Z0-9_%+-]{1,32}){0,3}"
#define RE_EMAIL       RE_EMAIL_LOCAL "@[a-zA-Z0-9-]{1,32}(\\.[a-zA-Z0-9-]{1,32}){0,3}\\.[a-zA-Z]{2,8}"
#define RE_HOSTNAME    RE_LABEL "(\\." RE_LABEL "){0,5}"
/* RFC 6901: up to 8 reference tokens of up to 32 characters */
#define RE_JSON_POINTER "(/([A-Za-z0-9._$@ -]|~[01]){0,32}){0,8}"

static const struct format formats[] = {
    {"date", RE_DATE},
    {"time", RE_TIME},
    {"date-time", RE_DATE "T" RE_TIME},
    {"email", RE_EMAIL},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"uri", RE_URI},
    {"ipv4", "(" RE_OCTET "\\.){3}" RE_OCTET},
    {"ipv6", RE_IPV6},
    {"hostname", RE_HOSTNAME},
    {"duration", "P(" RE_DUR_DATE "(" RE_DUR_TIME ")?|" RE_DUR_TIME "|" RE_DUR_N "W)"},
    /* Pydantic's UUID1..UUID8: the version digit, and RFC 4122's variant (else there is none) */
    {"uuid1", RE_UUIDV("1")},
    {"uuid2", RE_UUIDV("2")},
    {"uuid3", RE_UUIDV("3")},
    {"uuid4", RE_UUIDV("4")},
    {"uuid5", RE_UUIDV("5")},
    {"uuid6", RE_UUIDV("6")},
    {"uuid7", RE_UUIDV("7")},
    {"uuid8", RE_UUIDV("8")},
    /* Pydantic's network types: an interface is any address with any prefix; a network's host
     * bits must be zero, so it is written on whole bytes (IPv4) or groups (IPv6) ending in zeros */
    {"ipv4interface", "(" RE_OCTET "\\.){3}" RE_OCTET "/" RE_PREFIX4},
    {"ipv6interface", RE_IPV6 "/" RE_PREFIX6},
    {"ipv4network", RE_NET4},
    {"ipv6network", RE_NET6},
    {"ipvanyaddress", "(" RE_OCTET "\\.){3}" RE_OCTET "|" RE_IPV6},
    {"ipvanyinterface", "(" RE_OCTET "\\.){3}" RE_OCTET "/" RE_PREFIX4 "|" RE_IPV6 "/" RE_PREFIX6},
    {"ipvanynetwork", RE_NET4 "|" RE_NET6},
    /* RFC 4648 base64 with its padding (OpenAPI calls it byte) */
    {"base64", RE_BASE64},
    {"byte", RE_BASE64},
    /* RFC 3986: a URI, or a relative reference of its characters (no spaces) */
    {"uri-reference", RE_URI "|" RE_RELREF},
    {"url", RE_URI},
    /* the rest of JSON Schema's formats, as subsets: an ASCII IRI is a URI, an ASCII name an IDN
     * one; a template without expressions; a regex of literal characters */
    {"iri", RE_URI},
    {"iri-reference", RE_URI "|" RE_RELREF},
    {"idn-email", RE_EMAIL},
    {"idn-hostname", RE_HOSTNAME},
    {"uri-template", "[a-zA-Z][a-zA-Z0-9+.-]{0,15}:([A-Za-z0-9._~:/?@!$&()*+,;=-]|%[0-9A-Fa-f]{2})"
                     "{1,100}"},
    {"json-pointer", RE_JSON_POINTER},
    {"relative-json-pointer", "(0|[1-9][0-9]{0,8})(#|" RE_JSON_POINTER ")"},
    {"regex", "[A-Za-z0-9 _-]{0,64}"},
    /* formats that say what a string is for, not how it is written: any string (so is a
     * format outside JSON Schema's list, as the specification says of unknown formats) */
    {"binary", NULL},
    {"password", NULL},
    {"path", NULL},
};

/* A string other than the listed ones (what "not" of an enum leaves): written without escapes,
 * so each listed string has one spelling to keep out. */
static struct frag string_less(struct js *j, int min, int max, const char *re,
                               const cJSON *excluded)
{
    struct gb *b = j->b;
    int s0 = b->n_states, e0 = b->n_edges;
    struct frag f;
    if (re) {
        f = gb_lits(b, "\"");
        int r0 = b->n_states, re0 = b->n_edges;
        struct frag r = gb_regex(b, re, strlen(re), true);
        if (min > 0 || max >= 0) r = gb_length(b, r, r0, re0, min, max);
        f = gb_seq(b, gb_seq(b, f, r), gb_lits(b, "\""));
    } else {
        if (max > j->free_max) max = j->free_max > min ? j->free_max : min;
        f = js_string_plain(b, min, max);
    }
    return js_exclude_strings(j, f, s0, e0, NULL, excluded);
}

struct frag js_string_value(struct js *j, const cJSON *s)
{
    struct gb *b = j->b;
    int min = 0, max = -1;
    bool has_min = js_get_count(j, s, "minLength", &min, LENGTH_MAX);
    bool has_max = js_get_count(j, s, "maxLength", &max, LENGTH_MAX);
    if (b->rc) return (struct frag){0, 0};
    if (has_max && min > max) return js_nothing(j, "%s", "minLength > maxLength");
    const cJSON *pat = get(s, "pattern"), *fmt = get(s, "format");
    if (pat && fmt) return js_fail(j, QERR_UNSUPPORTED, "%s", "'pattern' with 'format'");
    const char *re = NULL;
    if (pat) {
        if (!cJSON_IsString(pat))
            return js_fail(j, QERR_INVALID, "%s", "'pattern' must be a string");
        re = pat->valuestring;
    } else if (fmt) {
        if (!cJSON_IsString(fmt))
            return js_fail(j, QERR_INVALID, "%s", "'format' must be a string");
        size_t k = 0;
        while (k < sizeof formats / sizeof formats[0] && strcmp(fmt->valuestring, formats[k].name))
            k++;
        re = k < sizeof formats / sizeof formats[0] ? formats[k].re : NULL;
    }
    const cJSON *excluded = get(s, KW_EXCLUDED);
    if (excluded) return string_less(j, min, max, re, excluded);
    if (!re) {
        /* a free string's automaton spells out each count (~22 DFA states a character): a
         * longer maxLength is cut to free_max (every output still fits it), a minLength cannot
         * be */
        if (min > JS_FREE_MAX) {
            char msg[80];
            snprintf(msg, sizeof msg, "'minLength' above %d is not supported", JS_FREE_MAX);
            return js_fail(j, QERR_UNSUPPORTED, "%s", msg);
        }
        j->cut |= max > JS_FREE_MIN;
        if (max > j->free_max) max = j->free_max > min ? j->free_max : min;
        return js_string(b, min, max);
    }
    struct frag f = gb_lits(b, "\"");
    int s0 = b->n_states, e0 = b->n_edges;
    struct frag r = gb_regex(b, re, strlen(re), true);
    if (has_max && max > JS_FREE_MIN) {
        /* cut like a free string's (a retry may cut below the format's own shortest string:
         * then the schema is too large after all) */
        j->cut = true;
        if (max > j->free_max) max = j->free_max > min ? j->free_max : min;
    }
    if (has_min || has_max) r = gb_length(b, r, s0, e0, min, max);
    f = gb_seq(b, f, r);
    return gb_seq(b, f, gb_lits(b, "\""));
}

/* A bound keyword as a double; false when absent. */
static bool bound(struct js *j, const cJSON *s, const char *k, double *out)
{
    const cJSON *v = get(s, k);
    if (!v) return false;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) {
        js_fail(j, QERR_INVALID, "'%s' must be a number", k);
        return false;
    }
    *out = v->valuedouble;
    return true;
}

/* multipleOf: an integer k (the multiples of k, written as integers), a power of ten below 1 (a
 * number then writes at most that many fraction digits; an integer is always one), or another
 * decimal (a number's multiples listed, when the bounds leave few). */
struct frag js_number_value(struct js *j, const cJSON *s, bool integer)
{
    struct gb *b = j->b;
    double lo = -(double)JN_MAX, hi = (double)JN_MAX, v, mult = 0;
    bool lo_ex = false, hi_ex = false, has = false;
    if (bound(j, s, "minimum", &v)) lo = v, has = true;
    if (bound(j, s, "maximum", &v)) hi = v, has = true;
    if (bound(j, s, "exclusiveMinimum", &v) && v >= lo) lo = v, lo_ex = true, has = true;
    if (bound(j, s, "exclusiveMaximum", &v) && v <= hi) hi = v, hi_ex = true, has = true;
    if (bound(j, s, "multipleOf", &mult) && !(mult > 0))
        return js_fail(j, QERR_INVALID, "%s", "'multipleOf' must be above 0");
    if (b->rc) return (struct frag){0, 0};
    if (fabs(lo) > (double)JN_MAX || fabs(hi) > (double)JN_MAX)
        return js_fail(j, QERR_UNSUPPORTED, "%s", "bounds beyond 15 digits");
    int64_t k = 1;
    int max_frac = JN_DIGITS;
    if (mult > 0) {
        int p10 = jn_power_of_ten(mult);
        if (p10 != INT32_MIN && p10 <= 0) {
            if (!integer && p10 == 0) integer = true;
            if (!integer) max_frac = -p10;
        } else if (mult == floor(mult) && mult <= (double)JN_MAX) {
            k = (int64_t)mult;
            integer = true;
        } else if (!integer) {
            struct frag f;
            const char *why;
            int rc = jn_decimal_multiples(b, lo, lo_ex, hi, hi_ex, mult, &f, &why);
            return rc == QERR_INVALID ? js_nothing(j, "%s", why)
                   : rc               ? js_fail(j, rc, "%s", why)
                                      : f;
        } else {
            return js_fail(j, QERR_UNSUPPORTED, "%s",
                           "an integer's 'multipleOf' must be an integer or a power of ten");
        }
    }
    if (!has && k == 1 && max_frac == JN_DIGITS) return jn_number(b, integer);
    struct frag f;
    const char *why = NULL;
    int rc;
    if (integer) {
        double l = lo_ex ? floor(lo) + 1 : ceil(lo), h = hi_ex ? ceil(hi) - 1 : floor(hi);
        if (l > h) return js_nothing(j, "%s", "no integer lies within the bounds");
        if (k == 1) return jn_int_range(b, (int64_t)l, (int64_t)h);
        rc = jn_int_multiples(b, (int64_t)l, (int64_t)h, k, &f, &why);
    } else {
        rc = jn_decimal_range(b, lo, lo_ex, hi, hi_ex, max_frac, &f, &why);
    }
    return rc == QERR_INVALID ? js_nothing(j, "%s", why) : rc ? js_fail(j, rc, "%s", why) : f;
}
