/* The HTTP daemon's pure parts, without an engine or a socket: request parsing and validation
 * (every field, wrong types, ranges, the prompt and stop forms, messages, hostile bodies), the
 * response and SSE writers, error bodies, and the Prometheus text of the metrics. */
#include <check.h>
#include <cjson/cJSON.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../server/metrics.h"
#include "../server/oai.h"
#include "../server/oai_resp.h"
#include "../server/sbuf.h"

static int parse(enum oai_kind k, const char *body, struct oai_request *r, struct oai_error *e)
{
    memset(e, 0, sizeof *e);
    return oai_parse(k, body, strlen(body), r, e);
}

/* body must be refused with status and param. */
static void expect_bad(enum oai_kind k, const char *body, int status, const char *param)
{
    struct oai_request r;
    struct oai_error e;
    int rc = parse(k, body, &r, &e);
    ck_assert_msg(rc < 0, "accepted: %s", body);
    ck_assert_msg(e.status == status, "%s: status %d, want %d (%s)", body, e.status, status,
                  e.q.msg);
    ck_assert_msg(!strcmp(e.param, param), "%s: param '%s', want '%s' (%s)", body, e.param, param,
                  e.q.msg);
    if (*param)
        ck_assert_msg(strstr(e.q.msg, param), "message does not name %s: %s", param, e.q.msg);
    ck_assert_ptr_null(r.root);
}

START_TEST(completion_all_fields)
{
    struct oai_request r;
    struct oai_error e;
    const char *body =
        "{\"model\":\"m\",\"prompt\":\"hello\",\"max_tokens\":7,\"temperature\":0.5,"
        "\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,\"presence_penalty\":0.5,"
        "\"frequency_penalty\":-0.5,\"repetition_penalty\":1.1,\"seed\":42,\"stop\":[\"a\",\"bc\"],"
        "\"ignore_eos\":true,\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"user\":\"u\",\"n\":3,\"echo\":true,\"logprobs\":2,\"unknown_field\":{\"x\":[1]}}";
    ck_assert_int_eq(parse(OAI_COMPLETION, body, &r, &e), 0);
    ck_assert_str_eq(r.model, "m");
    ck_assert_int_eq(r.n_prompts, 1);
    ck_assert_str_eq(r.prompts[0].text, "hello");
    ck_assert_int_eq(r.prompts[0].text_len, 5);
    ck_assert_int_eq(r.max_tokens, 7);
    ck_assert_float_eq_tol(r.sample.temperature, 0.5, 1e-6);
    ck_assert_float_eq_tol(r.sample.top_p, 0.9, 1e-6);
    ck_assert_int_eq(r.sample.top_k, 40);
    ck_assert_float_eq_tol(r.sample.min_p, 0.05, 1e-6);
    ck_assert_float_eq_tol(r.sample.presence_penalty, 0.5, 1e-6);
    ck_assert_float_eq_tol(r.sample.frequency_penalty, -0.5, 1e-6);
    ck_assert_float_eq_tol(r.sample.repetition_penalty, 1.1, 1e-6);
    ck_assert(r.has_seed);
    ck_assert_uint_eq(r.sample.seed, 42);
    ck_assert_int_eq(r.n_stop, 2);
    ck_assert_str_eq(r.stop[0], "a");
    ck_assert_str_eq(r.stop[1], "bc");
    ck_assert(r.ignore_eos && r.stream && r.include_usage && r.echo);
    ck_assert_int_eq(r.n, 3);
    ck_assert_int_eq(r.logprobs, 2);
    ck_assert_str_eq(r.ignored, "unknown_field"); /* everything else was read */
    oai_request_free(&r);
    ck_assert_ptr_null(r.root);
}
END_TEST

/* The members an endpoint does not read, named for the request log: in request order, only
 * plain names (a hostile key is counted, never printed), "..." when they do not fit. */
START_TEST(ignored_members)
{
    struct oai_request r;
    struct oai_error e;
    ck_assert_int_eq(parse(OAI_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                           "\"max_tokens\":2,\"temperature\":null}",
                           &r, &e),
                     0);
    ck_assert_str_eq(r.ignored, ""); /* null counts as read */
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_CHAT,
                           "{\"typical_p\":0.5,\"messages\":[{\"role\":\"user\",\"content\":"
                           "\"hi\"}],\"xtc_probability\":0.5,\"a\\\"b\":1,\"\\n\":2,"
                           "\"suffix\":\"s\"}",
                           &r, &e),
                     0);
    /* suffix is a completions member: a chat request ignores it */
    ck_assert_str_eq(r.ignored, "typical_p,xtc_probability,suffix,+2");
    oai_request_free(&r);
    char body[4096];
    size_t at = (size_t)snprintf(body, sizeof body, "{\"prompt\":\"x\"");
    for (int i = 0; i < 40; i++)
        at += (size_t)snprintf(body + at, sizeof body - at, ",\"extra_member_%02d\":%d", i, i);
    snprintf(body + at, sizeof body - at, "}");
    ck_assert_int_eq(parse(OAI_COMPLETION, body, &r, &e), 0);
    ck_assert_msg(strncmp(r.ignored, "extra_member_00,extra_member_01,", 32) == 0, "%s", r.ignored);
    size_t n = strlen(r.ignored);
    ck_assert_uint_lt(n, sizeof r.ignored);
    ck_assert_str_eq(r.ignored + n - 4, ",...");
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_TOKENIZE, "{\"prompt\":\"x\",\"stream\":true}", &r, &e), 0);
    ck_assert_str_eq(r.ignored, "stream");
    oai_request_free(&r);
}
END_TEST

START_TEST(completion_defaults)
{
    struct oai_request r;
    struct oai_error e;
    ck_assert_int_eq(
        parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop\":null,\"seed\":null}", &r, &e), 0);
    ck_assert_int_eq(r.max_tokens, -1);
    ck_assert_int_eq(r.n, 1);
    ck_assert_int_eq(r.logprobs, -1);
    ck_assert_int_eq(r.n_stop, 0);
    ck_assert(!r.has_seed && !r.stream && !r.echo && !r.ignore_eos && !r.include_usage);
    ck_assert_float_eq(r.sample.temperature, 1.0f);
    ck_assert_float_eq(r.sample.top_p, 1.0f);
    ck_assert_int_eq(r.sample.top_k, 0);
    ck_assert_ptr_null(r.model);
    oai_request_free(&r);
    /* vLLM's top_k -1 means off; max_completion_tokens wins over max_tokens */
    ck_assert_int_eq(parse(OAI_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_k\":-1,"
                           "\"max_tokens\":5,\"max_completion_tokens\":9}",
                           &r, &e),
                     0);
    ck_assert_int_eq(r.sample.top_k, 0);
    ck_assert_int_eq(r.max_tokens, 9);
    oai_request_free(&r);
}
END_TEST

START_TEST(wrong_types)
{
    static const struct {
        const char *field, *value;
    } cases[] = {
        {"max_tokens", "\"10\""},
        {"max_tokens", "1.5"},
        {"temperature", "\"hot\""},
        {"temperature", "true"},
        {"top_p", "[1]"},
        {"top_k", "2.5"},
        {"top_k", "\"3\""},
        {"min_p", "{}"},
        {"presence_penalty", "\"0\""},
        {"frequency_penalty", "[]"},
        {"repetition_penalty", "false"},
        {"seed", "\"1\""},
        {"seed", "0.5"},
        {"n", "\"2\""},
        {"stream", "1"},
        {"stream", "\"true\""},
        {"ignore_eos", "0"},
        {"echo", "\"yes\""},
        {"logprobs", "true"},
        {"stop", "5"},
        {"stop", "{}"},
        {"stop", "[\"a\",3]"},
        {"user", "7"},
        {"model", "1"},
        {"stream_options", "true"},
        {"max_completion_tokens", "\"5\""},
    };
    char body[256], param[64];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":%s}", cases[i].field, cases[i].value);
        expect_bad(OAI_COMPLETION, body, 400, cases[i].field);
    }
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"stream_options\":{\"include_usage\":1}}", 400,
               "stream_options.include_usage");
    /* chat: logprobs is a boolean there */
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],";
    snprintf(body, sizeof body, "%s\"logprobs\":3}", chat);
    expect_bad(OAI_CHAT, body, 400, "logprobs");
    snprintf(body, sizeof body, "%s\"logprobs\":true,\"top_logprobs\":\"2\"}", chat);
    expect_bad(OAI_CHAT, body, 400, "top_logprobs");
    (void)param;
}
END_TEST

START_TEST(ranges)
{
    static const struct {
        const char *field, *value;
        bool ok;
    } cases[] = {
        {"temperature", "0", true},
        {"temperature", "2", true},
        {"temperature", "-0.1", false},
        {"temperature", "2.01", false},
        {"top_p", "1", true},
        {"top_p", "0", false},
        {"top_p", "1.5", false},
        {"min_p", "0", true},
        {"min_p", "1", true},
        {"min_p", "-0.1", false},
        {"top_k", "0", true},
        {"top_k", "-2", false},
        {"presence_penalty", "2", true},
        {"presence_penalty", "2.5", false},
        {"frequency_penalty", "-2", true},
        {"frequency_penalty", "-3", false},
        {"repetition_penalty", "1", true},
        {"repetition_penalty", "0", false},
        {"repetition_penalty", "11", false},
        {"n", "1", true},
        {"n", "0", false},
        {"n", "65", false},
        {"max_tokens", "0", true},
        {"max_tokens", "-1", false},
        {"max_tokens", "1e12", false},
        {"logprobs", "0", true},
        {"logprobs", "20", true},
        {"logprobs", "21", false},
        {"logprobs", "-1", false},
        {"seed", "-5", true},
        {"seed", "1e30", false},
    };
    char body[256];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"%s\":%s}", cases[i].field, cases[i].value);
        if (cases[i].ok) {
            struct oai_request r;
            struct oai_error e;
            ck_assert_msg(parse(OAI_COMPLETION, body, &r, &e) == 0, "%s: %s", body, e.q.msg);
            oai_request_free(&r);
        } else {
            expect_bad(OAI_COMPLETION, body, 400, cases[i].field);
        }
    }
    /* chat needs at least one token; top_logprobs bounded and needs logprobs */
    const char *chat = "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],";
    snprintf(body, sizeof body, "%s\"max_tokens\":0}", chat);
    expect_bad(OAI_CHAT, body, 400, "max_tokens");
    snprintf(body, sizeof body, "%s\"logprobs\":true,\"top_logprobs\":21}", chat);
    expect_bad(OAI_CHAT, body, 400, "top_logprobs");
    snprintf(body, sizeof body, "%s\"top_logprobs\":2}", chat);
    expect_bad(OAI_CHAT, body, 400, "top_logprobs");
    struct oai_request r;
    struct oai_error e;
    snprintf(body, sizeof body, "%s\"logprobs\":true,\"top_logprobs\":3}", chat);
    ck_assert_int_eq(parse(OAI_CHAT, body, &r, &e), 0);
    ck_assert_int_eq(r.logprobs, 3);
    oai_request_free(&r);
    snprintf(body, sizeof body, "%s\"logprobs\":true}", chat);
    ck_assert_int_eq(parse(OAI_CHAT, body, &r, &e), 0);
    ck_assert_int_eq(r.logprobs, 0);
    oai_request_free(&r);
    snprintf(body, sizeof body, "%s\"logprobs\":false}", chat);
    ck_assert_int_eq(parse(OAI_CHAT, body, &r, &e), 0);
    ck_assert_int_eq(r.logprobs, -1);
    oai_request_free(&r);
    /* prompts x n bounded */
    expect_bad(OAI_COMPLETION, "{\"prompt\":[\"a\",\"b\"],\"n\":40}", 400, "n");
}
END_TEST

