/* The grammar engine: regexes, JSON Schema compilation (what each keyword accepts and refuses),
 * integer ranges against brute force, the cache, and the token mask on the real vocabulary
 * compared with a token-by-token check of every token. */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/gguf.h"
#include "../engine/grammar.h"
#include "../engine/grammar_cache.h"
#include "../engine/tokenizer.h"
#include "testutil.h"

static struct gguf_file *gf;
static struct tokenizer *tok;
static struct grammar_vocab *vocab;

static void load_vocab(void)
{
    if (vocab) return;
    struct qerr err = {0};
    ck_assert_msg(gguf_open(tu_model_path(), &gf, &err) == 0, "%s", err.msg);
    ck_assert_msg(tokenizer_load(gf, &tok, &err) == 0, "%s", err.msg);
    ck_assert_msg(grammar_vocab_create(tok, tokenizer_vocab_size(tok), &vocab, &err) == 0, "%s",
                  err.msg);
}

/* A small vocabulary-free matcher: grammars are checked on bytes through a one-token-per-byte
 * view, so these tests need no model. */
static struct grammar *compile_ok(enum grammar_kind k, const char *text)
{
    struct grammar *g = NULL;
    struct qerr err = {0};
    int rc = grammar_compile(k, text, strlen(text), &g, &err);
    ck_assert_msg(rc == 0, "compile '%s': %s", text, err.msg);
    return g;
}

static int compile_rc(enum grammar_kind k, const char *text, char *msg, size_t cap)
{
    struct grammar *g = NULL;
    struct qerr err = {0};
    int rc = grammar_compile(k, text, strlen(text), &g, &err);
    if (msg) snprintf(msg, cap, "%s", err.msg);
    grammar_unref(g);
    return rc;
}

/* Whether the whole string s is in the grammar (1), a proper prefix only (2), or neither (0). */
static int matches(struct grammar *g, const char *s)
{
    load_vocab();
    struct grammar_matcher *m;
    struct qerr err = {0};
    ck_assert(grammar_matcher_create(g, vocab, &m, &err) == 0);
    int rc = grammar_matcher_accept_bytes(m, s, strlen(s), &err);
    int out = rc ? 0 : grammar_matcher_accepting(m) ? 1 : 2;
    grammar_matcher_free(m);
    return out;
}

#define ACCEPTS(g, s) ck_assert_msg(matches(g, s) == 1, "should accept: %s", s)
#define REJECTS(g, s) ck_assert_msg(matches(g, s) != 1, "should reject: %s", s)

/* v thousandths in its shortest writing: "-1.25", "3", "0.007". */
static void thousandths(int v, char *num, size_t cap)
{
    int a = abs(v);
    snprintf(num, cap, "%s%d.%03d", v < 0 ? "-" : "", a / 1000, a % 1000);
    char *end = num + strlen(num);
    while (end[-1] == '0') *--end = 0;
    if (end[-1] == '.') *--end = 0;
}

START_TEST(regex_basics)
{
    struct grammar *g = compile_ok(GRAMMAR_REGEX, "(ab|c)+[0-9]{2,3}x?");
    ACCEPTS(g, "ab12");
    ACCEPTS(g, "cab123x");
    REJECTS(g, "ab1");
    REJECTS(g, "ab1234");
    ck_assert_int_eq(matches(g, "ab1"), 2);
    grammar_unref(g);
    g = compile_ok(GRAMMAR_REGEX, "[^a-z]\\d\\w\\s.");
    ACCEPTS(g, "Z1_ é");
    REJECTS(g, "a1_ x");
    REJECTS(g, "Z1_ \n");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_REGEX, "^héllo [α-ω]+$");
    ACCEPTS(g, "héllo αβγ");
    REJECTS(g, "hello αβγ");
    grammar_unref(g);
    char msg[512];
    ck_assert_int_eq(compile_rc(GRAMMAR_REGEX, "(?=a)b", msg, sizeof msg), QERR_UNSUPPORTED);
    ck_assert_int_eq(compile_rc(GRAMMAR_REGEX, "(a)\\1", msg, sizeof msg), QERR_UNSUPPORTED);
    ck_assert_int_eq(compile_rc(GRAMMAR_REGEX, "(ab", msg, sizeof msg), QERR_UNSUPPORTED);
    ck_assert_msg(strstr(msg, "unclosed"), "%s", msg);
}
END_TEST

START_TEST(choice)
{
    struct grammar *g = compile_ok(GRAMMAR_CHOICE, "[\"yes\", \"no\", \"maybe so\"]");
    ACCEPTS(g, "yes");
    ACCEPTS(g, "maybe so");
    REJECTS(g, "ye");
    REJECTS(g, "yess");
    grammar_unref(g);
    ck_assert_int_eq(compile_rc(GRAMMAR_CHOICE, "[1]", NULL, 0), QERR_INVALID);
}
END_TEST

START_TEST(json_object_any)
{
    struct grammar *g = compile_ok(GRAMMAR_JSON_OBJECT, "");
    ACCEPTS(g, "{}");
    ACCEPTS(g, "{\"a\":1,\"b\":[true,null,{\"c\":\"\\u00e9x\"}],\"d\":-1.5e3}");
    ACCEPTS(g, "{\"a\": [1, 2], \"b\": {}}");
    REJECTS(g, "[]");
    REJECTS(g, "{\"a\":01}");
    REJECTS(g, "{\"a\":1,}");
    REJECTS(g, "{ \"a\":1}");
    REJECTS(g, "{\"a\":\"\n\"}");
    grammar_unref(g);
}
END_TEST

START_TEST(schema_objects)
{
    struct grammar *g = compile_ok(
        GRAMMAR_JSON_SCHEMA,
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"age\":{\"type\":"
        "\"integer\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}}},"
        "\"required\":[\"name\"]}");
    ACCEPTS(g, "{\"name\":\"x\"}");
    ACCEPTS(g, "{\"name\": \"x\", \"age\": 3}");
    ACCEPTS(g, "{\"name\":\"x\",\"tags\":[\"a\",\"b\"]}");
    ACCEPTS(g, "{\"name\":\"x\",\"age\":3,\"tags\":[]}");
    REJECTS(g, "{\"age\":3}");
    REJECTS(g, "{\"name\":\"x\",\"other\":1}");
    REJECTS(g, "{\"age\":3,\"name\":\"x\"}");
    grammar_unref(g);
    /* all optional: the comma only between written members */
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"properties\":{\"a\":{\"type\":\"boolean\"},\"b\":{\"type\":\"null\"},"
                   "\"c\":{\"enum\":[1,\"x\"]}}}");
    ACCEPTS(g, "{}");
    ACCEPTS(g, "{\"b\":null}");
    ACCEPTS(g, "{\"a\":true,\"c\":\"x\"}");
    REJECTS(g, "{,\"b\":null}");
    REJECTS(g, "{\"c\":2}");
    grammar_unref(g);
    /* additionalProperties as a schema */
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"additionalProperties\":{\"type\":"
                                        "\"integer\"}}");
    ACCEPTS(g, "{\"x\":1,\"y\":2}");
    REJECTS(g, "{\"x\":\"1\"}");
    grammar_unref(g);
}
END_TEST

START_TEST(schema_arrays)
{
    struct grammar *g =
        compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"items\":{\"type\":"
                                        "\"integer\"},\"minItems\":2,\"maxItems\":3}");
    REJECTS(g, "[1]");
    ACCEPTS(g, "[1,2]");
    ACCEPTS(g, "[1, 2, 3]");
    REJECTS(g, "[1,2,3,4]");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":"
                   "\"number\"}],\"items\":false}");
    ACCEPTS(g, "[\"a\",1.5]");
    ACCEPTS(g, "[\"a\"]");
    REJECTS(g, "[\"a\",1,2]");
    REJECTS(g, "[1]");
    grammar_unref(g);
    /* many items: the item schema becomes a rule reached by calls */
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"array\",\"items\":{\"type\":\"object\",\"properties\":{\"k\":{"
                   "\"type\":\"integer\"}},\"required\":[\"k\"]},\"minItems\":10,\"maxItems\":20}");
    char buf[400] = "[";
    for (int i = 0; i < 10; i++) strcat(buf, i ? ",{\"k\":1}" : "{\"k\":1}");
    REJECTS(g, buf);
    strcat(buf, "]");
    ACCEPTS(g, buf);
    grammar_unref(g);
}
END_TEST

START_TEST(schema_strings)
{
    struct grammar *g =
        compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":2,\"maxLength\":4}");
    REJECTS(g, "\"a\"");
    ACCEPTS(g, "\"ab\"");
    ACCEPTS(g, "\"a\\\"éc\"");
    REJECTS(g, "\"abcde\"");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d+$\"}");
    ACCEPTS(g, "\"AB-12\"");
    REJECTS(g, "\"A-12\"");
    grammar_unref(g);
    const char *fmts[][3] = {
        {"date", "\"2024-02-29\"", "\"2024-13-01\""},
        {"date-time", "\"2024-02-29T12:30:00Z\"", "\"2024-02-29 12:30:00\""},
        {"time", "\"23:59:59+01:00\"", "\"24:00:00Z\""},
        {"email", "\"a.b@example.com\"", "\"ab@\""},
        {"uuid", "\"123e4567-e89b-12d3-a456-426614174000\"", "\"123e4567\""},
        {"uri", "\"https://example.com/x?y=1\"", "\"no scheme\""},
        {"ipv4", "\"192.168.0.255\"", "\"256.1.1.1\""},
        {"ipv6", "\"2001:db8::1\"", "\"2001:db8:::1\""},
        {"ipv6", "\"::\"", "\"1:2:3:4:5:6:7:8:9\""},
        {"ipv6", "\"fe80:0:0:0:0:0:0:1\"", "\"12345::\""},
        {"ipv6", "\"1:2:3:4:5:6:7::\"", "\"1::2::3\""},
        {"hostname", "\"api.example-1.com\"", "\"-bad.com\""},
        {"hostname", "\"localhost\"", "\"a..b\""},
        {"hostname", "\"a1.b2\"", "\"bad-.com\""},
        {"duration", "\"P3Y6M4DT12H30M5S\"", "\"P\""},
        {"duration", "\"P2W\"", "\"PT\""},
        {"duration", "\"PT36H\"", "\"P1H\""},
        {"duration", "\"P1M\"", "\"P1D2M\""},
        {"ipv4interface", "\"10.0.0.1/24\"", "\"10.0.0.1/33\""},
        {"ipv4network", "\"10.1.0.0/16\"", "\"10.1.0.1/16\""},
        {"ipv4network", "\"10.1.2.3\"", "\"10.0.0.0/7\""},
        {"ipv6interface", "\"fe80::1/64\"", "\"fe80::1/129\""},
        {"ipv6network", "\"2001:db8::/32\"", "\"2001:db8::1/32\""},
        {"ipvanyaddress", "\"::1\"", "\"1.2.3\""},
        {"ipvanyinterface", "\"1.2.3.4/0\"", "\"1.2.3.4/\""},
        {"ipvanynetwork", "\"::/0\"", "\"1.2.3.4/24\""},
        {"uuid4", "\"123e4567-e89b-42d3-a456-426614174000\"",
         "\"123e4567-e89b-12d3-a456-426614174000\""},
        {"uuid4", "\"123e4567-e89b-42d3-B456-426614174000\"",
         "\"123e4567-e89b-42d3-c456-426614174000\""},
        {"uri", "\"urn:isbn:0451450523#p%2A\"", "\"https://example.com/memo<\""},
        {"uri", "\"a:b\"", "\"a:%zz\""},
        {"uri-reference", "\"../a/b?c#d\"", "\"1:x\""},
        {"byte", "\"aGk=\"", "\"aGk\""},
        {"base64", "\"aGk=\"", "\"aGk\""},
        {"base64", "\"\"", "\"a===\""},
        {"binary", "\"any \\\"thing\\\"\"", "\"a"},
        {"password", "\"\"", "1"},
    };
    for (size_t i = 0; i < sizeof fmts / sizeof fmts[0]; i++) {
        char s[200];
        snprintf(s, sizeof s, "{\"type\":\"string\",\"format\":\"%s\"}", fmts[i][0]);
        g = compile_ok(GRAMMAR_JSON_SCHEMA, s);
        ACCEPTS(g, fmts[i][1]);
        REJECTS(g, fmts[i][2]);
        grammar_unref(g);
    }
}
END_TEST

