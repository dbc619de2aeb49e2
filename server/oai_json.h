/* oai_json: reading a request's JSON members. Every member looked up is marked as read, so that
 * oai_parse can name the top-level members nothing read: the request log's `ignored=`, as vLLM
 * logs the fields it ignores (a client that sends typical_p to a server that has none learns it
 * from the operator's log, not from silently different output). */
#ifndef QUERN_OAI_JSON_H
#define QUERN_OAI_JSON_H

#include <cjson/cJSON.h>

/* A type flag of ours, above cJSON's own (cJSON_IsReference 256, cJSON_StringIsConst 512):
 * cJSON masks the type with 0xFF wherever it asks what an item is. */
#define OAI_JSON_READ (1 << 12)

/* The member named key, or NULL when absent or null; the member, null or not, is marked read. */
static inline const cJSON *oai_field(const cJSON *obj, const char *key)
{
    cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v) return NULL;
    v->type |= OAI_JSON_READ;
    return cJSON_IsNull(v) ? NULL : v;
}

#endif