START_TEST(stop_forms)
{
    struct oai_request r;
    struct oai_error e;
    ck_assert_int_eq(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop\":\"\\n\\n\"}", &r, &e), 0);
    ck_assert_int_eq(r.n_stop, 1);
    ck_assert_str_eq(r.stop[0], "\n\n");
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop\":[]}", &r, &e), 0);
    ck_assert_int_eq(r.n_stop, 0);
    oai_request_free(&r);
    /* empty strings stop nothing and are dropped */
    ck_assert_int_eq(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop\":[\"\",\"é\"]}", &r, &e), 0);
    ck_assert_int_eq(r.n_stop, 1);
    ck_assert_str_eq(r.stop[0], "é");
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop\":\"\"}", &r, &e), 0);
    ck_assert_int_eq(r.n_stop, 0);
    oai_request_free(&r);
    expect_bad(
        OAI_COMPLETION,
        "{\"prompt\":\"x\",\"stop\":[\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]}", 400,
        "stop");
}
END_TEST

START_TEST(prompt_forms)
{
    struct oai_request r;
    struct oai_error e;
    ck_assert_int_eq(parse(OAI_COMPLETION, "{\"prompt\":[\"ab\",\"c\"]}", &r, &e), 0);
    ck_assert_int_eq(r.n_prompts, 2);
    ck_assert_str_eq(r.prompts[0].text, "ab");
    ck_assert_str_eq(r.prompts[1].text, "c");
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_COMPLETION, "{\"prompt\":[1,2,3]}", &r, &e), 0);
    ck_assert_int_eq(r.n_prompts, 1);
    ck_assert_ptr_null(r.prompts[0].text);
    ck_assert_int_eq(r.prompts[0].n_ids, 3);
    ck_assert_int_eq(r.prompts[0].ids[2], 3);
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_COMPLETION, "{\"prompt\":[[5],[6,7]]}", &r, &e), 0);
    ck_assert_int_eq(r.n_prompts, 2);
    ck_assert_int_eq(r.prompts[1].n_ids, 2);
    ck_assert_int_eq(r.prompts[1].ids[1], 7);
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_COMPLETION, "{\"prompt\":[\"a\",[6,7]]}", &r, &e), 0);
    ck_assert_int_eq(r.n_prompts, 2);
    oai_request_free(&r);
    /* a string with an escaped NUL keeps the bytes before it; unicode escapes decode */
    ck_assert_int_eq(parse(OAI_COMPLETION, "{\"prompt\":\"caf\\u00e9 \\ud83d\\ude00\"}", &r, &e),
                     0);
    ck_assert_str_eq(r.prompts[0].text, "caf\xc3\xa9 \xf0\x9f\x98\x80");
    oai_request_free(&r);

    expect_bad(OAI_COMPLETION, "{}", 400, "prompt");
    expect_bad(OAI_COMPLETION, "{\"prompt\":null}", 400, "prompt");
    expect_bad(OAI_COMPLETION, "{\"prompt\":5}", 400, "prompt");
    expect_bad(OAI_COMPLETION, "{\"prompt\":{}}", 400, "prompt");
    expect_bad(OAI_COMPLETION, "{\"prompt\":[]}", 400, "prompt");
    expect_bad(OAI_COMPLETION, "{\"prompt\":[1,-2]}", 400, "prompt");
    expect_bad(OAI_COMPLETION, "{\"prompt\":[1,2.5]}", 400, "prompt");
    expect_bad(OAI_COMPLETION, "{\"prompt\":[1,\"a\"]}", 400, "prompt");
    expect_bad(OAI_COMPLETION, "{\"prompt\":[1,3e10]}", 400, "prompt");
    expect_bad(OAI_COMPLETION, "{\"prompt\":[[1],[]]}", 400, "prompt");
    expect_bad(OAI_COMPLETION, "{\"prompt\":[\"a\",5]}", 400, "prompt");
    expect_bad(OAI_COMPLETION, "{\"prompt\":[\"a\",null]}", 400, "prompt");
    /* too many prompts */
    struct sbuf b = {0};
    sbuf_puts(&b, "{\"prompt\":[");
    for (int i = 0; i <= OAI_MAX_PROMPTS; i++) sbuf_printf(&b, "%s\"p\"", i ? "," : "");
    sbuf_puts(&b, "]}");
    expect_bad(OAI_COMPLETION, b.p, 400, "prompt");
    sbuf_free(&b);
    /* fill-in-the-middle is refused clearly; an empty suffix is harmless */
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"suffix\":\"end\"}", 400, "suffix");
    ck_assert_int_eq(
        parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"suffix\":\"\",\"logit_bias\":{}}", &r, &e), 0);
    ck_assert_int_eq(r.n_logit_bias, 0);
    oai_request_free(&r);
    /* logit_bias: token ids as keys, -100..100 as values (the engine checks ids against the
     * model) */
    ck_assert_int_eq(parse(OAI_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                           "\"logit_bias\":{\"5\":10,\"49151\":-100,\"0\":0.5}}",
                           &r, &e),
                     0);
    ck_assert_int_eq(r.n_logit_bias, 3);
    ck_assert_int_eq(r.logit_bias[0].token, 5);
    ck_assert_float_eq(r.logit_bias[0].bias, 10.0f);
    ck_assert_int_eq(r.logit_bias[1].token, 49151);
    ck_assert_float_eq(r.logit_bias[1].bias, -100.0f);
    ck_assert_float_eq(r.logit_bias[2].bias, 0.5f);
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"logit_bias\":null}", &r, &e), 0);
    oai_request_free(&r);
    static const char *const bad_bias[] = {
        "[[5,10]]",       "{\"abc\":1}",   "{\"-1\":1}",          "{\"+5\":1}",
        "{\"5x\":1}",     "{\"\":1}",      "{\"99999999999\":1}", "{\"5\":101}",
        "{\"5\":-100.5}", "{\"5\":\"1\"}", "{\"5\":null}",        "\"5\""};
    for (size_t i = 0; i < sizeof bad_bias / sizeof bad_bias[0]; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"prompt\":\"x\",\"logit_bias\":%s}", bad_bias[i]);
        expect_bad(OAI_COMPLETION, body, 400, "logit_bias");
    }
    /* vLLM's min_tokens and stop_token_ids */
    ck_assert_int_eq(parse(OAI_COMPLETION,
                           "{\"prompt\":\"x\",\"min_tokens\":4,\"stop_token_ids\":[2,49151]}", &r,
                           &e),
                     0);
    ck_assert_int_eq(r.min_tokens, 4);
    ck_assert_int_eq(r.n_stop_ids, 2);
    ck_assert_int_eq(r.stop_ids[1], 49151);
    oai_request_free(&r);
    /* vLLM's priority: any int, on generation and embeddings */
    ck_assert_int_eq(parse(OAI_COMPLETION, "{\"prompt\":\"x\",\"priority\":-7}", &r, &e), 0);
    ck_assert_int_eq(r.priority, -7);
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_EMBEDDING, "{\"input\":\"x\",\"priority\":3}", &r, &e), 0);
    ck_assert_int_eq(r.priority, 3);
    oai_request_free(&r);
    expect_bad(OAI_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"priority\":\"high\"}", 400,
               "priority");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"priority\":1.5}", 400, "priority");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"priority\":3e9}", 400, "priority");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"min_tokens\":-1}", 400, "min_tokens");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"min_tokens\":1.5}", 400, "min_tokens");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop_token_ids\":5}", 400, "stop_token_ids");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop_token_ids\":[-1]}", 400, "stop_token_ids");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop_token_ids\":[\"2\"]}", 400,
               "stop_token_ids");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\",\"stop_token_ids\":[1,2,3,4,5,6,7,8,9]}", 400,
               "stop_token_ids");
    struct sbuf lb = {0};
    sbuf_puts(&lb, "{\"prompt\":\"x\",\"logit_bias\":{");
    for (int i = 0; i <= ENGINE_MAX_LOGIT_BIAS; i++)
        sbuf_printf(&lb, "%s\"%d\":1", i ? "," : "", i);
    sbuf_puts(&lb, "}}");
    expect_bad(OAI_COMPLETION, lb.p, 400, "logit_bias");
    sbuf_free(&lb);
}
END_TEST

START_TEST(messages)
{
    struct oai_request r;
    struct oai_error e;
    const char *body = "{\"messages\":[{\"role\":\"system\",\"content\":\"be brief\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
                       "{\"type\":\"text\",\"text\":\"b\"}],\"name\":\"x\"},"
                       "{\"role\":\"assistant\",\"content\":null},"
                       "{\"role\":\"developer\",\"content\":\"dev\"}]}";
    ck_assert_int_eq(parse(OAI_CHAT, body, &r, &e), 0);
    ck_assert_int_eq(r.n_msgs, 4);
    ck_assert_str_eq(r.msgs[0].role, "system");
    ck_assert_str_eq(r.msgs[0].content, "be brief");
    ck_assert_str_eq(r.msgs[1].role, "user");
    ck_assert_str_eq(r.msgs[1].content, "ab");
    /* the parts' texts kept apart too (Gemma 3's template trims each) */
    ck_assert_uint_eq(r.msgs[1].n_parts, 2);
    ck_assert_str_eq(r.msgs[1].parts[0], "a");
    ck_assert_str_eq(r.msgs[1].parts[1], "b");
    ck_assert_uint_eq(r.msgs[0].n_parts, 0);
    ck_assert_ptr_null(r.msgs[0].parts);
    ck_assert_str_eq(r.msgs[2].role, "assistant");
    ck_assert_str_eq(r.msgs[2].content, "");
    ck_assert_str_eq(r.msgs[3].role, "system");
    ck_assert_int_eq(r.max_tokens, -1);
    oai_request_free(&r);

    expect_bad(OAI_CHAT, "{}", 400, "messages");
    expect_bad(OAI_CHAT, "{\"messages\":[]}", 400, "messages");
    expect_bad(OAI_CHAT, "{\"messages\":\"hi\"}", 400, "messages");
    expect_bad(OAI_CHAT, "{\"messages\":[\"hi\"]}", 400, "messages[0]");
    expect_bad(OAI_CHAT, "{\"messages\":[{\"content\":\"hi\"}]}", 400, "messages[0].role");
    expect_bad(OAI_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"robot\"}]}", 400,
               "messages[1].role");
    expect_bad(OAI_CHAT, "{\"messages\":[{\"role\":5,\"content\":\"a\"}]}", 400,
               "messages[0].role");
    expect_bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
               "messages[0].content");
    expect_bad(OAI_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
               "messages[0].content");
    expect_bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}]}",
               400, "messages[0].content");
    expect_bad(OAI_CHAT, "{\"messages\":[{\"role\":\"user\",\"content\":[7]}]}", 400,
               "messages[0].content");
    const char *m = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],";
    char b[256];
    snprintf(b, sizeof b, "%s\"tools\":[{\"type\":\"function\"}]}", m);
    expect_bad(OAI_CHAT, b, 400, "tools[0]");
    snprintf(b, sizeof b, "%s\"response_format\":{\"type\":\"xml\"}}", m);
    expect_bad(OAI_CHAT, b, 400, "response_format.type");
    snprintf(b, sizeof b, "%s\"response_format\":{\"type\":\"text\"},\"tools\":[]}", m);
    ck_assert_int_eq(parse(OAI_CHAT, b, &r, &e), 0);
    ck_assert_int_eq(r.constraint.kind, -1);
    oai_request_free(&r);
}
END_TEST