/* minLength/maxLength beside a pattern: every string over {a,b,c,d,é} of up to 6 characters,
 * against POSIX regexec and the length in characters (é is two bytes, one character). */
START_TEST(length_with_pattern)
{
    const char *alpha[] = {"a", "b", "c", "d", "\xc3\xa9"};
    const struct {
        const char *re;
        int min, max;
    } cases[] = {{"(ab|c)*d?", 2, 4}, {"[a-d]+", 0, 3},  {"[a-d]+", 3, -1},
                 {".*", 1, 2},        {"(a|é)*c", 2, 5}, {"d?(ab)*", 3, 3}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char schema[200], anchored[64];
        int n = snprintf(schema, sizeof schema, "{\"type\":\"string\",\"pattern\":\"^%s$\"",
                         cases[i].re);
        if (cases[i].min)
            n += snprintf(schema + n, sizeof schema - n, ",\"minLength\":%d", cases[i].min);
        if (cases[i].max >= 0)
            n += snprintf(schema + n, sizeof schema - n, ",\"maxLength\":%d", cases[i].max);
        snprintf(schema + n, sizeof schema - n, "}");
        struct grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA, schema);
        snprintf(anchored, sizeof anchored, "^(%s)$", cases[i].re);
        regex_t rx;
        ck_assert_int_eq(regcomp(&rx, anchored, REG_EXTENDED | REG_NOSUB), 0);
        int checked = 0;
        for (int len = 0; len <= 6; len++) {
            int total = 1;
            for (int k = 0; k < len; k++) total *= 5;
            for (int code = 0; code < total; code++) {
                char str[32] = "", quoted[40];
                for (int k = 0, c = code; k < len; k++, c /= 5) strcat(str, alpha[c % 5]);
                snprintf(quoted, sizeof quoted, "\"%s\"", str);
                bool want = regexec(&rx, str, 0, NULL, 0) == 0 && len >= cases[i].min &&
                            (cases[i].max < 0 || len <= cases[i].max);
                ck_assert_msg((matches(g, quoted) == 1) == want, "%s: %s should be %s", schema,
                              quoted, want ? "accepted" : "rejected");
                checked++;
            }
        }
        ck_assert_int_gt(checked, 19000);
        regfree(&rx);
        grammar_unref(g);
    }
    /* a format's own lengths make a bound moot (Pydantic's HttpUrl: 1 to 2083); a tighter one
     * cuts it */
    struct grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"uri\","
                                                        "\"minLength\":1,\"maxLength\":2083}");
    ACCEPTS(g, "\"https://example.com/a?b=1\"");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"string\",\"format\":\"uri\",\"maxLength\":10}");
    ACCEPTS(g, "\"http://x.y\"");
    REJECTS(g, "\"http://x.yz\"");
    grammar_unref(g);
    char msg[512];
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"type\":\"string\",\"format\":\"date\",\"maxLength\":9}", msg,
                                sizeof msg),
                     QERR_INVALID);
    /* a free string's long maxLength is cut to 500 characters; a long minLength is refused */
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"maxLength\":5000}");
    char longs[600];
    for (int len = 499; len <= 501; len++) {
        longs[0] = '"';
        memset(longs + 1, 'x', (size_t)len);
        longs[len + 1] = '"';
        longs[len + 2] = 0;
        ck_assert_msg((matches(g, longs) == 1) == (len <= 500), "%d characters", len);
    }
    grammar_unref(g);
    /* three long strings make too large an automaton at 500 characters each: the compile is
     * tried again with them cut shorter (here to 125), never below 32 */
    g = compile_ok(
        GRAMMAR_JSON_SCHEMA,
        "{\"properties\":{\"a\":{\"type\":\"string\",\"maxLength\":2048},\"b\":{\"type\":"
        "\"string\",\"maxLength\":2048},\"c\":{\"type\":\"string\",\"format\":\"email\","
        "\"maxLength\":255}},\"required\":[\"a\",\"b\",\"c\"]}");
    char three[200];
    snprintf(three, sizeof three, "{\"a\":\"%032d\", \"b\":\"\", \"c\":\"a@b.cd\"}", 0);
    ACCEPTS(g, three);
    snprintf(three, sizeof three, "{\"a\":\"%0130d\", \"b\":\"\", \"c\":\"a@b.cd\"}", 0);
    REJECTS(g, three);
    grammar_unref(g);
    ck_assert_int_eq(
        compile_rc(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"minLength\":501}", msg, sizeof msg),
        QERR_UNSUPPORTED);
    ck_assert_msg(strstr(msg, "minLength"), "%s", msg);
}
END_TEST

/* format date: exactly the calendar's dates (leap years by the Gregorian rule, years 1-9999),
 * every day 0-32 of months 0-13 in ten years checked */
START_TEST(calendar_dates)
{
    struct grammar *g =
        compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"date\"}");
    static const int years[] = {0, 1, 4, 100, 400, 1900, 2000, 2023, 2024, 9999};
    static const int mdays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    for (size_t i = 0; i < sizeof years / sizeof years[0]; i++) {
        int y = years[i];
        bool leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        for (int m = 0; m <= 13; m++)
            for (int d = 0; d <= 32; d++) {
                char s[24];
                snprintf(s, sizeof s, "\"%04d-%02d-%02d\"", y, m, d);
                bool want =
                    y >= 1 && m >= 1 && m <= 12 && d >= 1 && d <= mdays[m - 1] + (m == 2 && leap);
                ck_assert_msg((matches(g, s) == 1) == want, "%s should be %s", s,
                              want ? "accepted" : "rejected");
            }
    }
    grammar_unref(g);
}
END_TEST

/* uniqueItems over listed values, against every array of up to 4 of them; and an object keyed
 * by a list (propertyNames), each key once. */
START_TEST(unique_items)
{
    struct grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA,
                                   "{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/c\"},"
                                   "\"uniqueItems\":true,\"minItems\":1,\"maxItems\":3,\"$defs\":{"
                                   "\"c\":{\"enum\":[\"r\",\"g\",\"b\",7]}}}");
    const char *vals[] = {"\"r\"", "\"g\"", "\"b\"", "7"};
    for (int len = 0; len <= 4; len++) {
        int total = 1;
        for (int k = 0; k < len; k++) total *= 4;
        for (int code = 0; code < total; code++) {
            char arr[64] = "[";
            int used = 0;
            bool distinct = true;
            for (int k = 0, c = code; k < len; k++, c /= 4) {
                if (k) strcat(arr, ", ");
                strcat(arr, vals[c % 4]);
                distinct &= !(used & 1 << (c % 4));
                used |= 1 << (c % 4);
            }
            strcat(arr, "]");
            bool want = distinct && len >= 1 && len <= 3;
            ck_assert_msg((matches(g, arr) == 1) == want, "%s should be %s", arr,
                          want ? "accepted" : "rejected");
        }
    }
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"uniqueItems\":true}");
    ACCEPTS(g, "[true, false]");
    REJECTS(g, "[false,false]");
    grammar_unref(g);
    char msg[512];
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"items\":{\"enum\":[1,2]},\"uniqueItems\":true,\"minItems\":3}",
                                msg, sizeof msg),
                     QERR_INVALID);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA, "{\"uniqueItems\":1}", msg, sizeof msg),
                     QERR_INVALID);
    /* other items: compiled without the check (README) */
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"uniqueItems\":true}");
    ACCEPTS(g, "[\"a\", \"b\"]");
    grammar_unref(g);
    /* a dict keyed by an enum */
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"object\",\"propertyNames\":{\"enum\":[\"x\",\"y\"]},"
                   "\"additionalProperties\":{\"type\":\"integer\"}}");
    ACCEPTS(g, "{}");
    ACCEPTS(g, "{\"y\":2, \"x\":1}");
    REJECTS(g, "{\"x\":1,\"x\":2}");
    REJECTS(g, "{\"z\":1}");
    REJECTS(g, "{\"x\":\"1\"}");
    grammar_unref(g);
}
END_TEST

START_TEST(property_names_and_patterns)
{
    struct grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA,
                                   "{\"type\":\"object\",\"propertyNames\":{\"pattern\":\"^[a-z]{"
                                   "1,3}$\"},\"maxProperties\":2}");
    ACCEPTS(g, "{\"abc\":[1]}");
    ACCEPTS(g, "{\"a\":1, \"b\":{\"c\":null}}");
    REJECTS(g, "{\"abcd\":1}");
    REJECTS(g, "{\"A\":1}");
    REJECTS(g, "{\"a\":1,\"b\":2,\"c\":3}");
    grammar_unref(g);
    /* patternProperties beside listed properties the pattern does not match; a pattern whose
     * schema says nothing may match them */
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"properties\":{\"id\":{\"type\":\"integer\"}},\"required\":[\"id\"],"
                   "\"patternProperties\":{\"^x-[a-z]+$\":{\"type\":\"string\"}}}");
    ACCEPTS(g, "{\"id\":1}");
    ACCEPTS(g, "{\"id\":1, \"x-ab\":\"s\", \"x-c\":\"t\"}");
    REJECTS(g, "{\"id\":1,\"y\":\"s\"}");
    REJECTS(g, "{\"id\":1,\"x-ab\":2}");
    grammar_unref(g);
    grammar_unref(compile_ok(GRAMMAR_JSON_SCHEMA,
                             "{\"properties\":{\"max\":{\"type\":\"integer\"}},"
                             "\"patternProperties\":{\"a\":{}}}"));
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"properties\":{\"ab\":{\"type\":\"integer\"},\"AB\":{\"type\":"
                   "\"integer\"}},\"propertyNames\":{\"pattern\":\"^[a-z]+$\"}}");
    ACCEPTS(g, "{\"ab\":1}");
    REJECTS(g, "{\"AB\":1}");
    grammar_unref(g);
    /* beside listed properties: an optional one the names rule out is never written */
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"}},"
                   "\"propertyNames\":{\"const\":\"a\"}}");
    ACCEPTS(g, "{\"a\":1}");
    REJECTS(g, "{\"b\":1}");
    REJECTS(g, "{\"a\":1,\"b\":1}");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"object\",\"patternProperties\":{\"^s_[a-z]+$\":{\"type\":"
                   "\"integer\"}},\"minProperties\":1}");
    ACCEPTS(g, "{\"s_ab\":1}");
    ACCEPTS(g, "{\"s_ab\":1, \"s_c\":-2}");
    REJECTS(g, "{}");
    REJECTS(g, "{\"ab\":1}");
    REJECTS(g, "{\"s_ab\":\"x\"}");
    grammar_unref(g);
    char msg[512];
    const char *refused[][2] = {
        {"{\"properties\":{\"a\":{}},\"required\":[\"a\"],\"propertyNames\":{\"enum\":[\"b\"]}}",
         "propertyNames"},
        {"{\"propertyNames\":{\"type\":\"integer\"}}", "string schema"},
        {"{\"patternProperties\":{\"^a\":{},\"^b\":{}}}", "one pattern"},
        {"{\"properties\":{\"x-a\":{\"type\":\"integer\"}},\"patternProperties\":{\"^x-\":{"
         "\"type\":\"string\"}}}",
         "also matches"},
        /* JSON Schema's patterns match anywhere unless anchored: "max" holds an "a" */
        {"{\"properties\":{\"max\":{\"type\":\"integer\"}},\"patternProperties\":{\"a\":{"
         "\"type\":\"string\"}}}",
         "also matches"},
        {"{\"properties\":{\"ab\":{},\"AB\":{}},\"required\":[\"AB\"],\"propertyNames\":{"
         "\"pattern\":\"^[a-z]+$\"}}",
         "propertyNames"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ck_assert_int_ne(compile_rc(GRAMMAR_JSON_SCHEMA, refused[i][0], msg, sizeof msg), 0);
        ck_assert_msg(strstr(msg, refused[i][1]), "%s: %s", refused[i][0], msg);
    }
}
END_TEST

