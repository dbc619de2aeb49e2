/* eval: the statistics `quern eval` reports, over scored token positions, as llama.cpp's
 * perplexity tool defines them:
 *   - perplexity: exp(mean over positions of -log p(next token)), with its uncertainty;
 *   - against a reference model's logits at the same positions (llama.cpp --kl-divergence):
 *     mean KL(P_ref || P_model) = sum_v p_ref(v) (log p_ref(v) - log p_model(v)), its median,
 *     99th percentile and maximum; top-1 agreement (argmax equal); Δp = p_model(next) -
 *     p_ref(next), its mean and RMS.
 * Log-probabilities are log-softmax of the logits, accumulated in double. */
#ifndef QUERN_EVAL_H
#define QUERN_EVAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../quant/qerr.h"

struct eval_stats {
    int vocab;
    bool has_ref;
    uint64_t n;               /* positions scored */
    double nll, nll2;         /* sums of -log p and its square (model) */
    double nll_ref, nll_ref2; /* the same for the reference */
    double kl, kl2;           /* sums of KL and its square */
    uint64_t same_top;        /* positions whose argmax agrees */
    double dp, dp2;           /* sums of Δp and its square */
    float *kls;               /* [n] every KL, for percentiles */
    size_t kls_cap;
    float *lp, *lp_ref; /* [vocab] scratch log-probabilities */
};

struct eval_summary {
    uint64_t n;
    double ppl, ppl_err;         /* perplexity and its standard error */
    double ppl_ref, ppl_ref_err; /* has_ref only, from here on */
    double kl_mean, kl_err, kl_median, kl_p99, kl_max;
    double top1, top1_err; /* fraction of positions, and its standard error */
    double dp_mean, dp_rms;
};

int eval_stats_init(struct eval_stats *s, int vocab, bool has_ref, struct qerr *err);
void eval_stats_free(struct eval_stats *s);

/* Scores one position: logits[vocab] of the model (and ref_logits[vocab] of the reference when
 * has_ref) predicting token next. */
int eval_stats_add(struct eval_stats *s, const float *logits, const float *ref_logits, int32_t next,
                   struct qerr *err);

/* Summary of what was added; sorts the stored KLs. */
void eval_stats_summarize(struct eval_stats *s, struct eval_summary *out);

#endif