/* response_format and structured_outputs become one constraint; tools and tool messages */
START_TEST(structured_bodies)
{
    struct oai_request r;
    struct oai_error e;
    const char *m = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],";
    char b[512];
    snprintf(b, sizeof b, "%s\"response_format\":{\"type\":\"json_object\"}}", m);
    ck_assert_int_eq(parse(OAI_CHAT, b, &r, &e), 0);
    ck_assert_int_eq(r.constraint.kind, GRAMMAR_JSON_OBJECT);
    oai_request_free(&r);
    snprintf(b, sizeof b,
             "%s\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
             "\"strict\":true,\"schema\":{\"type\": \"integer\"}}}}",
             m);
    ck_assert_int_eq(parse(OAI_CHAT, b, &r, &e), 0);
    ck_assert_int_eq(r.constraint.kind, GRAMMAR_JSON_SCHEMA);
    ck_assert_str_eq(r.constraint.text, "{\"type\":\"integer\"}");
    ck_assert_str_eq(r.constraint.param, "response_format.json_schema.schema");
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_COMPLETION,
                           "{\"prompt\":\"a\",\"structured_outputs\":{\"choice\":[\"x\",\"y\"]}}",
                           &r, &e),
                     0);
    ck_assert_int_eq(r.constraint.kind, GRAMMAR_CHOICE);
    ck_assert_str_eq(r.constraint.text, "[\"x\",\"y\"]");
    oai_request_free(&r);
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"a\",\"structured_outputs\":{\"regex\":5}}", 400,
               "structured_outputs.regex");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"a\",\"structured_outputs\":{}}", 400,
               "structured_outputs");
    expect_bad(OAI_COMPLETION,
               "{\"prompt\":\"a\",\"response_format\":{\"type\":\"json_object\"},"
               "\"structured_outputs\":{\"regex\":\"a\"}}",
               400, "structured_outputs");
    snprintf(b, sizeof b, "%s\"response_format\":{\"type\":\"json_schema\",\"json_schema\":5}}", m);
    expect_bad(OAI_CHAT, b, 400, "response_format.json_schema");
    /* tools: required makes a tool-call constraint */
    snprintf(b, sizeof b,
             "%s\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":"
             "{\"type\":\"object\"}}}],\"tool_choice\":\"required\",\"parallel_tool_calls\":false}",
             m);
    ck_assert_int_eq(parse(OAI_CHAT, b, &r, &e), 0);
    ck_assert_int_eq(r.constraint.kind, GRAMMAR_TOOL_CALLS);
    ck_assert_int_eq(r.n_tools, 1);
    ck_assert_ptr_nonnull(strstr(r.constraint.text, "\"parallel\":false"));
    oai_request_free(&r);
    snprintf(b, sizeof b, "%s\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]}",
             m);
    ck_assert_int_eq(parse(OAI_CHAT, b, &r, &e), 0);
    ck_assert_int_eq(r.tool_choice, OAI_TOOLS_AUTO); /* text, or calls once one opens */
    ck_assert_int_eq(r.constraint.kind, GRAMMAR_TOOL_CALLS);
    ck_assert_ptr_nonnull(strstr(r.constraint.text, "\"auto\":true"));
    oai_request_free(&r);
    snprintf(b, sizeof b,
             "%s\"tool_choice\":\"sometimes\",\"tools\":[{\"type\":\"function\","
             "\"function\":{\"name\":\"f\"}}]}",
             m);
    expect_bad(OAI_CHAT, b, 400, "tool_choice");
    /* a tool result and an assistant's calls, as the model's format writes them */
    ck_assert_int_eq(
        parse(
            OAI_CHAT,
            "{\"messages\":[{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":"
            "\"1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":"
            "\"{\\\"x\\\":1}\"}}]},{\"role\":\"tool\",\"tool_call_id\":\"1\",\"content\":\"ok\"}]}",
            &r, &e),
        0);
    ck_assert_str_eq(r.msgs[0].role, "assistant");
    ck_assert_ptr_null(r.msgs[0].content); /* null content with calls */
    ck_assert_int_eq(r.msgs[0].n_calls, 1);
    ck_assert_str_eq(r.msgs[0].calls[0].id, "1");
    ck_assert_str_eq(r.msgs[0].calls[0].name, "f");
    ck_assert_str_eq(r.msgs[0].calls[0].arguments, "{\"x\":1}");
    ck_assert_str_eq(r.msgs[1].role, "tool");
    ck_assert_str_eq(r.msgs[1].content, "ok");
    ck_assert_str_eq(r.msgs[1].call_id, "1");
    oai_request_free(&r);
    expect_bad(OAI_CHAT,
               "{\"messages\":[{\"role\":\"assistant\",\"tool_calls\":[{\"function\":"
               "{\"name\":\"f\",\"arguments\":{}}}]}]}",
               400, "messages[0].tool_calls");
    expect_bad(OAI_CHAT,
               "{\"messages\":[{\"role\":\"tool\",\"content\":\"x\",\"tool_call_id\":7}]}", 400,
               "messages[0].tool_call_id");
    /* tool calls found in an output */
    struct oai_tool_call *calls;
    size_t keep;
    const char *out =
        "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>"
        "\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>\n";
    ck_assert_int_eq(oai_parse_tool_calls(CHAT_TOOLS_HERMES, out, strlen(out), &calls, &keep), 2);
    ck_assert_int_eq(keep, 5);
    ck_assert_str_eq(calls[0].name, "f");
    ck_assert_str_eq(calls[0].arguments, "{\"x\":1}");
    ck_assert_str_eq(calls[1].name, "g");
    oai_tool_calls_free(calls, 2);
    const char *broken = "<tool_call>\n{\"name\": \"f\", \"argum";
    ck_assert_int_eq(oai_parse_tool_calls(CHAT_TOOLS_HERMES, broken, strlen(broken), &calls, &keep),
                     0);
    ck_assert_int_eq(keep, strlen(broken));
}
END_TEST

START_TEST(tokenize_bodies)
{
    struct oai_request r;
    struct oai_error e;
    ck_assert_int_eq(
        parse(OAI_TOKENIZE, "{\"prompt\":\"hi\",\"add_special_tokens\":false}", &r, &e), 0);
    ck_assert(!r.add_special);
    ck_assert_str_eq(r.prompts[0].text, "hi");
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_TOKENIZE,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
                           "\"add_generation_prompt\":false}",
                           &r, &e),
                     0);
    ck_assert_int_eq(r.n_msgs, 1);
    ck_assert(r.chat_end == CHAT_END_CLOSED && r.add_special);
    oai_request_free(&r);
    expect_bad(OAI_TOKENIZE, "{\"prompt\":[1,2]}", 400, "prompt");
    expect_bad(OAI_TOKENIZE, "{\"prompt\":\"x\",\"add_special_tokens\":1}", 400,
               "add_special_tokens");
    ck_assert_int_eq(parse(OAI_DETOKENIZE, "{\"tokens\":[1,2,3]}", &r, &e), 0);
    ck_assert_int_eq(r.n_tokens, 3);
    ck_assert_int_eq(r.tokens[0], 1);
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_DETOKENIZE, "{\"tokens\":[]}", &r, &e), 0);
    ck_assert_int_eq(r.n_tokens, 0);
    oai_request_free(&r);
    expect_bad(OAI_DETOKENIZE, "{\"tokens\":\"1 2\"}", 400, "tokens");
    expect_bad(OAI_DETOKENIZE, "{\"tokens\":[-1]}", 400, "tokens");
}
END_TEST

START_TEST(embedding_bodies)
{
    struct oai_request r;
    struct oai_error e;
    ck_assert_int_eq(parse(OAI_EMBEDDING, "{\"input\":\"hi\",\"model\":\"m\"}", &r, &e), 0);
    ck_assert_int_eq(r.n_prompts, 1);
    ck_assert_str_eq(r.prompts[0].text, "hi");
    ck_assert_str_eq(r.model, "m");
    ck_assert(!r.base64);
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_EMBEDDING,
                           "{\"input\":[[1,2],[3]],\"encoding_format\":\"base64\",\"user\":\"u\"}",
                           &r, &e),
                     0);
    ck_assert_int_eq(r.n_prompts, 2);
    ck_assert_int_eq(r.prompts[1].ids[0], 3);
    ck_assert(r.base64);
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_EMBEDDING, "{\"input\":[5,6,7]}", &r, &e), 0);
    ck_assert_int_eq(r.n_prompts, 1);
    ck_assert_int_eq(r.prompts[0].n_ids, 3);
    oai_request_free(&r);
    /* 2048 inputs are allowed (OpenAI's limit), 2049 are not */
    struct sbuf b = {0};
    sbuf_puts(&b, "{\"input\":[");
    for (int i = 0; i < 2049; i++) sbuf_puts(&b, i ? ",\"x\"" : "\"x\"");
    sbuf_puts(&b, "]}");
    expect_bad(OAI_EMBEDDING, b.p, 400, "input");
    b.len -= 6; /* drop one ,"x" */
    sbuf_puts(&b, "]}");
    ck_assert_int_eq(parse(OAI_EMBEDDING, b.p, &r, &e), 0);
    ck_assert_int_eq(r.n_prompts, 2048);
    oai_request_free(&r);
    sbuf_free(&b);
    expect_bad(OAI_EMBEDDING, "{}", 400, "input");
    expect_bad(OAI_EMBEDDING, "{\"input\":[]}", 400, "input");
    expect_bad(OAI_EMBEDDING, "{\"input\":[[]]}", 400, "input");
    expect_bad(OAI_EMBEDDING, "{\"input\":{\"a\":1}}", 400, "input");
    expect_bad(OAI_EMBEDDING, "{\"input\":[\"a\",1]}", 400, "input");
    expect_bad(OAI_EMBEDDING, "{\"input\":\"a\",\"dimensions\":8}", 400, "dimensions");
    expect_bad(OAI_EMBEDDING, "{\"input\":\"a\",\"encoding_format\":\"int8\"}", 400,
               "encoding_format");
    expect_bad(OAI_EMBEDDING, "{\"input\":\"a\",\"model\":3}", 400, "model");
}
END_TEST