/* Keywords beside $ref, const/enum and anyOf hold too; allOf parts meet; a required key the
 * properties do not list; other keys never take a listed property's name; keywords outside
 * JSON Schema's vocabulary are ignored. Each case is one of maskbench's unsound or refused
 * patterns (tools/schema-coverage.py). */
START_TEST(schema_siblings_and_merges)
{
    const struct {
        const char *schema, *yes[3], *no[4];
    } cases[] = {
        /* anyOf beside properties: each branch holds them too */
        {"{\"type\":\"object\",\"properties\":{\"shape\":{\"enum\":[\"circle\",\"square\"]},"
         "\"radius\":{\"type\":\"number\"},\"side\":{\"type\":\"number\"}},\"required\":[\"shape\"]"
         ","
         "\"oneOf\":[{\"properties\":{\"shape\":{\"const\":\"circle\"}},\"required\":[\"radius\"]},"
         "{\"properties\":{\"shape\":{\"const\":\"square\"}},\"required\":[\"side\"]}]}",
         {"{\"shape\":\"circle\",\"radius\":2}", "{\"shape\":\"square\",\"side\":1}"},
         {"{\"shape\":\"circle\",\"radius\":null}", "{\"shape\":\"circle\"}",
          "{\"shape\":\"square\",\"radius\":1}", "{\"radius\":1}"}},
        /* $ref beside maxLength */
        {"{\"$ref\":\"#/$defs/s\",\"maxLength\":3,\"$defs\":{\"s\":{\"type\":\"string\","
         "\"pattern\":\"^[a-z]+$\"}}}",
         {"\"abc\"", "\"a\""},
         {"\"abcd\"", "\"ab1\""}},
        /* enum beside type and maxLength: only the values both allow */
        {"{\"type\":\"string\",\"enum\":[\"a\",1,\"bb\"],\"maxLength\":1}",
         {"\"a\""},
         {"1", "\"bb\""}},
        /* a property two allOf parts list holds to both schemas; types meet */
        {"{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"properties\":{\"a\":{"
         "\"minimum\":5}}}]}",
         {"{\"a\":7}", "{}"},
         {"{\"a\":3}", "{\"a\":7.5}"}},
        {"{\"allOf\":[{\"type\":[\"string\",\"null\"]},{\"type\":\"string\",\"maxLength\":2}]}",
         {"\"ab\""},
         {"null", "\"abc\""}},
        /* one keyword in two parts: the bounds that hold for both, the values in both */
        {"{\"allOf\":[{\"minLength\":1,\"maxLength\":4},{\"minLength\":2,\"maxLength\":9}]}",
         {"\"ab\"", "\"abcd\""},
         {"\"a\"", "\"abcde\""}},
        {"{\"allOf\":[{\"enum\":[1,2,3]},{\"enum\":[2,3,4]},{\"required\":[\"a\"]}]}",
         {"2", "3"},
         {"1", "4"}},
        /* allOf of one part and annotations: that part */
        {"{\"allOf\":[{\"$ref\":\"#/definitions/"
         "e\"}],\"description\":\"d\",\"definitions\":{\"e\":{"
         "\"enum\":[\"x\",\"y\"]}}}",
         {"\"x\""},
         {"\"z\""}},
        /* a required key not listed: there, with additionalProperties' schema */
        {"{\"required\":[\"a\"],\"additionalProperties\":{\"type\":\"integer\"}}",
         {"{\"a\":1}"},
         {"{}", "{\"a\":\"x\"}"}},
        /* other keys may not take a listed name (the listed schema would not hold) */
        {"{\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":true}",
         {"{\"a\":1, \"b\":\"x\"}", "{\"ab\":\"x\"}", "{\"\":1}"},
         {"{\"a\":\"x\"}", "{\"b\":1,\"a\":\"x\"}", "{\"\\u0061\":\"x\"}"}},
        /* drafts 4-2019: items as a list, additionalItems */
        {"{\"items\":[{\"type\":\"integer\"}],\"additionalItems\":{\"type\":\"boolean\"}}",
         {"[1, true]", "[]"},
         {"[1, 2]", "[true]"}},
        /* not: required keys kept out (also from other keys), types, strings; in oneOf
         * branches ("x or y, not both") */
        {"{\"properties\":{\"a\":{},\"b\":{}},\"additionalProperties\":true,\"not\":{"
         "\"required\":[\"b\"]}}",
         {"{\"a\":1}", "{\"bb\":1}"},
         {"{\"a\":1,\"b\":2}", "{\"b\":1}"}},
        {"{\"properties\":{\"x\":{\"type\":\"integer\"},\"y\":{\"type\":\"integer\"}},"
         "\"oneOf\":[{\"required\":[\"x\"],\"not\":{\"required\":[\"y\"]}},{\"required\":["
         "\"y\"],\"not\":{\"required\":[\"x\"]}}]}",
         {"{\"x\":1}", "{\"y\":1}"},
         {"{\"x\":1,\"y\":2}", "{}"}},
        {"{\"not\":{\"type\":[\"object\",\"array\",\"null\"]}}",
         {"1", "\"a\"", "true"},
         {"null", "[]", "{}"}},
        {"{\"type\":\"string\",\"not\":{\"enum\":[\"a\",\"b\"]}}",
         {"\"c\"", "\"ab\"", "\"\""},
         {"\"a\"", "\"b\"", "\"\\u0061\""}},
        {"{\"properties\":{\"a\":{\"not\":{}},\"b\":{\"type\":\"integer\"}}}",
         {"{\"b\":1}"},
         {"{\"a\":1}"}},
        /* outside the vocabulary: ignored */
        {"{\"type\":\"integer\",\"id\":\"x\",\"x-kubernetes-int-or-string\":true,\"example\":3}",
         {"3"},
         {"\"3\""}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA, cases[i].schema);
        for (int k = 0; k < 3 && cases[i].yes[k]; k++)
            ck_assert_msg(matches(g, cases[i].yes[k]) == 1, "%s should take %s", cases[i].schema,
                          cases[i].yes[k]);
        for (int k = 0; k < 4 && cases[i].no[k]; k++)
            ck_assert_msg(matches(g, cases[i].no[k]) != 1, "%s should refuse %s", cases[i].schema,
                          cases[i].no[k]);
        grammar_unref(g);
    }
    char msg[512];
    ck_assert_int_eq(
        compile_rc(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"enum\":[1,2]}", msg, sizeof msg),
        QERR_INVALID);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"allOf\":[{\"pattern\":\"^a\"},{\"pattern\":\"b$\"}]}", msg,
                                sizeof msg),
                     QERR_UNSUPPORTED);
    ck_assert_msg(strstr(msg, "disagree"), "%s", msg);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"allOf\":[{\"enum\":[1,2]},{\"enum\":[3]}]}", msg, sizeof msg),
                     QERR_INVALID);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA, "{\"not\":{}}", msg, sizeof msg),
                     QERR_INVALID);
    /* required says nothing of a string, so its negation holds of none */
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"type\":\"string\",\"not\":{\"required\":[\"a\"]}}", msg,
                                sizeof msg),
                     QERR_INVALID);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"properties\":{\"a\":{}},\"required\":[\"a\"],\"not\":{"
                                "\"required\":[\"a\"]}}",
                                msg, sizeof msg),
                     QERR_INVALID);
}
END_TEST

/* minProperties/maxProperties beside listed properties (and other keys), against every object
 * of the listed a, b, c (in order, each present or not) and up to two other keys */
START_TEST(counted_properties)
{
    const struct {
        const char *counts;
        int min, max;
        bool extra;
    } cases[] = {{"\"minProperties\":1", 1, 99, false},
                 {"\"maxProperties\":2", 0, 2, false},
                 {"\"minProperties\":2,\"maxProperties\":3", 2, 3, true},
                 {"\"minProperties\":3", 3, 99, true}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char schema[300];
        snprintf(
            schema, sizeof schema,
            "{\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"integer\"},\"c\":{"
            "\"type\":\"integer\"}},\"additionalProperties\":%s,%s}",
            cases[i].extra ? "{\"type\":\"integer\"}" : "false", cases[i].counts);
        struct grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA, schema);
        for (int set = 0; set < 8; set++)
            for (int others = 0; others <= 2; others++) {
                char obj[120] = "{";
                int n = 0;
                for (int k = 0; k < 3; k++)
                    if (set & 1 << k) {
                        size_t len = strlen(obj);
                        snprintf(obj + len, sizeof obj - len, "%s\"%c\":%d", n++ ? ", " : "",
                                 'a' + k, k);
                    }
                for (int k = 0; k < others; k++) {
                    size_t len = strlen(obj);
                    snprintf(obj + len, sizeof obj - len, "%s\"x%d\":%d", n++ ? ", " : "", k, k);
                }
                strcat(obj, "}");
                bool want = n >= cases[i].min && n <= cases[i].max && (cases[i].extra || !others);
                ck_assert_msg((matches(g, obj) == 1) == want, "%s: %s should be %s", schema, obj,
                              want ? "accepted" : "rejected");
            }
        grammar_unref(g);
    }
}
END_TEST

