/* oai_structured: response_format (OpenAI) and structured_outputs (vLLM) -> the grammar a
 * request asks for. Only the shapes are checked here; the schema itself is compiled (and its
 * unsupported keywords refused) by the handler through the engine's grammar cache. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../engine/grammar.h"
#include "oai.h"
#include "oai_json.h"

static int bad(struct oai_error *e, const char *param, const char *msg)
{
    return oai_error_set(e, 400, "invalid_request_error", "invalid_value", param, "%s", msg);
}

static int set(struct oai_request *r, int kind, const cJSON *printed, const char *text,
               const char *param, struct oai_error *e)
{
    char *t = printed ? cJSON_PrintUnformatted(printed) : strdup(text ? text : "");
    if (!t) return oai_error_set(e, 500, "server_error", NULL, NULL, "out of memory");
    r->constraint.kind = kind;
    r->constraint.text = t;
    r->constraint.len = strlen(t);
    snprintf(r->constraint.param, sizeof r->constraint.param, "%s", param);
    return 0;
}

/* A json_schema format's fields in js (chat: response_format.json_schema; Responses: text.format
 * itself), prefix naming where they are. */
static int schema_fields(const cJSON *js, const char *prefix, struct oai_request *r,
                         struct oai_error *e)
{
    const cJSON *name = oai_field(js, "name"), *strict = oai_field(js, "strict"),
                *desc = oai_field(js, "description"), *schema = oai_field(js, "schema");
    char param[64];
    const char *want = NULL;
    if (name && !cJSON_IsString(name)) want = "name";
    if (strict && !cJSON_IsBool(strict)) want = "strict";
    if (desc && !cJSON_IsString(desc) && !cJSON_IsNull(desc)) want = "description";
    if (want) {
        snprintf(param, sizeof param, "%s.%s", prefix, want);
        return oai_error_set(e, 400, "invalid_request_error", "invalid_value", param,
                             "'%s' must be a %s", param,
                             !strcmp(want, "strict") ? "boolean" : "string");
    }
    if (!schema) /* OpenAI: no schema means any JSON object */
        return set(r, GRAMMAR_JSON_OBJECT, NULL, "", prefix, e);
    snprintf(param, sizeof param, "%s.schema", prefix);
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return oai_error_set(e, 400, "invalid_request_error", "invalid_value", param,
                             "'%s' must be an object", param);
    return set(r, GRAMMAR_JSON_SCHEMA, schema, NULL, param, e);
}

static int response_format(const cJSON *rf, struct oai_request *r, struct oai_error *e)
{
    const cJSON *type = oai_field(rf, "type");
    if (!cJSON_IsObject(rf) || !cJSON_IsString(type))
        return bad(e, "response_format", "'response_format' must be an object with a 'type'");
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) return 0;
    if (!strcmp(t, "json_object"))
        return set(r, GRAMMAR_JSON_OBJECT, NULL, "", "response_format", e);
    if (strcmp(t, "json_schema"))
        return oai_error_set(e, 400, "invalid_request_error", "invalid_value",
                             "response_format.type",
                             "'response_format.type' is '%.40s'; it must be text, json_object or "
                             "json_schema",
                             t);
    const cJSON *js = oai_field(rf, "json_schema");
    if (!cJSON_IsObject(js))
        return bad(e, "response_format.json_schema",
                   "'response_format.json_schema' must be an object with a 'schema'");
    return schema_fields(js, "response_format.json_schema", r, e);
}

int oai_parse_text_format(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *text = oai_field(root, "text");
    if (!text || cJSON_IsNull(text)) return 0;
    if (!cJSON_IsObject(text)) return bad(e, "text", "'text' must be an object");
    const cJSON *fmt = oai_field(text, "format");
    if (!fmt || cJSON_IsNull(fmt)) return 0;
    const cJSON *type = oai_field(fmt, "type");
    if (!cJSON_IsObject(fmt) || !cJSON_IsString(type))
        return bad(e, "text.format", "'text.format' must be an object with a 'type'");
    const char *t = type->valuestring;
    if (!strcmp(t, "text")) return 0;
    r->text_format = fmt;
    if (!strcmp(t, "json_object")) return set(r, GRAMMAR_JSON_OBJECT, NULL, "", "text.format", e);
    if (strcmp(t, "json_schema"))
        return oai_error_set(e, 400, "invalid_request_error", "invalid_value", "text.format.type",
                             "'text.format.type' is '%.40s'; it must be text, json_object or "
                             "json_schema",
                             t);
    return schema_fields(fmt, "text.format", r, e);
}

/* vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object. */
static int structured_outputs(const cJSON *so, struct oai_request *r, struct oai_error *e)
{
    if (!cJSON_IsObject(so))
        return bad(e, "structured_outputs", "'structured_outputs' must be an object");
    const cJSON *json = oai_field(so, "json"), *regex = oai_field(so, "regex"),
                *choice = oai_field(so, "choice"), *grammar = oai_field(so, "grammar"),
                *jobj = oai_field(so, "json_object");
    int given = !!json + !!regex + !!choice + !!grammar + (jobj && cJSON_IsTrue(jobj));
    if (given != 1)
        return bad(e, "structured_outputs",
                   "'structured_outputs' must have exactly one of json, regex, choice, grammar, "
                   "json_object");
    if (jobj && !cJSON_IsBool(jobj))
        return bad(e, "structured_outputs.json_object",
                   "'structured_outputs.json_object' must be a boolean");
    if (json) {
        if (cJSON_IsString(json)) {
            cJSON *parsed = cJSON_Parse(json->valuestring);
            if (!parsed)
                return bad(e, "structured_outputs.json",
                           "'structured_outputs.json' is a string that is not valid JSON");
            int rc = set(r, GRAMMAR_JSON_SCHEMA, parsed, NULL, "structured_outputs.json", e);
            cJSON_Delete(parsed);
            return rc;
        }
        if (!cJSON_IsObject(json))
            return bad(e, "structured_outputs.json",
                       "'structured_outputs.json' must be a schema (an object or its JSON text)");
        return set(r, GRAMMAR_JSON_SCHEMA, json, NULL, "structured_outputs.json", e);
    }
    if (regex) {
        if (!cJSON_IsString(regex) || !*regex->valuestring)
            return bad(e, "structured_outputs.regex",
                       "'structured_outputs.regex' must be a non-empty string");
        return set(r, GRAMMAR_REGEX, NULL, regex->valuestring, "structured_outputs.regex", e);
    }
    if (choice) {
        if (!cJSON_IsArray(choice) || !choice->child)
            return bad(e, "structured_outputs.choice",
                       "'structured_outputs.choice' must be a non-empty list of strings");
        const cJSON *x;
        cJSON_ArrayForEach(x, choice) if (!cJSON_IsString(x) || !*x->valuestring) return bad(
            e, "structured_outputs.choice",
            "'structured_outputs.choice' must hold only non-empty strings");
        return set(r, GRAMMAR_CHOICE, choice, NULL, "structured_outputs.choice", e);
    }
    if (grammar) {
        if (!cJSON_IsString(grammar) || !*grammar->valuestring)
            return bad(e, "structured_outputs.grammar",
                       "'structured_outputs.grammar' must be a non-empty string (GBNF)");
        return set(r, GRAMMAR_GBNF, NULL, grammar->valuestring, "structured_outputs.grammar", e);
    }
    return set(r, GRAMMAR_JSON_OBJECT, NULL, "", "structured_outputs.json_object", e);
}

int oai_parse_structured(const cJSON *root, struct oai_request *r, struct oai_error *e)
{
    const cJSON *rf = oai_field(root, "response_format"),
                *so = oai_field(root, "structured_outputs");
    int rc;
    if (rf && (rc = response_format(rf, r, e))) return rc;
    if (so) {
        if (r->constraint.kind >= 0)
            return bad(e, "structured_outputs",
                       "'structured_outputs' and 'response_format' cannot both constrain the "
                       "output");
        if ((rc = structured_outputs(so, r, e))) return rc;
    }
    /* the removed guided_* fields would otherwise be ignored silently */
    static const char *const old[] = {"guided_json", "guided_regex", "guided_choice",
                                      "guided_grammar"};
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++)
        if (oai_field(root, old[i]))
            return oai_error_set(e, 400, "invalid_request_error", "unsupported_parameter", old[i],
                                 "'%s' is not supported; use 'structured_outputs' (as vLLM since "
                                 "v0.12) or 'response_format'",
                                 old[i]);
    return 0;
}