START_TEST(responses_bodies)
{
    struct oai_request r;
    struct oai_error e;
    ck_assert_int_eq(parse(OAI_RESPONSES,
                           "{\"instructions\":\"Be brief.\",\"input\":\"Hi\","
                           "\"max_output_tokens\":7,\"temperature\":0.5,\"store\":true}",
                           &r, &e),
                     0);
    ck_assert_int_eq(r.kind, OAI_RESPONSES);
    ck_assert_int_eq(r.n_msgs, 2);
    ck_assert_str_eq(r.msgs[0].role, "system");
    ck_assert_str_eq(r.msgs[0].content, "Be brief.");
    ck_assert_str_eq(r.msgs[1].role, "user");
    ck_assert_str_eq(r.msgs[1].content, "Hi");
    ck_assert_str_eq(r.instructions, "Be brief.");
    ck_assert_int_eq(r.max_tokens, 7);
    ck_assert_float_eq_tol(r.sample.temperature, 0.5, 1e-6);
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_RESPONSES,
                           "{\"input\":[{\"role\":\"developer\",\"content\":\"S\"},"
                           "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":"
                           "\"input_text\",\"text\":\"a\"},{\"type\":\"input_text\",\"text\":"
                           "\"b\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":"
                           "\"output_text\",\"text\":\"c\"}]}],\"stream\":true}",
                           &r, &e),
                     0);
    ck_assert_int_eq(r.n_msgs, 3);
    ck_assert_str_eq(r.msgs[0].role, "system");
    ck_assert_str_eq(r.msgs[1].content, "ab");
    ck_assert_uint_eq(r.msgs[1].n_parts, 2);
    ck_assert_str_eq(r.msgs[1].parts[1], "b");
    ck_assert_str_eq(r.msgs[2].role, "assistant");
    ck_assert_str_eq(r.msgs[2].content, "c");
    ck_assert_uint_eq(r.msgs[2].n_parts, 1);
    ck_assert(r.stream && r.max_tokens == -1 && !r.instructions);
    oai_request_free(&r);
    expect_bad(OAI_RESPONSES, "{\"input\":\"x\",\"previous_response_id\":\"resp_1\"}", 400,
               "previous_response_id");
    expect_bad(OAI_RESPONSES, "{}", 400, "input");
    expect_bad(OAI_RESPONSES, "{\"input\":5}", 400, "input");
    expect_bad(OAI_RESPONSES, "{\"input\":[5]}", 400, "input[0]");
    expect_bad(OAI_RESPONSES, "{\"input\":[{\"type\":\"function_call_output\"}]}", 400, "input[0]");
    expect_bad(OAI_RESPONSES, "{\"input\":[{\"content\":\"x\"}]}", 400, "input[0]");
    expect_bad(OAI_RESPONSES,
               "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_file\"}]}]}", 400,
               "input[0].content");
    expect_bad(OAI_RESPONSES, "{\"input\":\"x\",\"instructions\":1}", 400, "instructions");
    expect_bad(OAI_RESPONSES, "{\"input\":\"x\",\"max_output_tokens\":0}", 400,
               "max_output_tokens");
    expect_bad(OAI_RESPONSES, "{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", 400,
               "tools[0]");
    expect_bad(OAI_RESPONSES, "{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}]}", 400,
               "tools[0]");
    expect_bad(OAI_RESPONSES,
               "{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],"
               "\"tool_choice\":{\"type\":\"function\",\"name\":\"g\"}}",
               400, "tool_choice");
    expect_bad(OAI_RESPONSES, "{\"input\":[{\"type\":\"function_call\",\"arguments\":\"{}\"}]}",
               400, "input[0]");
    expect_bad(OAI_RESPONSES, "{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\"}]}",
               400, "input[0]");
    /* tools and calls in the chat form the tool path reads */
    ck_assert_int_eq(parse(OAI_RESPONSES,
                           "{\"input\":[{\"role\":\"user\",\"content\":\"w?\"},{\"type\":"
                           "\"function_call\",\"call_id\":\"c1\",\"name\":\"f\",\"arguments\":"
                           "\"{}\"},{\"type\":\"function_call\",\"call_id\":\"c2\",\"name\":\"f\","
                           "\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":"
                           "\"c1\",\"output\":\"sunny\"}],\"tools\":[{\"type\":\"function\","
                           "\"name\":\"f\",\"parameters\":{\"type\":\"object\"},\"strict\":true}],"
                           "\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}}",
                           &r, &e),
                     0);
    ck_assert_int_eq(r.n_tools, 1);
    ck_assert_str_eq(r.tools[0].name, "f");
    ck_assert_int_eq(r.tool_choice, OAI_TOOLS_NAMED);
    ck_assert_int_eq(r.n_msgs, 3); /* user, one assistant turn with both calls, the result */
    ck_assert_str_eq(r.msgs[1].role, "assistant");
    ck_assert_int_eq(r.msgs[1].n_calls, 2);
    ck_assert_str_eq(r.msgs[1].calls[0].id, "c1");
    ck_assert_str_eq(r.msgs[1].calls[1].id, "c2");
    ck_assert_str_eq(r.msgs[1].calls[1].name, "f");
    ck_assert_str_eq(r.msgs[2].role, "tool");
    ck_assert_str_eq(r.msgs[2].content, "sunny");
    ck_assert_str_eq(r.msgs[2].call_id, "c1");
    oai_request_free(&r);
    /* prediction: a string, or text parts joined */
    ck_assert_int_eq(parse(OAI_CHAT,
                           "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"prediction\":{"
                           "\"type\":\"content\",\"content\":[{\"type\":\"text\",\"text\":\"ab\"},"
                           "{\"type\":\"text\",\"text\":\"c\"}]}}",
                           &r, &e),
                     0);
    ck_assert_uint_eq(r.prediction_len, 3);
    ck_assert_str_eq(r.prediction, "abc");
    oai_request_free(&r);
    ck_assert_int_eq(
        parse(OAI_COMPLETION,
              "{\"prompt\":\"x\",\"prediction\":{\"type\":\"content\",\"content\":\"yz\"}}", &r,
              &e),
        0);
    ck_assert_str_eq(r.prediction, "yz");
    oai_request_free(&r);
    expect_bad(OAI_CHAT,
               "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"prediction\":\"x\"}", 400,
               "prediction");
    /* text.format: chat's response_format in the Responses API's flat shape */
    ck_assert_int_eq(parse(OAI_RESPONSES,
                           "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\","
                           "\"name\":\"m\",\"strict\":true,\"schema\":{\"type\":\"object\"}}}}",
                           &r, &e),
                     0);
    ck_assert_int_eq(r.constraint.kind, GRAMMAR_JSON_SCHEMA);
    ck_assert_str_eq(r.constraint.text, "{\"type\":\"object\"}");
    ck_assert_str_eq(r.constraint.param, "text.format.schema");
    ck_assert_ptr_nonnull(r.text_format);
    oai_request_free(&r);
    ck_assert_int_eq(parse(OAI_RESPONSES,
                           "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_object\"}}}", &r,
                           &e),
                     0);
    ck_assert_int_eq(r.constraint.kind, GRAMMAR_JSON_OBJECT);
    oai_request_free(&r);
    ck_assert_int_eq(
        parse(OAI_RESPONSES, "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"text\"}}}", &r, &e),
        0);
    ck_assert_int_eq(r.constraint.kind, -1);
    ck_assert_ptr_null(r.text_format);
    oai_request_free(&r);
    expect_bad(OAI_RESPONSES, "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"xml\"}}}", 400,
               "text.format.type");
    expect_bad(OAI_RESPONSES,
               "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\",\"schema\":1}}}",
               400, "text.format.schema");
    expect_bad(OAI_RESPONSES, "{\"input\":\"x\",\"text\":3}", 400, "text");
    expect_bad(OAI_RESPONSES,
               "{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_object\"}},\"tools\":[{"
               "\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":\"required\"}",
               400, "tool_choice");
    expect_bad(OAI_RESPONSES, "{\"input\":\"x\",\"messages\":[]}", 400, "messages");
    expect_bad(OAI_RESPONSES, "{\"input\":\"x\",\"temperature\":9}", 400, "temperature");
}
END_TEST

/* Malformed bodies: 400 with no param and a JSON-ish code, never a crash. */
START_TEST(hostile_bodies)
{
    expect_bad(OAI_COMPLETION, "", 400, "");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\"", 400, "");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"x\"} trailing", 400, "");
    expect_bad(OAI_COMPLETION, "[1,2]", 400, "");
    expect_bad(OAI_COMPLETION, "\"just a string\"", 400, "");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"abc\xff\xfe\"}", 400, "");
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"\xc0\xaf\"}", 400, "");     /* overlong */
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"\xed\xa0\x80\"}", 400, ""); /* surrogate */
    expect_bad(OAI_COMPLETION, "{\"prompt\":\"\\ud800\"}", 400, "");      /* lone escape */
    struct oai_request r;
    struct oai_error e;
    ck_assert_int_eq(parse(OAI_COMPLETION, " \n{\"prompt\":\"x\"}\r\n ", &r, &e), 0);
    oai_request_free(&r);
    /* an embedded NUL byte is not JSON */
    static const char nul[] = "{\"prompt\":\"a\0b\"}";
    ck_assert_int_lt(oai_parse(OAI_COMPLETION, nul, sizeof nul - 1, &r, &e), 0);
    ck_assert_int_eq(e.status, 400);
    /* 10k nested arrays: cJSON's nesting limit, not the stack */
    size_t depth = 10000;
    char *deep = malloc(2 * depth + 16);
    size_t n = 0;
    n += (size_t)sprintf(deep, "{\"prompt\":");
    for (size_t i = 0; i < depth; i++) deep[n++] = '[';
    for (size_t i = 0; i < depth; i++) deep[n++] = ']';
    deep[n++] = '}';
    deep[n] = '\0';
    expect_bad(OAI_COMPLETION, deep, 400, "");
    free(deep);
    /* 1 MiB of garbage bytes */
    size_t big = 1 << 20;
    char *junk = malloc(big + 1);
    unsigned x = 12345;
    for (size_t i = 0; i < big; i++) {
        x = x * 1103515245u + 12345u;
        junk[i] = (char)(x >> 16);
    }
    junk[big] = '\0';
    ck_assert_int_lt(oai_parse(OAI_COMPLETION, junk, big, &r, &e), 0);
    ck_assert_int_eq(e.status, 400);
    free(junk);
}
END_TEST

/* A fake vocabulary: token i is "t<i>", 7 is half of "é" (invalid alone), 8 is "é". */
static int fake_bytes(const void *ctx, int32_t id, char *buf, size_t cap)
{
    (void)ctx;
    char tmp[32];
    int n;
    if (id == 7)
        n = snprintf(tmp, sizeof tmp, "\xc3");
    else if (id == 8)
        n = snprintf(tmp, sizeof tmp, "\xc3\xa9");
    else
        n = snprintf(tmp, sizeof tmp, "t%d", id);
    memcpy(buf, tmp, (size_t)n < cap ? (size_t)n : cap);
    return n;
}

static const struct oai_meta *meta(enum oai_kind k, int logprobs)
{
    static struct oai_meta m;
    m = (struct oai_meta){.kind = k,
                          .id = k == OAI_CHAT ? "chatcmpl-1" : "cmpl-1",
                          .model = "smol",
                          .created = 1700000000,
                          .logprobs = logprobs,
                          .vocab = {.token_bytes = fake_bytes, .ctx = NULL}};
    return &m;
}

/* Reasoning split (oai_think): every way of cutting each text into three streamed pieces gives
 * the split of the whole, and the streamed pieces never hold part of a tag; where the block is
 * optional (Qwen3) a text that does not open one is all content. */