/* Oracles for if_then_else_brute_force: kind 0 (absent), 1-3 ("a".."c"); x, y present. */
static bool ite_kind_a(int kind, bool x, bool y)
{
    return kind <= 1 ? x : y; /* if kind (when there) is "a" then x else y */
}
static bool ite_required_enum(int kind, bool x, bool y)
{
    (void)y; /* if kind is there and "a" or "b", then x; no else */
    return (kind == 1 || kind == 2) ? x : true;
}
static bool ite_required_only(int kind, bool x, bool y)
{
    (void)kind; /* if x then y */
    return !x || y;
}
static bool ite_false(int kind, bool x, bool y)
{
    (void)kind;
    (void)x;
    return y; /* if false: else alone */
}
static bool ite_unused(int kind, bool x, bool y)
{
    (void)kind, (void)x, (void)y; /* then/else without if say nothing */
    return true;
}

/* if/then/else over every object of a kind (absent, "a", "b", "c") and optional x and y. */
START_TEST(if_then_else_brute_force)
{
    const struct {
        const char *kws;
        bool (*want)(int kind, bool x, bool y);
    } cases[] = {
        {"\"if\":{\"properties\":{\"kind\":{\"const\":\"a\"}}},\"then\":{\"required\":[\"x\"]},"
         "\"else\":{\"required\":[\"y\"]}",
         ite_kind_a},
        {"\"if\":{\"properties\":{\"kind\":{\"enum\":[\"a\",\"b\"]}},\"required\":[\"kind\"]},"
         "\"then\":{\"required\":[\"x\"]}",
         ite_required_enum},
        {"\"if\":{\"required\":[\"x\"]},\"then\":{\"required\":[\"y\"]}", ite_required_only},
        {"\"if\":false,\"then\":{\"required\":[\"x\"]},\"else\":{\"required\":[\"y\"]}", ite_false},
        {"\"then\":{\"required\":[\"x\"]},\"else\":{\"required\":[\"y\"]}", ite_unused},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char schema[400];
        snprintf(
            schema, sizeof schema,
            "{\"type\":\"object\",\"properties\":{\"kind\":{\"type\":\"string\",\"enum\":[\"a\","
            "\"b\",\"c\"]},\"x\":{\"type\":\"integer\"},\"y\":{\"type\":\"integer\"}},"
            "\"additionalProperties\":false,%s}",
            cases[i].kws);
        struct grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA, schema);
        for (int kind = 0; kind < 4; kind++)
            for (int xy = 0; xy < 4; xy++) {
                char obj[80] = "{";
                int n = 0;
                if (kind) snprintf(obj + 1, sizeof obj - 1, "\"kind\":\"%c\"", 'a' + kind - 1), n++;
                if (xy & 1) strcat(obj, n++ ? ", \"x\":1" : "\"x\":1");
                if (xy & 2) strcat(obj, n++ ? ", \"y\":2" : "\"y\":2");
                strcat(obj, "}");
                bool want = cases[i].want(kind, xy & 1, xy & 2);
                ck_assert_msg((matches(g, obj) == 1) == want, "%s: %s should be %s", schema, obj,
                              want ? "accepted" : "rejected");
            }
        grammar_unref(g);
    }
}
END_TEST

/* GRAMMAR_AFTER_THINK: free reasoning up to "</think>", then spaces or newlines, then the
 * grammar; the reasoning alone never ends the output. */
START_TEST(after_think)
{
    struct grammar *g =
        compile_ok(GRAMMAR_JSON_SCHEMA | GRAMMAR_AFTER_THINK,
                   "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"}},"
                   "\"required\":[\"x\"]}");
    ACCEPTS(g, "Let me think: </thin, </ think>.</think>\n\n{\"x\":1}");
    ACCEPTS(g, "</think>{\"x\":2}");
    REJECTS(g, "{\"x\":1}");
    REJECTS(g, "a</think>b</think>{\"x\":1}");
    REJECTS(g, "a</think>");
    REJECTS(g, "a</think>\n{}");
    ck_assert_int_eq(matches(g, "a</thi"), 2);
    grammar_unref(g);
    g = compile_ok(GRAMMAR_CHOICE | GRAMMAR_AFTER_THINK, "[\"yes\",\"no\"]");
    ACCEPTS(g, "hm</think> no");
    REJECTS(g, "hm</think> maybe");
    grammar_unref(g);
}
END_TEST

/* Oracles for dependencies_brute_force: which members an object has (bit k: the k-th of
 * a, b, c, d; bit 4: the extra key x0), and a's value. */
static bool dep_names(unsigned has, int a)
{
    (void)a; /* a needs b; c needs d (draft 3's one name) */
    return (!(has & 1) || has & 2) && (!(has & 4) || has & 8) && !(has & 16);
}
static bool dep_required_and_schema(unsigned has, int a)
{
    (void)a; /* a needs b and c; d needs a (a schema with required) */
    return (!(has & 1) || (has & 6) == 6) && (!(has & 8) || has & 1) && !(has & 16);
}
static bool dep_schema_bound(unsigned has, int a)
{
    /* with b, an a (when there is one) is at least 5 */
    return (!(has & 2) || !(has & 1) || a >= 5) && !(has & 16);
}
static bool dep_mutual(unsigned has, int a)
{
    (void)a;
    return !(has & 1) == !(has & 2) && !(has & 16);
}
static bool dep_extra_key(unsigned has, int a)
{
    (void)a; /* an extra key x0 needs d */
    return !(has & 16) || has & 8;
}
static bool dep_contradiction(unsigned has, int a)
{
    (void)a; /* a needs b, and b rules a out: no a */
    return !(has & 1) && !(has & 16);
}

/* dependencies, dependentRequired and dependentSchemas over every set of members: each
 * object's verdict against the rule it states. */
START_TEST(dependencies_brute_force)
{
    const struct {
        const char *kws, *extra;
        bool (*want)(unsigned has, int a);
    } cases[] = {
        {"\"dependencies\":{\"a\":[\"b\"],\"c\":\"d\"}", "false", dep_names},
        {"\"dependentRequired\":{\"a\":[\"b\",\"c\"]},\"dependentSchemas\":{\"d\":{\"required\":["
         "\"a\"]}}",
         "false", dep_required_and_schema},
        {"\"dependencies\":{\"b\":{\"properties\":{\"a\":{\"minimum\":5}}}}", "false",
         dep_schema_bound},
        {"\"dependentRequired\":{\"a\":[\"b\"],\"b\":[\"a\"]}", "false", dep_mutual},
        {"\"dependencies\":{\"x0\":[\"d\"]}", "{\"type\":\"integer\"}", dep_extra_key},
        {"\"dependentRequired\":{\"a\":[\"b\"]},\"dependentSchemas\":{\"b\":{\"not\":{"
         "\"required\":[\"a\"]}}}",
         "false", dep_contradiction},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char schema[400];
        snprintf(schema, sizeof schema,
                 "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{"
                 "\"type\":\"integer\"},\"c\":{\"type\":\"integer\"},\"d\":{\"type\":\"integer\"}},"
                 "\"additionalProperties\":%s,%s}",
                 cases[i].extra, cases[i].kws);
        struct grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA, schema);
        for (unsigned has = 0; has < 32; has++)
            for (int a = 1; a <= 7; a += 6) {
                char obj[120] = "{";
                int n = 0;
                for (int k = 0; k < 5; k++) {
                    if (!(has & 1u << k)) continue;
                    size_t len = strlen(obj);
                    snprintf(obj + len, sizeof obj - len, "%s\"%s\":%d", n++ ? ", " : "",
                             (const char *const[]){"a", "b", "c", "d", "x0"}[k], k ? k : a);
                }
                strcat(obj, "}");
                bool want = cases[i].want(has, a);
                ck_assert_msg((matches(g, obj) == 1) == want, "%s: %s should be %s", schema, obj,
                              want ? "accepted" : "rejected");
            }
        grammar_unref(g);
    }
    char msg[512];
    ck_assert_int_eq(
        compile_rc(GRAMMAR_JSON_SCHEMA, "{\"dependentRequired\":{\"a\":{}}}", msg, sizeof msg),
        QERR_INVALID);
    ck_assert_int_eq(
        compile_rc(
            GRAMMAR_JSON_SCHEMA,
            "{\"dependentRequired\":{\"a\":[\"b\"],\"b\":[\"c\"],\"c\":[\"d\"],\"d\":[\"e\"],"
            "\"e\":[\"f\"],\"f\":[\"g\"],\"g\":[\"a\"]}}",
            msg, sizeof msg),
        QERR_UNSUPPORTED);
    ck_assert_msg(strstr(msg, "more than 6"), "%s", msg);
}
END_TEST

/* Where a schema allows no value: an optional property or an anyOf branch is left out, a
 * required one (or the whole schema) is an error. */
START_TEST(unsatisfiable_parts_left_out)
{
    struct grammar *g = compile_ok(
        GRAMMAR_JSON_SCHEMA,
        "{\"properties\":{\"a\":{\"type\":\"object\",\"enum\":[\"x\"]},\"b\":{\"type\":\"integer\"}"
        ","
        "\"c\":{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"minLength\":3,"
        "\"maxLength\":2}},\"required\":[\"d\"]}},\"required\":[\"b\"]}");
    ACCEPTS(g, "{\"b\":1}");
    REJECTS(g, "{\"a\":\"x\",\"b\":1}");
    REJECTS(g, "{\"b\":1,\"c\":{}}");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"anyOf\":[{\"type\":\"integer\",\"minimum\":5,\"maximum\":4},{\"type\":"
                   "\"array\",\"minItems\":2,\"maxItems\":1},{\"type\":\"boolean\"}]}");
    ACCEPTS(g, "true");
    REJECTS(g, "5");
    REJECTS(g, "[]");
    grammar_unref(g);
    char msg[512];
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"properties\":{\"a\":{\"type\":\"object\",\"enum\":[\"x\"]}},"
                                "\"required\":[\"a\"]}",
                                msg, sizeof msg),
                     QERR_INVALID);
    ck_assert_msg(strstr(msg, "/properties/a"), "%s", msg);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"anyOf\":[{\"type\":\"integer\",\"minimum\":5,\"maximum\":4},{"
                                "\"minLength\":1,\"maxLength\":0}]}",
                                msg, sizeof msg),
                     QERR_INVALID);
    /* a branch quern refuses is what the error names when no branch is left */
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"anyOf\":[{\"type\":\"integer\",\"minimum\":5,\"maximum\":4},{"
                                "\"pattern\":\"(?=a)\"}]}",
                                msg, sizeof msg),
                     QERR_UNSUPPORTED);
    /* malformed, not empty: never left out */
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"properties\":{\"a\":{\"type\":\"string\",\"minLength\":-1}}}",
                                msg, sizeof msg),
                     QERR_INVALID);
}
END_TEST

/* $ref by anchor ($anchor; drafts 4-7's id "#name") and by pointers with %-escapes, which are
 * decoded before the pointer's ~ escapes (RFC 6901: %7E0 is ~0, then ~). */
