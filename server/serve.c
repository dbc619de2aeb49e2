/* serve: the engine calls the HTTP threads make, under the lock that lets the main thread take
 * the engine away at shutdown (serve.h). */
#include "serve.h"

#include "../engine/engine_state.h"

int serve_submit(struct serve *s, const struct gen_request *r, struct request **out,
                 struct qerr *err)
{
    pthread_rwlock_rdlock(&s->lock);
    int rc = s->engine ? engine_submit(s->engine, r, out, err)
                       : qerr_set(err, QERR_FULL, "the server is draining");
    pthread_rwlock_unlock(&s->lock);
    if (!rc) atomic_fetch_add(&s->inflight, 1);
    return rc;
}

void serve_release(struct serve *s, struct request *r, bool abort)
{
    if (!r) return;
    if (abort) request_abort(r);
    request_release(r);
    atomic_fetch_sub(&s->inflight, 1);
}

bool serve_stats(struct serve *s, struct engine_stats *st)
{
    pthread_rwlock_rdlock(&s->lock);
    bool have = s->engine != NULL;
    if (have) engine_get_stats(s->engine, st);
    pthread_rwlock_unlock(&s->lock);
    return have;
}

bool serve_engine_state(struct serve *s, struct engine_state *st)
{
    pthread_rwlock_rdlock(&s->lock);
    bool have = s->engine != NULL;
    if (have) engine_get_state(s->engine, st);
    pthread_rwlock_unlock(&s->lock);
    return have;
}