START_TEST(think_split_streamed)
{
    static const struct {
        bool optional;
        const char *text, *reasoning, *content; /* content NULL: the reasoning never ended */
    } cases[] = {
        {false, "Let me see.\n</think>\n\nFour.", "Let me see.\n", "\n\nFour."},
        {false, "<think>\nhm</think>ok", "\nhm", "ok"},
        {false, "</think>", "", ""},
        {false, "still thinking </thi", "still thinking </thi", NULL},
        {false, "<thin", "<thin", NULL},
        {false, "a</think>b</think>c", "a", "b</think>c"},
        {false, "", "", NULL},
        {true, "<think>\nhm</think>\n\nok", "\nhm", "\n\nok"},
        {true, "Four.", "", "Four."},
        {true, "a</think>b", "", "a</think>b"},
        {true, "<thin", "", "<thin"},
        {true, "<think>still </thi", "still </thi", NULL},
        {true, "", "", ""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const char *t = cases[k].text;
        size_t n = strlen(t);
        struct oai_span r, c;
        bool ended = oai_think_split(t, n, cases[k].optional, &r, &c);
        ck_assert_int_eq(ended, cases[k].content != NULL);
        ck_assert_int_eq(r.len, strlen(cases[k].reasoning));
        ck_assert(!memcmp(t + r.off, cases[k].reasoning, r.len));
        if (ended) {
            ck_assert_int_eq(c.len, strlen(cases[k].content));
            ck_assert(!memcmp(t + c.off, cases[k].content, c.len));
        }
        for (size_t a = 0; a <= n; a++)
            for (size_t b = a; b <= n; b++) {
                struct oai_think st = {.optional = cases[k].optional};
                char rs[64] = "", cs[64] = "";
                size_t cuts[3] = {a, b, n};
                for (int p = 0; p < 3; p++) {
                    oai_think_next(&st, t, cuts[p], p == 2, &r, &c);
                    ck_assert(r.off + r.len <= cuts[p] && c.off + c.len <= cuts[p]);
                    strncat(rs, t + r.off, r.len);
                    strncat(cs, t + c.off, c.len);
                    /* nothing given out may be part of "</think>" before the rest of it is,
                     * nor of an optional "<think>" */
                    if (p < 2 && !st.ended) ck_assert_msg(!strstr(rs, "</"), "%s", rs);
                    if (p < 2 && cases[k].optional) ck_assert_msg(!strstr(cs, "<th"), "%s", cs);
                }
                ck_assert_msg(!strcmp(rs, cases[k].reasoning), "'%s' cut %zu,%zu: '%s'", t, a, b,
                              rs);
                ck_assert_msg(!strcmp(cs, cases[k].content ? cases[k].content : ""),
                              "'%s' cut %zu,%zu: '%s'", t, a, b, cs);
            }
    }
    /* the whole response: reasoning_content beside content (null when it never ended) */
    struct oai_meta m = *meta(OAI_CHAT, -1);
    m.reasoning = OAI_REASONING_OPEN;
    struct oai_choice ch = {.finish = FINISH_STOP};
    ck_assert_int_eq(sbuf_append(&ch.text, "Hm.</think>\n\nFour.", 18), 0);
    struct oai_usage u = {0};
    char *out = oai_write_response(&m, &ch, 1, &u);
    cJSON *o = cJSON_Parse(out);
    const cJSON *msg =
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "message");
    ck_assert_str_eq(cJSON_GetObjectItem(msg, "reasoning_content")->valuestring, "Hm.");
    ck_assert_str_eq(cJSON_GetObjectItem(msg, "content")->valuestring, "\n\nFour.");
    cJSON_Delete(o);
    free(out);
    ch.text.len = 3; /* "Hm.": cut before the reasoning ended */
    out = oai_write_response(&m, &ch, 1, &u);
    o = cJSON_Parse(out);
    msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "message");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(msg, "content")));
    ck_assert_str_eq(cJSON_GetObjectItem(msg, "reasoning_content")->valuestring, "Hm.");
    cJSON_Delete(o);
    free(out);
    /* a model that may think answered without: all content, reasoning_content null */
    m.reasoning = OAI_REASONING_OPTIONAL;
    ch.text.len = 0;
    ck_assert_int_eq(sbuf_append(&ch.text, "Four.", 5), 0);
    out = oai_write_response(&m, &ch, 1, &u);
    o = cJSON_Parse(out);
    msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "message");
    ck_assert_str_eq(cJSON_GetObjectItem(msg, "content")->valuestring, "Four.");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(msg, "reasoning_content")));
    cJSON_Delete(o);
    free(out);
    sbuf_free(&ch.text);
    out = oai_write_reasoning_chunk(&m, 0, "abc", 3, NULL, 0, false);
    ck_assert_msg(strstr(out, "\"delta\":{\"reasoning_content\":\"abc\"}"), "%s", out);
    free(out);
}
END_TEST

/* Parses "data: {...}\n\n" and returns the JSON. */
static cJSON *sse_json(const char *chunk)
{
    ck_assert_ptr_nonnull(chunk);
    ck_assert_msg(!strncmp(chunk, "data: ", 6), "chunk: %s", chunk);
    size_t n = strlen(chunk);
    ck_assert_msg(n > 8 && !strcmp(chunk + n - 2, "\n\n"), "chunk end: %s", chunk);
    ck_assert_msg(!memchr(chunk + 6, '\n', n - 8), "newline inside the chunk: %s", chunk);
    cJSON *j = cJSON_ParseWithLength(chunk + 6, n - 8);
    ck_assert_msg(j != NULL, "chunk JSON: %s", chunk);
    return j;
}

START_TEST(write_completion)
{
    struct oai_choice c[2] = {0};
    sbuf_puts(&c[0].text, "hello \"world\"\n");
    c[0].finish = FINISH_LENGTH;
    sbuf_puts(&c[1].text, "é");
    c[1].finish = FINISH_STOP;
    struct token_logprob top[2] = {{1, -0.1f}, {8, -2.5f}};
    ck_assert_int_eq(oai_choice_add_lp(&c[0], 1, -0.1f, 0, top, 2), 0);
    ck_assert_int_eq(oai_choice_add_lp(&c[0], 7, -INFINITY, 2, top, 2), 0);
    struct oai_usage u = {.prompt_tokens = 5, .completion_tokens = 9, .cached_tokens = 3};
    char *s = oai_write_response(meta(OAI_COMPLETION, 2), c, 2, &u);
    cJSON *j = cJSON_Parse(s);
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "text_completion");
    ck_assert_str_eq(cJSON_GetObjectItem(j, "id")->valuestring, "cmpl-1");
    ck_assert_str_eq(cJSON_GetObjectItem(j, "model")->valuestring, "smol");
    ck_assert_int_eq(cJSON_GetObjectItem(j, "created")->valuedouble, 1700000000);
    cJSON *ch = cJSON_GetObjectItem(j, "choices");
    ck_assert_int_eq(cJSON_GetArraySize(ch), 2);
    cJSON *c0 = cJSON_GetArrayItem(ch, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(c0, "text")->valuestring, "hello \"world\"\n");
    ck_assert_str_eq(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "length");
    ck_assert_int_eq(cJSON_GetObjectItem(c0, "index")->valueint, 0);
    cJSON *lp = cJSON_GetObjectItem(c0, "logprobs");
    cJSON *toks = cJSON_GetObjectItem(lp, "tokens");
    ck_assert_str_eq(cJSON_GetArrayItem(toks, 0)->valuestring, "t1");
    ck_assert_str_eq(cJSON_GetArrayItem(toks, 1)->valuestring, "bytes:\\xc3");
    cJSON *tlp = cJSON_GetObjectItem(lp, "token_logprobs");
    ck_assert_float_eq_tol(cJSON_GetArrayItem(tlp, 0)->valuedouble, -0.1, 1e-6);
    ck_assert_float_eq(cJSON_GetArrayItem(tlp, 1)->valuedouble, -9999.0);
    cJSON *tops = cJSON_GetObjectItem(lp, "top_logprobs");
    cJSON *t0 = cJSON_GetArrayItem(tops, 0);
    ck_assert_int_eq(cJSON_GetArraySize(t0), 2);
    ck_assert_float_eq_tol(cJSON_GetObjectItem(t0, "é")->valuedouble, -2.5, 1e-6);
    cJSON *off = cJSON_GetObjectItem(lp, "text_offset");
    ck_assert_int_eq(cJSON_GetArrayItem(off, 1)->valueint, 2);
    cJSON *c1 = cJSON_GetArrayItem(ch, 1);
    ck_assert_str_eq(cJSON_GetObjectItem(c1, "text")->valuestring, "é");
    ck_assert_str_eq(cJSON_GetObjectItem(c1, "finish_reason")->valuestring, "stop");
    cJSON *us = cJSON_GetObjectItem(j, "usage");
    ck_assert_int_eq(cJSON_GetObjectItem(us, "prompt_tokens")->valueint, 5);
    ck_assert_int_eq(cJSON_GetObjectItem(us, "completion_tokens")->valueint, 9);
    ck_assert_int_eq(cJSON_GetObjectItem(us, "total_tokens")->valueint, 14);
    ck_assert_int_eq(
        cJSON_GetObjectItem(cJSON_GetObjectItem(us, "prompt_tokens_details"), "cached_tokens")
            ->valueint,
        3);
    cJSON_Delete(j);
    free(s);
    /* without logprobs: null */
    s = oai_write_response(meta(OAI_COMPLETION, -1), c, 1, &u);
    j = cJSON_Parse(s);
    ck_assert(cJSON_IsNull(
        cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0), "logprobs")));
    cJSON_Delete(j);
    free(s);
    oai_choice_free(&c[0]);
    oai_choice_free(&c[1]);
}
END_TEST

START_TEST(write_prompt_logprobs)
{
    struct oai_choice c = {0};
    sbuf_puts(&c.text, "ab");
    c.finish = FINISH_LENGTH;
    struct oai_lp first = {.token = 1, .null_lp = true};
    struct oai_lp second = {.token = 2, .logprob = -1.5f, .rank = 3, .text_offset = 1, .n_top = 2};
    second.top[0] = (struct token_logprob){8, -0.5f};
    second.top[1] = (struct token_logprob){2, -1.5f};
    ck_assert_int_eq(oai_lp_push(&c.lp, &c.n_lp, &c.cap_lp, &first), 0);
    ck_assert_int_eq(oai_lp_push(&c.lp, &c.n_lp, &c.cap_lp, &second), 0);
    ck_assert_int_eq(oai_lp_push(&c.plp, &c.n_plp, &c.cap_plp, &first), 0);
    ck_assert_int_eq(oai_lp_push(&c.plp, &c.n_plp, &c.cap_plp, &second), 0);
    struct oai_usage u = {.prompt_tokens = 2};
    struct oai_meta m = *meta(OAI_COMPLETION, 1);
    m.prompt_logprobs = true;
    m.prompt_top = 2;
    char *s = oai_write_response(&m, &c, 1, &u);
    cJSON *j = cJSON_Parse(s);
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *lp = cJSON_GetObjectItem(c0, "logprobs");
    ck_assert(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 0)));
    ck_assert(cJSON_IsNull(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 0)));
    ck_assert_float_eq_tol(
        cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "token_logprobs"), 1)->valuedouble, -1.5, 1e-6);
    ck_assert_int_eq(
        cJSON_GetArraySize(cJSON_GetArrayItem(cJSON_GetObjectItem(lp, "top_logprobs"), 1)), 1);
    cJSON *pl = cJSON_GetObjectItem(c0, "prompt_logprobs");
    ck_assert_int_eq(cJSON_GetArraySize(pl), 2);
    ck_assert(cJSON_IsNull(cJSON_GetArrayItem(pl, 0)));
    cJSON *p1 = cJSON_GetArrayItem(pl, 1);
    ck_assert_int_eq(cJSON_GetArraySize(p1), 2); /* the token (also the 2nd alternative) and 8 */
    ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(p1, "2"), "rank")->valueint, 3);
    ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(p1, "8"), "rank")->valueint, 1);
    ck_assert_str_eq(
        cJSON_GetObjectItem(cJSON_GetObjectItem(p1, "8"), "decoded_token")->valuestring, "é");
    cJSON_Delete(j);
    free(s);
    /* not asked: no prompt_logprobs field */
    s = oai_write_response(meta(OAI_COMPLETION, 1), &c, 1, &u);
    j = cJSON_Parse(s);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    ck_assert_ptr_null(cJSON_GetObjectItem(c0, "prompt_logprobs"));
    cJSON_Delete(j);
    free(s);
    oai_choice_free(&c);
}
END_TEST