START_TEST(ref_anchors_and_escapes)
{
    struct grammar *g = compile_ok(
        GRAMMAR_JSON_SCHEMA,
        "{\"type\":\"array\",\"prefixItems\":[{\"$ref\":\"#num\"},{\"$ref\":\"#flag\"},{\"$ref\":"
        "\"#/definitions/a%20b\"},{\"$ref\":\"#/definitions/c~1d%7E0\"}],\"items\":false,"
        "\"definitions\":{\"n\":{\"$anchor\":\"num\",\"type\":\"integer\"},\"f\":{\"id\":\"#flag\","
        "\"type\":\"boolean\"},\"a b\":{\"type\":\"null\"},\"c/d~0\":{\"const\":\"wrong\"},"
        "\"c/d~\":{\"const\":\"s\"}}}");
    ACCEPTS(g, "[1, true, null, \"s\"]");
    REJECTS(g, "[true, 1, null, \"s\"]");
    REJECTS(g, "[1, true, null, \"wrong\"]");
    grammar_unref(g);
    char msg[512];
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"$ref\":\"#nowhere\",\"$defs\":{\"a\":{\"$anchor\":\"else\"}}}",
                                msg, sizeof msg),
                     QERR_INVALID);
    ck_assert_msg(strstr(msg, "points to nothing"), "%s", msg);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"$ref\":\"#/$defs/a%00b\",\"$defs\":{\"a\":{}}}", msg,
                                sizeof msg),
                     QERR_INVALID);
}
END_TEST

/* Formats: JSON Schema's own, as subsets; others are annotations (any string). */
START_TEST(formats_standard_and_unknown)
{
    struct grammar *g =
        compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"json-pointer\"}");
    ACCEPTS(g, "\"\"");
    ACCEPTS(g, "\"/a/b~1c/~0\"");
    REJECTS(g, "\"a/b\"");
    REJECTS(g, "\"/a~2\"");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"string\",\"format\":\"relative-json-pointer\"}");
    ACCEPTS(g, "\"0#\"");
    ACCEPTS(g, "\"12/a\"");
    REJECTS(g, "\"01/a\"");
    REJECTS(g, "\"/a\"");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"iri\"}");
    ACCEPTS(g, "\"https://example.com/a?b=c\"");
    REJECTS(g, "\"no scheme\"");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"format\":\"color\"}");
    ACCEPTS(g, "\"dark red\"");
    ACCEPTS(g, "\"\"");
    grammar_unref(g);
}
END_TEST

/* An anyOf branch that cannot be compiled is left out; what it built is taken back (here the
 * generic JSON value's rule, made inside the dropped branch, then needed by the next). */
START_TEST(any_of_drops_unsupported)
{
    struct grammar *g = compile_ok(
        GRAMMAR_JSON_SCHEMA,
        "{\"anyOf\":[{\"properties\":{\"a\":true,\"b\":{\"contains\":{}}},\"required\":[\"a\","
        "\"b\"]},"
        "{\"type\":\"array\",\"items\":true},{\"type\":\"string\",\"pattern\":\"^(?!x)a$\"}]}");
    ACCEPTS(g, "[1, {\"x\":[2]}]");
    REJECTS(g, "{\"a\":1,\"b\":2}");
    REJECTS(g, "\"a\"");
    grammar_unref(g);
    char msg[512];
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"anyOf\":[{\"pattern\":\"(?=a)\"},{\"contains\":{}}]}", msg,
                                sizeof msg),
                     QERR_UNSUPPORTED);
    ck_assert_msg(strstr(msg, "lookaround"), "%s", msg);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"anyOf\":[{\"type\":\"integer\"},{\"minLength\":-1}]}", msg,
                                sizeof msg),
                     QERR_INVALID);
}
END_TEST

START_TEST(integer_ranges)
{
    static const long long ranges[][2] = {{0, 0},     {0, 9},     {1, 100}, {-5, 5},
                                          {-120, -7}, {17, 2345}, {-99, 0}, {100, 100}};
    for (size_t r = 0; r < sizeof ranges / sizeof ranges[0]; r++) {
        char s[200];
        snprintf(s, sizeof s, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}",
                 ranges[r][0], ranges[r][1]);
        struct grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA, s);
        for (long long v = -3000; v <= 3000; v += (v > -200 && v < 200) ? 1 : 7) {
            char num[32];
            snprintf(num, sizeof num, "%lld", v);
            bool in = v >= ranges[r][0] && v <= ranges[r][1];
            ck_assert_msg((matches(g, num) == 1) == in, "%s: %lld", s, v);
        }
        REJECTS(g, "-0");
        REJECTS(g, "01");
        grammar_unref(g);
    }
    struct grammar *g =
        compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"exclusiveMinimum\":0}");
    REJECTS(g, "0");
    ACCEPTS(g, "1");
    ACCEPTS(g, "123456789");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"minimum\":-10,\"maximum\":10}");
    ACCEPTS(g, "9.75");
    ACCEPTS(g, "10");
    ACCEPTS(g, "-10.0");
    REJECTS(g, "10.5");
    REJECTS(g, "-11");
    grammar_unref(g);
}
END_TEST

/* multipleOf: integers (listed, or a power of ten's trailing zeros), and powers of ten below 1
 * as a cap on a number's fraction digits; other values are refused. */
START_TEST(multiple_of)
{
    struct grammar *g = compile_ok(
        GRAMMAR_JSON_SCHEMA,
        "{\"type\":\"integer\",\"multipleOf\":7,\"exclusiveMinimum\":-20,\"maximum\":30}");
    for (int v = -100; v <= 100; v++) {
        char num[16];
        snprintf(num, sizeof num, "%d", v);
        bool in = v % 7 == 0 && v > -20 && v <= 30;
        ck_assert_msg((matches(g, num) == 1) == in, "multipleOf 7: %d", v);
    }
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"multipleOf\":100}");
    ACCEPTS(g, "0");
    ACCEPTS(g, "100");
    ACCEPTS(g, "-2500");
    ACCEPTS(g, "123400");
    REJECTS(g, "150");
    REJECTS(g, "-0");
    REJECTS(g, "000");
    REJECTS(g, "-100000000000000000");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"multipleOf\":10,\"minimum\":-35,\"maximum\":12000}");
    ACCEPTS(g, "-30");
    ACCEPTS(g, "0");
    ACCEPTS(g, "12000");
    REJECTS(g, "-40");
    REJECTS(g, "12010");
    REJECTS(g, "15.0");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":1}");
    ACCEPTS(g, "-3");
    REJECTS(g, "3.5");
    grammar_unref(g);
    /* 0.1 above 0.05 and at most 2: values of one fraction digit */
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.1,"
                                        "\"exclusiveMinimum\":0.05,\"maximum\":2}");
    for (int v = -1000; v <= 3000; v++) {
        char num[24];
        thousandths(v, num, sizeof num);
        const char *dot = strchr(num, '.');
        bool in = v > 50 && v <= 2000 && (!dot || strlen(dot + 1) <= 1);
        ck_assert_msg((matches(g, num) == 1) == in, "multipleOf 0.1: %s", num);
    }
    grammar_unref(g);
    /* 0.25 above -1 and at most 1: listed, each in its shortest writing */
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.25,"
                                        "\"exclusiveMinimum\":-1,\"maximum\":1}");
    for (int v = -2000; v <= 2000; v++) {
        char num[24];
        thousandths(v, num, sizeof num);
        bool in = v % 250 == 0 && v > -1000 && v <= 1000;
        ck_assert_msg((matches(g, num) == 1) == in, "multipleOf 0.25: %s", num);
    }
    REJECTS(g, "0.50");
    grammar_unref(g);
    char msg[512];
    ck_assert_int_eq(
        compile_rc(GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"integer\",\"multipleOf\":3,\"minimum\":0,\"maximum\":1000000}", msg,
                   sizeof msg),
        QERR_UNSUPPORTED);
    ck_assert_int_eq(
        compile_rc(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"multipleOf\":0}", msg, sizeof msg),
        QERR_INVALID);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"type\":\"integer\",\"multipleOf\":5,\"minimum\":1,"
                                "\"maximum\":4}",
                                msg, sizeof msg),
                     QERR_INVALID);
}
END_TEST

START_TEST(schema_refs_and_combinators)
{
    /* a recursive tree through $ref: calls, so it nests to any depth the stack allows */
    struct grammar *g = compile_ok(
        GRAMMAR_JSON_SCHEMA,
        "{\"$ref\":\"#/$defs/node\",\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{"
        "\"v\":{\"type\":\"integer\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$"
        "defs/node\"}}},\"required\":[\"v\"]}}}");
    ACCEPTS(g, "{\"v\":1}");
    ACCEPTS(g, "{\"v\":1,\"kids\":[{\"v\":2,\"kids\":[{\"v\":3}]},{\"v\":4}]}");
    REJECTS(g, "{\"v\":1,\"kids\":[{\"kids\":[]}]}");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":2}]}");
    ACCEPTS(g, "12");
    ACCEPTS(g, "\"ab\"");
    REJECTS(g, "\"abc\"");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"allOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},"
                   "\"required\":[\"a\"]},{\"properties\":{\"b\":{\"const\":\"x\"}},"
                   "\"required\":[\"b\"]}]}");
    ACCEPTS(g, "{\"a\":1,\"b\":\"x\"}");
    REJECTS(g, "{\"a\":1}");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":[\"string\",\"null\"]}");
    ACCEPTS(g, "null");
    ACCEPTS(g, "\"s\"");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"integer\",\"nullable\":true}");
    ACCEPTS(g, "null");
    ACCEPTS(g, "-4");
    grammar_unref(g);
}
END_TEST

START_TEST(schema_refusals)
{
    char msg[512];
    ck_assert_int_eq(
        compile_rc(GRAMMAR_JSON_SCHEMA, "{\"type\":\"array\",\"contains\":{}}", msg, sizeof msg),
        QERR_UNSUPPORTED);
    ck_assert_msg(strstr(msg, "contains"), "%s", msg);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"properties\":{\"a\":{\"not\":{\"pattern\":\"x\"}}}}", msg,
                                sizeof msg),
                     QERR_UNSUPPORTED);
    ck_assert_msg(strstr(msg, "'not'") && strstr(msg, "/properties/a"), "%s", msg);
    ck_assert_int_eq(
        compile_rc(GRAMMAR_JSON_SCHEMA, "{\"$ref\":\"#/$defs/none\"}", msg, sizeof msg),
        QERR_INVALID);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA, "{\"type\":", msg, sizeof msg), QERR_INVALID);
    /* a bound of 16 fraction digits; a multipleOf; bounds that leave nothing */
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"type\":\"number\",\"minimum\":0.1234567890123456}", msg,
                                sizeof msg),
                     QERR_UNSUPPORTED);
    ck_assert_msg(strstr(msg, "fraction digits"), "%s", msg);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA, "{\"type\":\"number\",\"multipleOf\":0.5}",
                                msg, sizeof msg),
                     QERR_UNSUPPORTED);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"type\":\"number\",\"minimum\":0.5,\"exclusiveMaximum\":0.5}",
                                msg, sizeof msg),
                     QERR_INVALID);
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA,
                                "{\"type\":\"number\",\"exclusiveMinimum\":0.999999999999999,"
                                "\"exclusiveMaximum\":1}",
                                msg, sizeof msg),
                     QERR_INVALID);
}
END_TEST

/* The strings a bounded number schema takes are exactly the JSON numbers (no exponent, no
 * "-0") within its bounds: every candidate decimal of up to 3 fraction digits in [-40, 40], and
 * forms with trailing zeros, against the bounds compared as doubles (exact for these short
 * decimals); and no prefix of an allowed number is a dead end: from each live prefix some byte
 * goes on or the number may end (a walk over all prefixes of up to 5 bytes). */
static bool number_in(const char *num, double lo, bool lo_ex, double hi, bool hi_ex)
{
    double v = strtod(num, NULL);
    if (num[0] == '-' && v == 0) return false; /* the grammar never writes "-0" */
    return (lo_ex ? v > lo : v >= lo) && (hi_ex ? v < hi : v <= hi);
}

static void walk_live(struct grammar *g, char *p, int n, int depth, const char *schema)
{
    static const char bytes[] = "-.0123456789";
    bool more = false;
    for (const char *c = bytes; *c; c++) {
        p[n] = *c;
        p[n + 1] = 0;
        int m = matches(g, p);
        if (m == 0) continue;
        more = true;
        if (depth > 1) walk_live(g, p, n + 1, depth - 1, schema);
    }
    p[n] = 0;
    if (n > 0) ck_assert_msg(more || matches(g, p) == 1, "%s: '%s' is a dead end", schema, p);
}

START_TEST(number_ranges_exact)
{
    static const struct {
        const char *lo_kw, *hi_kw;
        double lo, hi;
    } cases[] = {
        {"minimum", "maximum", 0.5, 2.5},
        {"minimum", "maximum", -1.25, 3},
        {"exclusiveMinimum", "maximum", 0, 1},
        {"minimum", "exclusiveMaximum", 0, 1},
        {"exclusiveMinimum", "exclusiveMaximum", -0.3, -0.1},
        {"minimum", "maximum", 0.05, 0.07},
        {"minimum", "maximum", 1.5, 1.5},
        {"exclusiveMinimum", "exclusiveMaximum", 12.34, 12.35},
        {"minimum", "maximum", -10, 10},
        {"exclusiveMinimum", "maximum", -2.5, -2.499},
        {"minimum", NULL, 0.5, 0},
        {NULL, "exclusiveMaximum", 0, -0.5},
        {"exclusiveMinimum", "exclusiveMaximum", 0.999, 1},
    };
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        char schema[200];
        int n = snprintf(schema, sizeof schema, "{\"type\":\"number\"");
        if (cases[ci].lo_kw)
            n += snprintf(schema + n, sizeof schema - (size_t)n, ",\"%s\":%.17g", cases[ci].lo_kw,
                          cases[ci].lo);
        if (cases[ci].hi_kw)
            n += snprintf(schema + n, sizeof schema - (size_t)n, ",\"%s\":%.17g", cases[ci].hi_kw,
                          cases[ci].hi);
        snprintf(schema + n, sizeof schema - (size_t)n, "}");
        struct grammar *g = compile_ok(GRAMMAR_JSON_SCHEMA, schema);
        double lo = cases[ci].lo_kw ? cases[ci].lo : -1e300;
        double hi = cases[ci].hi_kw ? cases[ci].hi : 1e300;
        bool lo_ex = cases[ci].lo_kw && cases[ci].lo_kw[0] == 'e';
        bool hi_ex = cases[ci].hi_kw && cases[ci].hi_kw[0] == 'e';
        /* every thousandth within a unit of the bounds, every 13th elsewhere */
        int near_lo = (int)floor((cases[ci].lo_kw ? lo : hi) - 1) * 1000;
        int near_hi = (int)ceil((cases[ci].hi_kw ? hi : lo) + 1) * 1000;
        for (int v = -40000; v <= 40000; v++) {
            /* v thousandths, written with 0-3 fraction digits as it needs, and with a trailing
             * zero */
            if ((v < near_lo || v > near_hi) && v % 13) continue;
            char num[40], pad[48];
            thousandths(v, num, sizeof num);
            snprintf(pad, sizeof pad, "%s%s0", num, strchr(num, '.') ? "" : ".");
            bool in = number_in(num, lo, lo_ex, hi, hi_ex);
            ck_assert_msg((matches(g, num) == 1) == in, "%s: %s %s", schema, num,
                          in ? "rejected" : "accepted");
            ck_assert_msg((matches(g, pad) == 1) == in, "%s: %s %s", schema, pad,
                          in ? "rejected" : "accepted");
        }
        REJECTS(g, "1e0");
        REJECTS(g, "00.5");
        REJECTS(g, ".5");
        REJECTS(g, "1.");
        char p[16] = "";
        walk_live(g, p, 0, 5, schema);
        grammar_unref(g);
    }
    /* a bound of 15 fraction digits, exclusive: no number of 15 digits begins "0.09" above it,
     * so the prefix is not offered at all (it would be a dead end) */
    struct grammar *g =
        compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"type\":\"number\",\"exclusiveMinimum\":0.099999999999999,\"maximum\":1}");
    ck_assert_int_eq(matches(g, "0.09"), 0);
    REJECTS(g, "0.099999999999999");
    ACCEPTS(g, "0.1");
    ACCEPTS(g, "0.100000000000001");
    grammar_unref(g);
}
END_TEST

START_TEST(cache_lru)
{
    struct grammar_cache *c;
    struct qerr err = {0};
    ck_assert(grammar_cache_create(2, &c, &err) == 0);
    struct grammar *a, *b, *a2;
    ck_assert(grammar_cache_get(c, GRAMMAR_REGEX, "a+", 2, NULL, &a, &err) == 0);
    ck_assert(grammar_cache_get(c, GRAMMAR_REGEX, "a+", 2, NULL, &a2, &err) == 0);
    ck_assert_ptr_eq(a, a2);
    ck_assert(grammar_cache_get(c, GRAMMAR_CHOICE, "[\"a+\"]", 6, NULL, &b, &err) == 0);
    ck_assert_ptr_ne(a, b);
    uint64_t hits, misses;
    grammar_cache_stats(c, &hits, &misses);
    ck_assert_int_eq(hits, 1);
    ck_assert_int_eq(misses, 2);
    grammar_unref(a2);
    ck_assert(grammar_cache_get(c, GRAMMAR_REGEX, "(", 1, NULL, &a2, &err) != 0);
    ck_assert_ptr_null(a2);
    grammar_unref(a);
    grammar_unref(b);
    grammar_cache_free(c);
}
END_TEST

/* The mask against the definition: token t is allowed iff its bytes continue the output. */
static void check_mask_exact(struct grammar *g, const char *prefix, int stride)
{
    load_vocab();
    struct qerr err = {0};
    struct grammar_matcher *m;
    ck_assert(grammar_matcher_create(g, vocab, &m, &err) == 0);
    ck_assert_msg(grammar_matcher_accept_bytes(m, prefix, strlen(prefix), &err) == 0, "%s",
                  err.msg);
    int words = grammar_mask_words(vocab);
    uint64_t *mask = calloc((size_t)words, sizeof *mask);
    int count = grammar_matcher_mask(m, mask);
    int n = 0;
    char buf[512];
    for (int32_t t = 0; t < grammar_vocab_size(vocab); t += stride) {
        bool got = mask[t / 64] >> (t % 64) & 1;
        bool want;
        if (grammar_vocab_is_eog(vocab, t)) {
            want = grammar_matcher_accepting(m);
        } else if (tokenizer_is_control(tok, t)) {
            want = false;
        } else {
            int len = tokenizer_token_bytes(tok, t, buf, sizeof buf);
            struct grammar_matcher *m2;
            ck_assert(grammar_matcher_create(g, vocab, &m2, &err) == 0);
            grammar_matcher_accept_bytes(m2, prefix, strlen(prefix), &err);
            want = len > 0 && grammar_matcher_accept_bytes(m2, buf, (size_t)len, &err) == 0;
            grammar_matcher_free(m2);
        }
        ck_assert_msg(got == want, "prefix '%s' token %d (%s): mask %d, definition %d", prefix, t,
                      tokenizer_token_text(tok, t), got, want);
        n += got;
    }
    if (stride == 1) ck_assert_int_eq(n, count);
    free(mask);
    grammar_matcher_free(m);
}

START_TEST(mask_exact)
{
    int stride = tu_sanitized() ? 53 : 1;
    struct grammar *g = compile_ok(GRAMMAR_JSON_OBJECT, "");
    check_mask_exact(g, "", stride);
    check_mask_exact(g, "{\"a\":", stride);
    check_mask_exact(g, "{\"a\":[1,{\"b\":\"x", stride);
    check_mask_exact(g, "{\"a\":[1,{\"b\":\"x\"}", stride);
    check_mask_exact(g, "{\"a\":12", stride);
    grammar_unref(g);
    g = compile_ok(
        GRAMMAR_JSON_SCHEMA,
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":"
        "8},\"n\":{\"type\":\"integer\",\"minimum\":-20,\"maximum\":300}},\"required\":"
        "[\"name\",\"n\"]}");
    check_mask_exact(g, "", stride);
    check_mask_exact(g, "{\"name\":\"abc", stride);
    check_mask_exact(g, "{\"name\":\"abc\", \"n\": 2", stride);
    check_mask_exact(g, "{\"name\":\"abc\",\"n\":29", stride);
    check_mask_exact(g, "{\"name\":\"abc\",\"n\":299}", stride);
    grammar_unref(g);
    g = compile_ok(GRAMMAR_TOOL_CALLS,
                   "{\"tools\":[{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                   "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}],"
                   "\"parallel\":true}");
    check_mask_exact(g, "", stride);
    check_mask_exact(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"P",
                     stride);
    check_mask_exact(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"P\"}}",
                     stride);
    grammar_unref(g);
}
END_TEST

/* A matcher that has taken the bytes of prefix. */
static struct grammar_matcher *matcher_at(struct grammar *g, const char *prefix)
{
    load_vocab();
    struct grammar_matcher *m;
    struct qerr err = {0};
    ck_assert(grammar_matcher_create(g, vocab, &m, &err) == 0);
    ck_assert_msg(grammar_matcher_accept_bytes(m, prefix, strlen(prefix), &err) == 0, "'%s': %s",
                  prefix, err.msg);
    return m;
}

/* grammar_matcher_forced after prefix gives want, and agrees with a brute-force check of all
 * 256 bytes at each of its positions: exactly one byte can follow, and the output is not yet
 * whole (or, at its end, not so). */
static void check_forced(struct grammar *g, const char *prefix, const char *want)
{
    struct grammar_matcher *m = matcher_at(g, prefix);
    char got[64];
    int n = grammar_matcher_forced(m, got, (int)sizeof got);
    ck_assert_msg(n == (int)strlen(want) && !memcmp(got, want, (size_t)n),
                  "after '%s': forced '%.*s', want '%s'", prefix, n, got, want);
    for (int i = 0; i <= n; i++) {
        char at[256];
        snprintf(at, sizeof at, "%s%.*s", prefix, i, got);
        int can = 0;
        for (int c = 1; c < 256; c++) { /* (NUL never appears in these grammars) */
            struct grammar_matcher *x = matcher_at(g, at);
            struct qerr err = {0};
            char b = (char)c;
            can += grammar_matcher_accept_bytes(x, &b, 1, &err) == 0;
            grammar_matcher_free(x);
        }
        struct grammar_matcher *x = matcher_at(g, at);
        bool one = can == 1 && !grammar_matcher_accepting(x);
        grammar_matcher_free(x);
        ck_assert_msg(one == (i < n), "after '%s': %d bytes can follow", at, can);
    }
    /* the matcher did not move: the same again */
    char again[64];
    ck_assert_int_eq(grammar_matcher_forced(m, again, (int)sizeof again), n);
    ck_assert(!memcmp(again, got, (size_t)n));
    grammar_matcher_free(m);
}