START_TEST(write_embeddings)
{
    float a[2] = {1.0f, -2.0f}, b[2] = {0.5f, 0.25f};
    const float *v[2] = {a, b};
    char *s = oai_write_embeddings(v, 2, 2, false, "smol", 9);
    cJSON *j = cJSON_Parse(s);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "list");
    ck_assert_str_eq(cJSON_GetObjectItem(j, "model")->valuestring, "smol");
    cJSON *d1 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 1);
    ck_assert_int_eq(cJSON_GetObjectItem(d1, "index")->valueint, 1);
    ck_assert_str_eq(cJSON_GetObjectItem(d1, "object")->valuestring, "embedding");
    ck_assert_float_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(d1, "embedding"), 1)->valuedouble,
                       0.25);
    cJSON *us = cJSON_GetObjectItem(j, "usage");
    ck_assert_int_eq(cJSON_GetObjectItem(us, "prompt_tokens")->valueint, 9);
    ck_assert_int_eq(cJSON_GetObjectItem(us, "total_tokens")->valueint, 9);
    cJSON_Delete(j);
    free(s);
    /* base64 of the little-endian float32 bytes 00 00 80 3f 00 00 00 c0 */
    s = oai_write_embeddings(v, 1, 2, true, "smol", 9);
    j = cJSON_Parse(s);
    cJSON *d0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(d0, "embedding")->valuestring, "AACAPwAAAMA=");
    cJSON_Delete(j);
    free(s);
    float c3[3] = {1.0f, 1.0f, 1.0f};
    const float *v3[1] = {c3};
    s = oai_write_embeddings(v3, 1, 3, true, "smol", 1); /* 12 bytes: no padding */
    j = cJSON_Parse(s);
    d0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(d0, "embedding")->valuestring, "AACAPwAAgD8AAIA/");
    cJSON_Delete(j);
    free(s);
}
END_TEST

/* "event: T\ndata: {...}\n\n": T and the JSON, whose type must be T. */
static cJSON *resp_event(char *s, const char *type)
{
    ck_assert_ptr_nonnull(s);
    char want[96];
    snprintf(want, sizeof want, "event: %s\ndata: ", type);
    ck_assert_msg(!strncmp(s, want, strlen(want)), "event: %s", s);
    cJSON *j = cJSON_Parse(s + strlen(want));
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "type")->valuestring, type);
    free(s);
    return j;
}

START_TEST(write_responses)
{
    struct oai_resp r = {.id = "resp_1",
                         .msg_id = "msg_1",
                         .model = "smol",
                         .created = 5,
                         .instructions = NULL,
                         .max_output_tokens = 9,
                         .temperature = 0.5,
                         .top_p = 1};
    struct oai_usage u = {.prompt_tokens = 4, .completion_tokens = 9, .cached_tokens = 1};
    char *s = oai_resp_write(&r, "Paris.", 6, FINISH_LENGTH, &u);
    cJSON *j = cJSON_Parse(s);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "response");
    ck_assert_str_eq(cJSON_GetObjectItem(j, "status")->valuestring, "incomplete");
    ck_assert_str_eq(
        cJSON_GetObjectItem(cJSON_GetObjectItem(j, "incomplete_details"), "reason")->valuestring,
        "max_output_tokens");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "instructions")));
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "store")));
    cJSON *item = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "output"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(item, "role")->valuestring, "assistant");
    cJSON *part = cJSON_GetArrayItem(cJSON_GetObjectItem(item, "content"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(part, "type")->valuestring, "output_text");
    ck_assert_str_eq(cJSON_GetObjectItem(part, "text")->valuestring, "Paris.");
    cJSON *us = cJSON_GetObjectItem(j, "usage");
    ck_assert_int_eq(cJSON_GetObjectItem(us, "input_tokens")->valueint, 4);
    ck_assert_int_eq(cJSON_GetObjectItem(us, "output_tokens")->valueint, 9);
    ck_assert_int_eq(cJSON_GetObjectItem(us, "total_tokens")->valueint, 13);
    cJSON_Delete(j);
    free(s);
    j = resp_event(oai_resp_event(&r, OAI_RESP_CREATED, 0, "", 0, FINISH_NONE, NULL),
                   "response.created");
    cJSON *resp = cJSON_GetObjectItem(j, "response");
    ck_assert_str_eq(cJSON_GetObjectItem(resp, "status")->valuestring, "in_progress");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(resp, "output")), 0);
    ck_assert_int_eq(cJSON_GetObjectItem(j, "sequence_number")->valueint, 0);
    cJSON_Delete(j);
    j = resp_event(oai_resp_event(&r, OAI_RESP_DELTA, 4, "Par", 3, FINISH_NONE, NULL),
                   "response.output_text.delta");
    ck_assert_str_eq(cJSON_GetObjectItem(j, "delta")->valuestring, "Par");
    ck_assert_str_eq(cJSON_GetObjectItem(j, "item_id")->valuestring, "msg_1");
    ck_assert_int_eq(cJSON_GetObjectItem(j, "sequence_number")->valueint, 4);
    cJSON_Delete(j);
    j = resp_event(oai_resp_event(&r, OAI_RESP_PART_DONE, 6, "Paris.", 6, FINISH_STOP, &u),
                   "response.content_part.done");
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "part"), "text")->valuestring,
                     "Paris.");
    cJSON_Delete(j);
    j = resp_event(oai_resp_event(&r, OAI_RESP_DONE, 8, "Paris.", 6, FINISH_STOP, &u),
                   "response.completed");
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "response"), "status")->valuestring,
                     "completed");
    cJSON_Delete(j);
    j = resp_event(oai_resp_event(&r, OAI_RESP_DONE, 8, "", 0, FINISH_LENGTH, &u),
                   "response.incomplete");
    cJSON_Delete(j);
    /* a function call after no text: the call alone, at output index 0 */
    char name[] = "get_weather", args[] = "{\"city\":\"Paris\"}";
    struct oai_tool_call call = {name, args};
    r.calls = &call;
    r.n_calls = 1;
    s = oai_resp_write(&r, "", 0, FINISH_STOP, &u);
    j = cJSON_Parse(s);
    cJSON *out = cJSON_GetObjectItem(j, "output");
    ck_assert_int_eq(cJSON_GetArraySize(out), 1);
    cJSON *fc = cJSON_GetArrayItem(out, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(fc, "type")->valuestring, "function_call");
    ck_assert_str_eq(cJSON_GetObjectItem(fc, "name")->valuestring, "get_weather");
    ck_assert_str_eq(cJSON_GetObjectItem(fc, "arguments")->valuestring, args);
    ck_assert_str_eq(cJSON_GetObjectItem(fc, "call_id")->valuestring, "call_1_0");
    cJSON_Delete(j);
    free(s);
    j = resp_event(oai_resp_call_event(&r, OAI_RESP_CALL_ARGS_DONE, 3, 0, 0),
                   "response.function_call_arguments.done");
    ck_assert_int_eq(cJSON_GetObjectItem(j, "output_index")->valueint, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "arguments")->valuestring, args);
    cJSON_Delete(j);
    /* after text, the call is item 1 */
    j = resp_event(oai_resp_call_event(&r, OAI_RESP_CALL_ADDED, 3, 0, 4),
                   "response.output_item.added");
    ck_assert_int_eq(cJSON_GetObjectItem(j, "output_index")->valueint, 1);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "item"), "arguments")->valuestring,
                     "");
    cJSON_Delete(j);
}
END_TEST

START_TEST(write_chat)
{
    struct oai_choice c = {0};
    sbuf_puts(&c.text, "Paris.");
    c.finish = FINISH_STOP;
    struct token_logprob top[3] = {{8, -0.5f}, {2, -1.5f}, {3, -3.0f}};
    oai_choice_add_lp(&c, 8, -0.5f, 0, top, 3);
    struct oai_usage u = {.prompt_tokens = 1, .completion_tokens = 1};
    char *s = oai_write_response(meta(OAI_CHAT, 2), &c, 1, &u);
    cJSON *j = cJSON_Parse(s);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion");
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *msg = cJSON_GetObjectItem(c0, "message");
    ck_assert_str_eq(cJSON_GetObjectItem(msg, "role")->valuestring, "assistant");
    ck_assert_str_eq(cJSON_GetObjectItem(msg, "content")->valuestring, "Paris.");
    cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(c0, "logprobs"), "content");
    cJSON *e0 = cJSON_GetArrayItem(content, 0);
    ck_assert_str_eq(cJSON_GetObjectItem(e0, "token")->valuestring, "é");
    cJSON *bytes = cJSON_GetObjectItem(e0, "bytes");
    ck_assert_int_eq(cJSON_GetArraySize(bytes), 2);
    ck_assert_int_eq(cJSON_GetArrayItem(bytes, 0)->valueint, 0xc3);
    cJSON *tops = cJSON_GetObjectItem(e0, "top_logprobs");
    ck_assert_int_eq(cJSON_GetArraySize(tops), 2); /* top_logprobs = 2 of the 3 given */
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(tops, 1), "token")->valuestring, "t2");
    cJSON_Delete(j);
    free(s);
    oai_choice_free(&c);
}
END_TEST

/* ---- tool calls in model outputs, per format, whole and streamed ---- */

struct tool_case {
    enum chat_tool_format fmt;
    const char *out;     /* what the model wrote (markers as their text) */
    const char *content; /* the content that goes with the calls (or all of it) */
    int n;               /* calls found */
    const char *names[2], *args[2];
};

static const struct tool_case k_tool_cases[] = {
    /* cut by max_tokens inside a third call's tag: the two whole calls (a fuzzed-by-sampling
     * stream once sent this as content where the whole response had the calls) */
    {CHAT_TOOLS_HERMES,
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
     "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n"
     "</tool_call>\n<tool",
     "",
     2,
     {"get_weather", "get_time"},
     {"{\"city\":\"Paris\"}", "{\"tz\":\"CET\"}"}},
    {CHAT_TOOLS_HERMES,
     "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
     "\"Paris\"}}\n</tool_call>\n",
     "Let me check.",
     1,
     {"get_weather"},
     {"{\"city\":\"Paris\"}"}},
    {CHAT_TOOLS_HERMES,
     "a < b, and <tool is not a tag <",
     "a < b, and <tool is not a tag <",
     0,
     {NULL},
     {NULL}},
    {CHAT_TOOLS_LLAMA3,
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}",
     "",
     1,
     {"get_weather"},
     {"{\"city\":\"Paris\",\"unit\":\"celsius\"}"}},
    {CHAT_TOOLS_LLAMA3,
     "<|python_tag|>{\"name\": \"get_time\", \"parameters\": {\"tz\": \"CET\"}}; {\"name\": "
     "\"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}",
     "",
     2,
     {"get_time", "get_weather"},
     {"{\"tz\":\"CET\"}", "{\"city\":\"Oslo\"}"}},
    {CHAT_TOOLS_LLAMA3,
     "I will look.<|python_tag|>{\"name\": \"f\", \"parameters\": {}}",
     "I will look.",
     1,
     {"f"},
     {"{}"}},
    {CHAT_TOOLS_LLAMA3,
     "The weather is {unknown} today.",
     "The weather is {unknown} today.",
     0,
     {NULL},
     {NULL}},
    {CHAT_TOOLS_LLAMA3,
     "  {\"name\": \"f\", \"parameters\": [1]}",
     "  {\"name\": \"f\", \"parameters\": [1]}",
     0,
     {NULL},
     {NULL}},
    {CHAT_TOOLS_MISTRAL,
     "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": "
     "\"get_time\", \"arguments\": {\"tz\": \"CET\"}, \"id\": \"a1B2c3D4e\"}]",
     "",
     2,
     {"get_weather", "get_time"},
     {"{\"city\":\"Paris\"}", "{\"tz\":\"CET\"}"}},
    {CHAT_TOOLS_MISTRAL,
     "Sure.[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"s\": \"[ARGS]\"}}]",
     "Sure.",
     1,
     {"f"},
     {"{\"s\":\"[ARGS]\"}"}},
    {CHAT_TOOLS_MISTRAL,
     "[TOOL_CALLS] [{\"name\": 1}]",
     "[TOOL_CALLS] [{\"name\": 1}]",
     0,
     {NULL},
     {NULL}},
    {CHAT_TOOLS_MISTRAL_ARGS,
     "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[CALL_ID]a1B2c3D4e"
     "[ARGS]{}",
     "",
     2,
     {"get_weather", "get_time"},
     {"{\"city\":\"Paris\"}", "{}"}},
    {CHAT_TOOLS_MISTRAL_ARGS,
     "No call [TOOL_CALLS]bad name[ARGS]{}",
     "No call [TOOL_CALLS]bad name[ARGS]{}",
     0,
     {NULL},
     {NULL}},
};

START_TEST(tool_call_parsers)
{
    for (size_t i = 0; i < sizeof k_tool_cases / sizeof k_tool_cases[0]; i++) {
        const struct tool_case *c = &k_tool_cases[i];
        struct oai_tool_call *calls;
        size_t keep;
        int n = oai_parse_tool_calls(c->fmt, c->out, strlen(c->out), &calls, &keep);
        ck_assert_msg(n == c->n, "case %zu: %d calls, want %d", i, n, c->n);
        ck_assert_msg(keep == strlen(c->content) && !strncmp(c->out, c->content, keep),
                      "case %zu: content %zu bytes", i, keep);
        for (int k = 0; k < n; k++) {
            ck_assert_str_eq(calls[k].name, c->names[k]);
            ck_assert_str_eq(calls[k].arguments, c->args[k]);
        }
        oai_tool_calls_free(calls, n > 0 ? (size_t)n : 0);
        /* the whole response: message.tool_calls, finish_reason tool_calls (a cut output's
         * whole calls too, its finish_reason kept) */
        for (int cut = 0; cut < 2; cut++) {
            cJSON *body = cJSON_CreateObject(), *ch = cJSON_CreateObject(), *msg;
            cJSON_AddItemToArray(cJSON_AddArrayToObject(body, "choices"), ch);
            msg = cJSON_AddObjectToObject(ch, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            cJSON_AddStringToObject(msg, "content", c->out);
            cJSON_AddStringToObject(ch, "finish_reason", cut ? "length" : "stop");
            char *text = cJSON_PrintUnformatted(body);
            cJSON_Delete(body);
            text = oai_tools_rewrite(text, "chatcmpl-7", c->fmt);
            cJSON *r = cJSON_Parse(text);
            free(text);
            ch = cJSON_GetArrayItem(cJSON_GetObjectItem(r, "choices"), 0);
            msg = cJSON_GetObjectItem(ch, "message");
            const cJSON *tc = cJSON_GetObjectItem(msg, "tool_calls");
            ck_assert_int_eq(cJSON_GetArraySize(tc), c->n);
            ck_assert_str_eq(cJSON_GetObjectItem(ch, "finish_reason")->valuestring,
                             cut    ? "length"
                             : c->n ? "tool_calls"
                                    : "stop");
            for (int k = 0; k < c->n; k++) {
                const cJSON *one = cJSON_GetArrayItem(tc, k),
                            *fn = cJSON_GetObjectItem(one, "function");
                ck_assert_str_eq(cJSON_GetObjectItem(one, "type")->valuestring, "function");
                ck_assert_ptr_nonnull(cJSON_GetObjectItem(one, "id")->valuestring);
                ck_assert_str_eq(cJSON_GetObjectItem(fn, "name")->valuestring, c->names[k]);
                ck_assert_str_eq(cJSON_GetObjectItem(fn, "arguments")->valuestring, c->args[k]);
            }
            const cJSON *content = cJSON_GetObjectItem(msg, "content");
            if (c->n && !*c->content)
                ck_assert(cJSON_IsNull(content));
            else
                ck_assert_str_eq(content->valuestring, c->content);
            cJSON_Delete(r);
        }
    }
}
END_TEST

/* The SSE chunks of one streamed output cut into pieces at cuts[0..n_cuts) (increasing):
 * the content deltas joined, and the calls as a client's accumulator rebuilds them. */
static void stream_once(const struct tool_case *c, const size_t *cuts, int n_cuts, size_t ci,
                        enum finish_reason last)
{
    size_t len = strlen(c->out), sent = 0;
    struct sbuf content = {0}, all = {0};
    char names[2][64] = {{0}}, args[2][256] = {{0}};
    int n_calls = 0;
    const char *finish = NULL;
    for (int k = 0; k <= n_cuts; k++) {
        size_t upto = k < n_cuts ? cuts[k] : len;
        enum finish_reason fin = k < n_cuts ? FINISH_NONE : last;
        /* a stop token as vLLM's stop_reason (the finish chunk carries it, null for a length) */
        const struct oai_stop stop = {.by_token = last == FINISH_STOP, .token = 7};
        char *sse =
            oai_tools_chunks(meta(OAI_CHAT, -1), c->fmt, 0, c->out, upto, &sent, fin, &stop, false);
        ck_assert_ptr_nonnull(sse);
        sbuf_puts(&all, sse);
        for (char *p = sse; (p = strstr(p, "data: "));) {
            char *end = strstr(p, "\n\n");
            ck_assert_ptr_nonnull(end);
            cJSON *j = cJSON_ParseWithLength(p + 6, (size_t)(end - p - 6));
            ck_assert_ptr_nonnull(j);
            const cJSON *ch = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0),
                        *d = cJSON_GetObjectItem(ch, "delta"),
                        *fr = cJSON_GetObjectItem(ch, "finish_reason");
            const cJSON *txt = cJSON_GetObjectItem(d, "content"),
                        *tc = cJSON_GetObjectItem(d, "tool_calls");
            if (cJSON_IsString(txt)) {
                ck_assert_msg(!n_calls, "case %zu: content after a call", ci);
                sbuf_puts(&content, txt->valuestring);
            }
            const cJSON *one;
            cJSON_ArrayForEach(one, tc)
            {
                int idx = cJSON_GetObjectItem(one, "index")->valueint;
                const cJSON *fn = cJSON_GetObjectItem(one, "function"),
                            *nm = cJSON_GetObjectItem(fn, "name"),
                            *a = cJSON_GetObjectItem(fn, "arguments");
                ck_assert_int_lt(idx, 2);
                if (idx == n_calls) { /* a new call: its id and name come first */
                    ck_assert_ptr_nonnull(cJSON_GetObjectItem(one, "id"));
                    ck_assert(cJSON_IsString(nm));
                    snprintf(names[idx], sizeof names[idx], "%s", nm->valuestring);
                    n_calls++;
                } else {
                    ck_assert_int_eq(idx, n_calls - 1);
                    ck_assert_ptr_null(nm);
                }
                if (cJSON_IsString(a))
                    strncat(args[idx], a->valuestring, sizeof args[idx] - strlen(args[idx]) - 1);
            }
            if (cJSON_IsString(fr)) {
                finish = "set";
                const cJSON *sr = cJSON_GetObjectItem(ch, "stop_reason");
                ck_assert_msg(last == FINISH_STOP ? cJSON_IsNumber(sr) && sr->valueint == 7
                                                  : cJSON_IsNull(sr),
                              "case %zu: stop_reason of the finish chunk", ci);
            } else {
                ck_assert_ptr_null(cJSON_GetObjectItem(ch, "stop_reason"));
            }
            if (cJSON_IsString(fr))
                ck_assert_str_eq(fr->valuestring, last == FINISH_LENGTH ? "length"
                                                  : c->n                ? "tool_calls"
                                                                        : "stop");
            cJSON_Delete(j);
            p = end;
        }
        free(sse);
    }
    ck_assert_msg(finish, "case %zu: no finish chunk", ci);
    ck_assert_msg(!strcmp(content.p ? content.p : "", c->content),
                  "case %zu: streamed content '%s'", ci, content.p ? content.p : "");
    ck_assert_int_eq(n_calls, c->n);
    for (int k = 0; k < n_calls; k++) {
        ck_assert_str_eq(names[k], c->names[k]);
        ck_assert_str_eq(args[k], c->args[k]);
    }
    sbuf_free(&content);
    sbuf_free(&all);
}

/* Each output streamed in arbitrary chunkings (one byte at a time, and random cuts) gives the
 * content and calls the whole output gives; content never carries a call's bytes. */
START_TEST(tool_call_streams)
{
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < sizeof k_tool_cases / sizeof k_tool_cases[0]; i++) {
        const struct tool_case *c = &k_tool_cases[i];
        size_t len = strlen(c->out), cuts[512];
        ck_assert_uint_lt(len, 512);
        for (size_t k = 1; k < len; k++) cuts[k - 1] = k;
        stream_once(c, cuts, (int)len - 1, i, FINISH_STOP);
        /* cut by max_tokens: the calls of the whole response too (oai_tools_rewrite) */
        stream_once(c, cuts, (int)len - 1, i, FINISH_LENGTH);
        for (int rep = 0; rep < 20; rep++) {
            int n = 0;
            for (size_t k = 1; k < len; k++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                if (x % 5 == 0) cuts[n++] = k;
            }
            stream_once(c, cuts, n, i, rep % 2 ? FINISH_LENGTH : FINISH_STOP);
        }
    }
}
END_TEST

START_TEST(write_chunks)
{
    /* chat: the role chunk, a content chunk, the finish chunk, usage, [DONE] */
    char *s = oai_write_chunk(meta(OAI_CHAT, -1), 0, "", 0, "assistant", FINISH_NONE, NULL, NULL, 0,
                              false);
    cJSON *j = sse_json(s);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "chat.completion.chunk");
    cJSON *c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    cJSON *d = cJSON_GetObjectItem(c0, "delta");
    ck_assert_str_eq(cJSON_GetObjectItem(d, "role")->valuestring, "assistant");
    ck_assert_str_eq(cJSON_GetObjectItem(d, "content")->valuestring, "");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(c0, "finish_reason")));
    ck_assert_ptr_null(cJSON_GetObjectItem(j, "usage"));
    cJSON_Delete(j);
    free(s);

    s = oai_write_chunk(meta(OAI_CHAT, -1), 1, "a\nb\"c", 5, NULL, FINISH_NONE, NULL, NULL, 0,
                        true);
    j = sse_json(s);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    ck_assert_int_eq(cJSON_GetObjectItem(c0, "index")->valueint, 1);
    d = cJSON_GetObjectItem(c0, "delta");
    ck_assert_str_eq(cJSON_GetObjectItem(d, "content")->valuestring, "a\nb\"c");
    ck_assert_ptr_null(cJSON_GetObjectItem(d, "role"));
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "usage")));
    cJSON_Delete(j);
    free(s);

    s = oai_write_chunk(meta(OAI_CHAT, -1), 0, "", 0, NULL, FINISH_STOP, NULL, NULL, 0, false);
    j = sse_json(s);
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(c0, "delta")), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "stop");
    cJSON_Delete(j);
    free(s);

    /* completions: text chunks, with logprobs */
    struct oai_lp lp = {
        .token = 3, .logprob = -1.0f, .text_offset = 4, .n_top = 1, .top = {{3, -1.0f}}};
    s = oai_write_chunk(meta(OAI_COMPLETION, 1), 0, "t3", 2, NULL, FINISH_ABORT, NULL, &lp, 1,
                        false);
    j = sse_json(s);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "text_completion");
    c0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "choices"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(c0, "text")->valuestring, "t3");
    ck_assert_str_eq(cJSON_GetObjectItem(c0, "finish_reason")->valuestring, "abort");
    cJSON *l = cJSON_GetObjectItem(c0, "logprobs");
    ck_assert_int_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(l, "text_offset"), 0)->valueint, 4);
    cJSON_Delete(j);
    free(s);

    struct oai_usage u = {.prompt_tokens = 2, .completion_tokens = 3};
    s = oai_write_usage_chunk(meta(OAI_CHAT, -1), &u);
    j = sse_json(s);
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "choices")), 0);
    ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "usage"), "total_tokens")->valueint,
                     5);
    cJSON_Delete(j);
    free(s);
    ck_assert_str_eq(OAI_SSE_DONE, "data: [DONE]\n\n");
}
END_TEST