/* What speculation drafts under a grammar: the bytes it forces next, and how far a run of
 * tokens stays allowed. */
START_TEST(forced_bytes_and_allowed_runs)
{
    struct grammar *g = compile_ok(
        GRAMMAR_JSON_SCHEMA,
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":"
        "8},\"n\":{\"type\":\"integer\",\"minimum\":-20,\"maximum\":300},\"tag\":{\"enum\":["
        "\"alpha\",\"beta\"]}},\"required\":[\"name\",\"n\",\"tag\"]}");
    check_forced(g, "", "{\"name\":");
    check_forced(g, "{\"name\":", "");         /* a space or the string: free */
    check_forced(g, "{\"name\":\"abc", "");    /* more of the string, or its end */
    check_forced(g, "{\"name\":\"abc\"", ","); /* then a space or '"': free */
    check_forced(g, "{\"name\":\"abc\", ", "\"n\":");
    check_forced(g, "{\"name\":\"abc\",\"n\":3", "");
    check_forced(g, "{\"name\":\"abc\",\"n\":300", ",");
    check_forced(g, "{\"name\":\"abc\",\"n\":300,\"tag\":\"", "");
    check_forced(g, "{\"name\":\"abc\",\"n\":300,\"tag\":\"b", "eta\"}");
    check_forced(g, "{\"name\":\"abc\",\"n\":300,\"tag\":\"beta\"}", ""); /* whole */

    /* a run of tokens: all of a whole output and its end, none past a byte the grammar refuses */
    static const char whole[] = "{\"name\":\"abc\", \"n\": 12, \"tag\":\"alpha\"}";
    int32_t *ids;
    size_t n;
    struct qerr err = {0};
    ck_assert(tokenizer_encode(tok, whole, strlen(whole), false, false, &ids, &n, &err) == 0);
    ids = realloc(ids, (n + 2) * sizeof *ids);
    ids[n] = tokenizer_eos(tok);
    ids[n + 1] = ids[0];
    struct grammar_matcher *m = matcher_at(g, "");
    ck_assert_int_eq(grammar_matcher_allowed_run(m, ids, (int)n), (int)n);
    ck_assert_int_eq(grammar_matcher_allowed_run(m, ids, (int)n + 2), (int)n + 1);
    ck_assert_int_eq(grammar_matcher_allowed_run(m, ids + 1, 1), 0); /* not at the start */
    int32_t *bad;
    size_t nb;
    static const char early[] = "{\"name\":\"abc\"}";
    ck_assert(tokenizer_encode(tok, early, strlen(early), false, false, &bad, &nb, &err) == 0);
    size_t ok = 0, bytes = 0; /* the tokens that end before the '}' */
    char tb_buf[64];
    while (ok < nb) {
        size_t tb = (size_t)tokenizer_token_bytes(tok, bad[ok], tb_buf, sizeof tb_buf);
        if (bytes + tb > strlen(early) - 1) break;
        bytes += tb;
        ok++;
    }
    ck_assert_uint_lt(ok, nb);
    ck_assert_int_eq(grammar_matcher_allowed_run(m, bad, (int)nb), (int)ok);
    /* the position did not move */
    char f[16];
    ck_assert_int_eq(grammar_matcher_forced(m, f, (int)sizeof f), 8);
    grammar_matcher_free(m);
    free(ids);
    free(bad);
    grammar_unref(g);

    g = compile_ok(GRAMMAR_CHOICE, "[\"apple\",\"apricot\",\"banana\"]");
    check_forced(g, "", "");
    check_forced(g, "a", "p");
    check_forced(g, "apr", "icot");
    check_forced(g, "b", "anana");
    check_forced(g, "apricot", "");
    grammar_unref(g);
}
END_TEST

/* The tool-call grammar in each chat format: Llama 3's JSON, Mistral's [TOOL_CALLS] list (with
 * and without its space) and its [ARGS] spelling; required, parallel and auto. */
START_TEST(tool_calls_formats)
{
#define TOOLS                                                                                      \
    "\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{\"x\":{"       \
    "\"type\":\"integer\"}},\"required\":[\"x\"]}},{\"name\":\"g\"}]"
    struct grammar *g =
        compile_ok(GRAMMAR_TOOL_CALLS, "{" TOOLS ",\"parallel\":true,\"format\":\"llama3\"}");
    ACCEPTS(g, "{\"name\": \"f\", \"parameters\": {\"x\":1}}");
    ACCEPTS(g,
            "{\"name\": \"f\", \"parameters\": {\"x\":1}}; {\"name\": \"g\", \"parameters\": {}}");
    REJECTS(g, "{\"name\": \"f\", \"arguments\": {\"x\":1}}");
    REJECTS(g, "Sure. {\"name\": \"f\", \"parameters\": {\"x\":1}}");
    REJECTS(g, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\":1}}\n</tool_call>");
    check_mask_exact(g, "{\"name\": \"f\", \"parameters\": {\"x\":1", tu_sanitized() ? 53 : 1);
    grammar_unref(g);
    g = compile_ok(GRAMMAR_TOOL_CALLS, "{" TOOLS ",\"parallel\":false,\"format\":\"llama3\","
                                       "\"auto\":true}");
    ACCEPTS(g, "");
    ACCEPTS(g, "It is sunny {probably}.");
    ACCEPTS(g, "{\"name\": \"g\", \"parameters\": {}}");
    ck_assert_int_eq(matches(g, "{"), 2); /* an output opened by '{' is a call */
    REJECTS(g, "{\"answer\": 1}");
    REJECTS(g,
            "{\"name\": \"f\", \"parameters\": {\"x\":1}}; {\"name\": \"g\", \"parameters\": {}}");
    grammar_unref(g);

    g = compile_ok(GRAMMAR_TOOL_CALLS, "{" TOOLS ",\"parallel\":true,\"format\":\"mistral\"}");
    ACCEPTS(g, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\":1}}]");
    ACCEPTS(g, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"x\":1}}, {\"name\": \"g\", "
               "\"arguments\": {}}]");
    REJECTS(g, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"x\":1}}]");
    REJECTS(g, "[TOOL_CALLS] []");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_TOOL_CALLS,
                   "{" TOOLS ",\"parallel\":false,\"format\":\"mistral-nospace\",\"auto\":true}");
    ACCEPTS(g, "Plain [TOOL text [TOOL_CALL");
    ACCEPTS(g, "Let me see.[TOOL_CALLS][{\"name\": \"g\", \"arguments\": {}}]");
    ck_assert_int_eq(matches(g, "x [TOOL_CALLS]"), 2); /* once opened, only a call */
    REJECTS(g, "x [TOOL_CALLS] oops");
    REJECTS(g, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"x\":1}}, {\"name\": \"g\", "
               "\"arguments\": {}}]");
    grammar_unref(g);
    g = compile_ok(GRAMMAR_TOOL_CALLS, "{" TOOLS ",\"parallel\":true,\"format\":\"mistral-args\"}");
    ACCEPTS(g, "[TOOL_CALLS]f[ARGS]{\"x\":1}");
    ACCEPTS(g, "[TOOL_CALLS]f[ARGS]{\"x\":1}[TOOL_CALLS]g[ARGS]{}");
    REJECTS(g, "[TOOL_CALLS]h[ARGS]{}");
    REJECTS(g, "[TOOL_CALLS]f[ARGS]{}");
    grammar_unref(g);
    struct grammar *bad = NULL;
    struct qerr err = {0};
    ck_assert_int_eq(grammar_compile(GRAMMAR_TOOL_CALLS, "{" TOOLS ",\"format\":\"xml\"}",
                                     strlen("{" TOOLS ",\"format\":\"xml\"}"), &bad, &err),
                     QERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "format"));
#undef TOOLS
}
END_TEST