START_TEST(write_errors_and_misc)
{
    struct oai_error e = {0};
    ck_assert_int_lt(oai_error_set(&e, 400, "invalid_request_error", "invalid_value", "top_p",
                                   "'top_p' is %g", 3.0),
                     0);
    char *s = oai_write_error(&e);
    cJSON *j = cJSON_Parse(s);
    cJSON *err = cJSON_GetObjectItem(j, "error");
    ck_assert_str_eq(cJSON_GetObjectItem(err, "message")->valuestring, "'top_p' is 3");
    ck_assert_str_eq(cJSON_GetObjectItem(err, "type")->valuestring, "invalid_request_error");
    ck_assert_str_eq(cJSON_GetObjectItem(err, "param")->valuestring, "top_p");
    ck_assert_str_eq(cJSON_GetObjectItem(err, "code")->valuestring, "invalid_value");
    cJSON_Delete(j);
    free(s);
    oai_error_set(&e, 404, "invalid_request_error", NULL, NULL, "no route");
    s = oai_write_error(&e);
    j = cJSON_Parse(s);
    err = cJSON_GetObjectItem(j, "error");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(err, "param")));
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(err, "code")));
    cJSON_Delete(j);
    free(s);
    s = oai_write_error_chunk(&e);
    j = sse_json(s);
    ck_assert_ptr_nonnull(cJSON_GetObjectItem(j, "error"));
    cJSON_Delete(j);
    free(s);

    const char *names[] = {"smol", "alias"};
    const char *loras[] = {"sql-lora"};
    s = oai_write_models(names, 2, loras, 1, 5, 8192);
    j = cJSON_Parse(s);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "object")->valuestring, "list");
    cJSON *m0 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 0);
    ck_assert_str_eq(cJSON_GetObjectItem(m0, "id")->valuestring, "smol");
    ck_assert_str_eq(cJSON_GetObjectItem(m0, "object")->valuestring, "model");
    ck_assert_int_eq(cJSON_GetObjectItem(m0, "max_model_len")->valueint, 8192);
    ck_assert_int_eq(cJSON_GetObjectItem(m0, "created")->valueint, 5);
    ck_assert_str_eq(cJSON_GetObjectItem(m0, "owned_by")->valuestring, "quern");
    cJSON *m1 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 1);
    ck_assert_str_eq(cJSON_GetObjectItem(m1, "id")->valuestring, "alias");
    ck_assert_str_eq(cJSON_GetObjectItem(m1, "root")->valuestring, "smol");
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(m1, "parent")));
    cJSON *m2 = cJSON_GetArrayItem(cJSON_GetObjectItem(j, "data"), 2);
    ck_assert_str_eq(cJSON_GetObjectItem(m2, "id")->valuestring, "sql-lora");
    ck_assert_str_eq(cJSON_GetObjectItem(m2, "parent")->valuestring, "smol");
    ck_assert_int_eq(cJSON_GetArraySize(cJSON_GetObjectItem(j, "data")), 3);
    cJSON_Delete(j);
    free(s);
    s = oai_write_model("alias", "smol", NULL, 5, 100);
    j = cJSON_Parse(s);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "id")->valuestring, "alias");
    ck_assert_int_eq(cJSON_GetObjectItem(j, "context_length")->valueint, 100);
    cJSON_Delete(j);
    free(s);

    int32_t ids[3] = {1, 22, 333};
    s = oai_write_tokens(ids, 3, 100);
    ck_assert_str_eq(s, "{\"tokens\":[1,22,333],\"count\":3,\"max_model_len\":100}");
    free(s);
    s = oai_write_detokenized("a\"b", 3);
    ck_assert_str_eq(s, "{\"prompt\":\"a\\\"b\"}");
    free(s);
    ck_assert_str_eq(oai_finish_name(FINISH_STOP), "stop");
    ck_assert_str_eq(oai_finish_name(FINISH_LENGTH), "length");
    ck_assert_str_eq(oai_finish_name(FINISH_ABORT), "abort");
    ck_assert_ptr_null(oai_finish_name(FINISH_NONE));
}
END_TEST

START_TEST(metrics_text)
{
    struct metrics m;
    ck_assert_int_eq(metrics_init(&m), 0);
    struct req_event f = {.done = true,
                          .finish = FINISH_STOP,
                          .prompt_tokens = 10,
                          .completion_tokens = 5,
                          .cached_tokens = 4,
                          .ttft_ms = 30,
                          .total_ms = 70,
                          .queue_ms = 2};
    metrics_observe_request(&m, &f);
    f.finish = FINISH_ABORT;
    f.ttft_ms = 5000;
    metrics_observe_request(&m, &f);
    metrics_count_error(&m, METRICS_ERR_QUEUE_FULL);
    metrics_count_status(&m, 200);
    metrics_count_status(&m, 429);
    metrics_count_status(&m, 418);
    struct engine_stats st = {.running = 2,
                              .waiting = 1,
                              .kv_blocks_total = 100,
                              .kv_block_size = 16,
                              .kv_blocks_used = 25,
                              .prefix_hit_tokens = 64,
                              .preemptions = 3,
                              .prompt_tokens = 1000,
                              .generation_tokens = 500,
                              .finished = {0, 7, 2, 1, 0},
                              .last_step_age_s = 0.25};
    struct sbuf b = {0};
    ck_assert_int_eq(metrics_render(&m, &st, 1, &b), 0);
    const char *t = b.p;
    static const char *want[] = {
        "quern_server_state 1\n",
        "quern_requests_running 2\n",
        "quern_requests_waiting 1\n",
        "quern_kv_blocks_used 25\n",
        "quern_kv_blocks_total 100\n",
        "quern_cache_config_info{block_size=\"16\",num_gpu_blocks=\"100\"} 1\n",
        "quern_kv_cache_usage_ratio 0.25\n",
        "quern_prefix_cache_hit_tokens_total 64\n",
        "quern_preemptions_total 3\n",
        "quern_prompt_tokens_total 1000\n",
        "quern_generation_tokens_total 500\n",
        "quern_engine_requests_finished_total{finished_reason=\"stop\"} 7\n",
        "quern_request_success_total{finished_reason=\"stop\"} 1\n",
        "quern_request_failure_total{finished_reason=\"abort\"} 1\n",
        "quern_request_errors_total{reason=\"queue_full\"} 1\n",
        "quern_http_responses_total{code=\"429\"} 1\n",
        "quern_http_responses_total{code=\"other\"} 1\n",
        "quern_request_generation_tokens_total 10\n",
        "# TYPE quern_time_to_first_token_seconds histogram\n",
        "quern_time_to_first_token_seconds_bucket{le=\"0.04\"} 1\n",
        "quern_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n",
        "quern_time_to_first_token_seconds_count 2\n",
        "quern_time_to_first_token_seconds_sum 5.03",
        "quern_time_per_output_token_seconds_count 2\n",
        "quern_e2e_request_latency_seconds_count 2\n",
        "quern_request_queue_time_seconds_count 2\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(t, want[i]), "missing '%s' in:\n%s", want[i], t);
    /* every line is a comment or `name{labels} value`, and every family has HELP and TYPE */
    regex_t re;
    ck_assert_int_eq(regcomp(&re,
                             "^[a-zA-Z_:][a-zA-Z0-9_:]*"
                             "(\\{[a-zA-Z_]+=\"[^\"]*\"(,[a-zA-Z_]+=\"[^\"]*\")*\\})? "
                             "(-?[0-9.]+(e[-+]?[0-9]+)?|\\+Inf|NaN)$",
                             REG_EXTENDED | REG_NOSUB),
                     0);
    char *copy = strdup(t);
    int samples = 0;
    for (char *save, *line = strtok_r(copy, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') {
            ck_assert_msg(!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7), "%s", line);
            continue;
        }
        ck_assert_msg(regexec(&re, line, 0, NULL, 0) == 0, "bad sample line: '%s'", line);
        char name[128];
        sscanf(line, "%127[a-zA-Z0-9_:]", name);
        char *suffix;
        if ((suffix = strstr(name, "_bucket")) || (suffix = strstr(name, "_sum")) ||
            (suffix = strstr(name, "_count")))
            if (suffix[strcspn(suffix + 1, "_") + 1] == '\0') *suffix = '\0';
        char type_line[192];
        snprintf(type_line, sizeof type_line, "# TYPE %s ", name);
        ck_assert_msg(strstr(t, type_line), "no TYPE for %s", name);
        samples++;
    }
    ck_assert_int_gt(samples, 60);
    free(copy);
    regfree(&re);
    /* buckets are cumulative */
    const char *p = t;
    unsigned long long prev = 0, v;
    while ((p = strstr(p, "quern_e2e_request_latency_seconds_bucket{le="))) {
        p = strchr(p, '}') + 2;
        v = strtoull(p, NULL, 10);
        ck_assert_uint_ge(v, prev);
        prev = v;
    }
    ck_assert_uint_eq(prev, 2);
    /* loading: no engine section */
    sbuf_reset(&b);
    ck_assert_int_eq(metrics_render(&m, NULL, 0, &b), 0);
    ck_assert_ptr_null(strstr(b.p, "quern_kv_blocks_used"));
    ck_assert_ptr_nonnull(strstr(b.p, "quern_server_state 0\n"));
    sbuf_free(&b);
    metrics_free(&m);
}
END_TEST

START_TEST(sbuf_basics)
{
    struct sbuf b = {0};
    char *e = sbuf_take(&b);
    ck_assert_str_eq(e, "");
    free(e);
    for (int i = 0; i < 1000; i++) ck_assert_int_eq(sbuf_printf(&b, "%d,", i), 0);
    ck_assert_int_eq(b.len, strlen(b.p));
    ck_assert(!strncmp(b.p, "0,1,2,", 6));
    sbuf_reset(&b);
    ck_assert_int_eq(b.len, 0);
    ck_assert_str_eq(b.p, "");
    ck_assert_int_eq(sbuf_append(&b, "a\0b", 3), 0);
    ck_assert_int_eq(b.len, 3);
    sbuf_free(&b);
    ck_assert_ptr_null(b.p);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("oai");
    TCase *p = tcase_create("parse");
    tcase_add_test(p, completion_all_fields);
    tcase_add_test(p, completion_defaults);
    tcase_add_test(p, ignored_members);
    tcase_add_test(p, wrong_types);
    tcase_add_test(p, ranges);
    tcase_add_test(p, stop_forms);
    tcase_add_test(p, prompt_forms);
    tcase_add_test(p, messages);
    tcase_add_test(p, tokenize_bodies);
    tcase_add_test(p, embedding_bodies);
    tcase_add_test(p, responses_bodies);
    tcase_add_test(p, structured_bodies);
    tcase_add_test(p, hostile_bodies);
    suite_add_tcase(s, p);
    TCase *w = tcase_create("write");
    tcase_add_test(w, write_completion);
    tcase_add_test(w, write_chat);
    tcase_add_test(w, write_prompt_logprobs);
    tcase_add_test(w, write_embeddings);
    tcase_add_test(w, write_responses);
    tcase_add_test(w, write_chunks);
    tcase_add_test(w, tool_call_parsers);
    tcase_add_test(w, tool_call_streams);
    tcase_add_test(w, write_errors_and_misc);
    tcase_add_test(w, metrics_text);
    tcase_add_test(w, sbuf_basics);
    tcase_add_test(w, think_split_streamed);
    suite_add_tcase(s, w);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