START_TEST(tool_calls_auto)
{
    struct grammar *g = compile_ok(
        GRAMMAR_TOOL_CALLS, "{\"tools\":[{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
                            "\"properties\":{\"x\":{\"type\":\"integer\"}},\"required\":[\"x\"]}}],"
                            "\"parallel\":false,\"auto\":true}");
    ACCEPTS(g, "");
    ACCEPTS(g, "Plain text <tool <tool_cal a < b.");
    ACCEPTS(
        g, "Let me check.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\":1}}\n</tool_call>");
    ACCEPTS(g, "<<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 2}}\n</tool_call>\n");
    ck_assert_int_eq(matches(g, "text <tool_call>"), 2); /* once opened, only a call */
    REJECTS(g, "text <tool_call>\n{\"name\": \"g\"");
    REJECTS(g, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
    REJECTS(g, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\":1}}\n</tool_call> more");
    check_mask_exact(g, "Sure <tool_", tu_sanitized() ? 53 : 1);
    grammar_unref(g);
}
END_TEST

START_TEST(mask_dead_end_and_done)
{
    load_vocab();
    struct grammar *g = compile_ok(GRAMMAR_CHOICE, "[\"yes\",\"no\"]");
    struct qerr err = {0};
    struct grammar_matcher *m;
    ck_assert(grammar_matcher_create(g, vocab, &m, &err) == 0);
    ck_assert(grammar_matcher_accept_bytes(m, "yes", 3, &err) == 0);
    ck_assert(grammar_matcher_done(m));
    uint64_t *mask = calloc((size_t)grammar_mask_words(vocab), sizeof *mask);
    int n = grammar_matcher_mask(m, mask);
    /* only end-of-generation tokens remain */
    int eog = 0;
    for (int t = 0; t < grammar_vocab_size(vocab); t++) eog += grammar_vocab_is_eog(vocab, t);
    ck_assert_int_eq(n, eog);
    ck_assert(grammar_matcher_accept_bytes(m, "!", 1, &err) != 0);
    free(mask);
    grammar_matcher_free(m);
    grammar_unref(g);
}
END_TEST

START_TEST(dead_ends_pruned)
{
    /* an empty character class (after JSON-unsafe characters are removed) leads nowhere: the
     * grammar keeps no path into it, and a grammar with no path at all is refused */
    char msg[512];
    ck_assert_int_eq(compile_rc(GRAMMAR_JSON_SCHEMA, "{\"type\":\"string\",\"pattern\":\"[\\\"]\"}",
                                msg, sizeof msg),
                     QERR_INVALID);
    ck_assert_msg(strstr(msg, "no output"), "%s", msg);
    struct grammar *g = compile_ok(
        GRAMMAR_JSON_SCHEMA,
        "{\"anyOf\":[{\"type\":\"string\",\"pattern\":\"a[\\\"]\"},{\"const\":\"ab\"}]}");
    load_vocab();
    struct qerr err = {0};
    struct grammar_matcher *m;
    ck_assert(grammar_matcher_create(g, vocab, &m, &err) == 0);
    ck_assert(grammar_matcher_accept_bytes(m, "\"a", 2, &err) == 0);
    uint64_t *mask = calloc((size_t)grammar_mask_words(vocab), sizeof *mask);
    ck_assert_int_gt(grammar_matcher_mask(m, mask), 0); /* only "b" continues */
    ck_assert(grammar_matcher_accept_bytes(m, "b\"", 2, &err) == 0);
    ck_assert(grammar_matcher_accepting(m));
    grammar_matcher_free(m);
    grammar_unref(g);
    /* the call stack is bounded: nesting past GRAMMAR_MAX_DEPTH is a dead end, reported as
     * an empty mask (the engine fails the request with a message) */
    g = compile_ok(GRAMMAR_JSON_OBJECT, "");
    ck_assert(grammar_matcher_create(g, vocab, &m, &err) == 0);
    char deep[200] = "{\"a\":";
    for (int i = 0; i < GRAMMAR_MAX_DEPTH - 1; i++) strcat(deep, "[");
    ck_assert_msg(grammar_matcher_accept_bytes(m, deep, strlen(deep), &err) == 0, "%s", err.msg);
    int n = grammar_matcher_mask(m, mask);
    ck_assert_int_gt(n, 0);
    ck_assert(grammar_matcher_accept_bytes(m, "[", 1, &err) != 0);
    free(mask);
    grammar_matcher_free(m);
    grammar_unref(g);
}
END_TEST

START_TEST(schema_properties_counts)
{
    struct grammar *g =
        compile_ok(GRAMMAR_JSON_SCHEMA, "{\"type\":\"object\",\"additionalProperties\":{\"type\":"
                                        "\"integer\"},\"minProperties\":1,\"maxProperties\":2}");
    REJECTS(g, "{}");
    ACCEPTS(g, "{\"a\":1}");
    ACCEPTS(g, "{\"a\":1, \"b\":2}");
    REJECTS(g, "{\"a\":1,\"b\":2,\"c\":3}");
    grammar_unref(g);
    /* allOf with a closed branch keeps only that branch's properties */
    g = compile_ok(GRAMMAR_JSON_SCHEMA,
                   "{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},"
                   "\"additionalProperties\":false},{\"properties\":{\"b\":{\"type\":"
                   "\"integer\"}}}]}");
    ACCEPTS(g, "{\"a\":1}");
    REJECTS(g, "{\"a\":1,\"b\":2}");
    grammar_unref(g);
}
END_TEST

START_TEST(gbnf)
{
    struct grammar *g = compile_ok(GRAMMAR_GBNF, "# a comment\n"
                                                 "root ::= greeting \" \" name (\"!\" | \".\")?\n"
                                                 "greeting ::= \"hello\" | \"hi\"\n"
                                                 "name ::= [A-Z] [a-z]{1,8}\n");
    ACCEPTS(g, "hello World!");
    ACCEPTS(g, "hi Bo");
    REJECTS(g, "hey Bo");
    REJECTS(g, "hi bo");
    REJECTS(g, "hi Bobobobobo");
    grammar_unref(g);
    /* recursion becomes calls: balanced brackets */
    g = compile_ok(GRAMMAR_GBNF, "root ::= item+\nitem ::= \"[\" item* \"]\" | \"x\"\n");
    ACCEPTS(g, "x[x[]]x");
    ACCEPTS(g, "[[[x]]]");
    REJECTS(g, "[[x]");
    grammar_unref(g);
    /* multi-line alternatives and escapes */
    g = compile_ok(GRAMMAR_GBNF, "root ::= (\n  \"a\\n\"\n  | [^a-z\\]]\n)\n");
    ACCEPTS(g, "a\n");
    ACCEPTS(g, "Q");
    REJECTS(g, "q");
    grammar_unref(g);
    char msg[512];
    ck_assert_int_eq(compile_rc(GRAMMAR_GBNF, "start ::= \"a\"", msg, sizeof msg), QERR_INVALID);
    ck_assert_msg(strstr(msg, "root"), "%s", msg);
    ck_assert_int_eq(compile_rc(GRAMMAR_GBNF, "root ::= undefined-rule", msg, sizeof msg),
                     QERR_INVALID);
    ck_assert_msg(strstr(msg, "undefined-rule"), "%s", msg);
    ck_assert_int_eq(compile_rc(GRAMMAR_GBNF, "root ::= \"a", msg, sizeof msg), QERR_INVALID);
    ck_assert_int_eq(compile_rc(GRAMMAR_GBNF, "root ::= <[42]>", msg, sizeof msg), QERR_INVALID);
}
END_TEST

START_TEST(mask_apply)
{
    enum { N = 200 };
    uint64_t mask[4] = {~0ull, 0, 0x8000000000000001ull, 0x5ull};
    float l[N];
    for (int i = 0; i < N; i++) l[i] = (float)i;
    grammar_mask_apply(mask, l, N);
    for (int i = 0; i < N; i++) {
        bool keep = mask[i / 64] >> (i % 64) & 1;
        ck_assert_msg(keep ? l[i] == (float)i : isinf(l[i]) && l[i] < 0, "logit %d", i);
    }
}
END_TEST

/* Mutated schemas and regexes: every compile either succeeds or fails with a message, never
 * crashes or leaks (the sanitizer build checks the latter); what compiles gives a mask. */
static uint64_t fuzz_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

START_TEST(fuzz_compilers)
{
    size_t len;
    char *path = NULL;
    const char *dir = getenv("QUERN_SCHEMAS");
    if (!dir) dir = "tests/structured_schemas.json";
    char *text = tu_read_file(dir, &len);
    if (!text) { /* meson runs tests from the build directory */
        path = malloc(strlen(tu_model_path()) + 64);
        strcpy(path, tu_model_path());
        char *slash = strstr(path, "/models/");
        ck_assert_ptr_nonnull(slash);
        strcpy(slash, "/tests/structured_schemas.json");
        text = tu_read_file(path, &len);
    }
    ck_assert_ptr_nonnull(text);
    load_vocab();
    cJSON *suite_json = cJSON_Parse(text);
    ck_assert_ptr_nonnull(suite_json);
    int n_suite = cJSON_GetArraySize(suite_json);
    static const char alphabet[] = "{}[]\":,0123456789-+.eE*?|()^$\\ abcdefxyz\x01";
    uint64_t rng = getenv("QUERN_FUZZ_SEED") ? strtoull(getenv("QUERN_FUZZ_SEED"), NULL, 0) | 1
                                             : 0x9e3779b97f4a7c15ull;
    int rounds = getenv("QUERN_FUZZ_ROUNDS") ? atoi(getenv("QUERN_FUZZ_ROUNDS"))
                 : tu_sanitized()            ? 150
                                             : 1500;
    int ok = 0;
    uint64_t *mask = calloc((size_t)grammar_mask_words(vocab), sizeof *mask);
    char *buf = malloc(len + 64);
    for (int r = 0; r < rounds; r++) {
        /* a whole schema of the suite (or, for regexes and choices, a window of the file),
         * then a few byte edits */
        size_t n;
        int kind = r % 4;
        static const char gbnf_text[] =
            "root ::= obj\nobj ::= \"{\" (pair (\",\" pair)*)? \"}\"\n"
            "pair ::= str \":\" val\nval ::= str | [0-9]+ | obj | \"[\" val{0,3} \"]\"\n"
            "str ::= \"\\\"\" [^\"\\\\]* \"\\\"\" # strings\n";
        if (kind == 0) {
            const cJSON *one = cJSON_GetArrayItem(suite_json, (int)(fuzz_next(&rng) % n_suite));
            char *p = cJSON_PrintUnformatted(cJSON_GetObjectItem(one, "schema"));
            n = strlen(p) < len ? strlen(p) : len;
            memcpy(buf, p, n);
            free(p);
        } else if (kind == 3) {
            n = sizeof gbnf_text - 1;
            memcpy(buf, gbnf_text, n);
        } else {
            size_t a = fuzz_next(&rng) % len;
            n = 1 + fuzz_next(&rng) % 60;
            if (a + n > len) n = len - a;
            memcpy(buf, text + a, n);
        }
        int edits = (int)(fuzz_next(&rng) % 4);
        for (int k = 0; k < edits && n; k++)
            buf[fuzz_next(&rng) % n] = alphabet[fuzz_next(&rng) % (sizeof alphabet - 1)];
        buf[n] = 0;
        static const enum grammar_kind kinds[] = {GRAMMAR_JSON_SCHEMA, GRAMMAR_REGEX,
                                                  GRAMMAR_CHOICE, GRAMMAR_GBNF};
        struct grammar *g = NULL;
        struct qerr err = {0};
        int rc = grammar_compile(kinds[kind], buf, n, &g, &err);
        if (rc) {
            ck_assert_msg(err.msg[0], "compile failed without a message: %s", buf);
            continue;
        }
        ok++;
        struct grammar_matcher *m;
        ck_assert(grammar_matcher_create(g, vocab, &m, &err) == 0);
        ck_assert_int_ge(grammar_matcher_mask(m, mask), 0);
        grammar_matcher_free(m);
        grammar_unref(g);
    }
    ck_assert_int_gt(ok, rounds / 10);
    cJSON_Delete(suite_json);
    free(buf);
    free(mask);
    free(text);
    free(path);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("grammar");
    TCase *tc = tcase_create("compile");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, regex_basics);
    tcase_add_test(tc, choice);
    tcase_add_test(tc, json_object_any);
    tcase_add_test(tc, schema_objects);
    tcase_add_test(tc, schema_arrays);
    tcase_add_test(tc, schema_strings);
    tcase_add_test(tc, length_with_pattern);
    tcase_add_test(tc, unique_items);
    tcase_add_test(tc, calendar_dates);
    tcase_add_test(tc, property_names_and_patterns);
    tcase_add_test(tc, any_of_drops_unsupported);
    tcase_add_test(tc, schema_siblings_and_merges);
    tcase_add_test(tc, counted_properties);
    tcase_add_test(tc, integer_ranges);
    tcase_add_test(tc, number_ranges_exact);
    tcase_add_test(tc, multiple_of);
    tcase_add_test(tc, schema_refs_and_combinators);
    tcase_add_test(tc, schema_refusals);
    tcase_add_test(tc, if_then_else_brute_force);
    tcase_add_test(tc, after_think);
    tcase_add_test(tc, dependencies_brute_force);
    tcase_add_test(tc, unsatisfiable_parts_left_out);
    tcase_add_test(tc, ref_anchors_and_escapes);
    tcase_add_test(tc, formats_standard_and_unknown);
    tcase_add_test(tc, cache_lru);
    tcase_add_test(tc, mask_exact);
    tcase_add_test(tc, forced_bytes_and_allowed_runs);
    tcase_add_test(tc, mask_dead_end_and_done);
    tcase_add_test(tc, dead_ends_pruned);
    tcase_add_test(tc, schema_properties_counts);
    tcase_add_test(tc, mask_apply);
    tcase_add_test(tc, gbnf);
    tcase_add_test(tc, tool_calls_auto);
    tcase_add_test(tc, tool_calls_formats);
    tcase_add_test(tc, fuzz_compilers);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    tu_model_path(); /* skip (77) without the model */
    SRunner *r = srunner_create(suite());
    srunner_run_all(r, CK_NORMAL);
    int failed = srunner_ntests_failed(r);
    srunner_free(r);
    return failed ? 1 : 0;
}
