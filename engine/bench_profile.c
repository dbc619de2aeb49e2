#include "bench_profile.h"

#include "../kernels/backend_profile.h"

void bench_profile_print(FILE *out, const char *title, struct backend *prof, double step_s,
                         int steps, const struct bench_ceilings *c)
{
    size_t n;
    const struct profile_row *rows = backend_profile_rows(prof, &n);
    double in_ops = 0;
    for (size_t i = 0; i < n; i++) in_ops += rows[i].seconds;
    double per = steps > 0 ? 1.0 / steps : 1.0;
    fprintf(out, "\n%s: %.3f ms per step\n\n", title, step_s * 1e3);
    fprintf(out, "| op | shape | calls/step | µs/step | share | GB/s | G(FL)OP/s | of roofline |\n"
                 "|---|---|---:|---:|---:|---:|---:|---:|\n");
    for (size_t i = 0; i < n; i++) {
        const struct profile_row *r = &rows[i];
        double gbs = r->seconds > 0 ? r->bytes / r->seconds / 1e9 : 0;
        double gfs = r->seconds > 0 ? r->flops / r->seconds / 1e9 : 0;
        double roof = 0;
        if (c->read_gbs > 0 && r->bytes > 0) roof = gbs / c->read_gbs;
        if (c->peak_gops > 0 && r->flops > 0 && gfs / c->peak_gops > roof)
            roof = gfs / c->peak_gops;
        char gb[24] = "-", gf[24] = "-", rf[24] = "-";
        if (r->bytes > 0) snprintf(gb, sizeof gb, "%.1f", gbs);
        if (r->flops > 0) snprintf(gf, sizeof gf, "%.1f", gfs);
        if (roof > 0) snprintf(rf, sizeof rf, "%.0f %%", roof * 100);
        fprintf(out, "| %s | %s | %.1f | %.1f | %.1f %% | %s | %s | %s |\n", r->op, r->shape,
                (double)r->calls * per, r->seconds * per * 1e6,
                step_s > 0 ? 100.0 * r->seconds * per / step_s : 0, gb, gf, rf);
    }
    double outside = step_s - in_ops * per;
    fprintf(out, "| outside the ops (sampling, scheduling, host) | | | %.1f | %.1f %% | | | |\n",
            outside * 1e6, step_s > 0 ? 100.0 * outside / step_s : 0);
    if (c->read_gbs > 0 && c->peak_gops > 0)
        fprintf(out, "\nroofline: read %.1f GB/s, %s %.0f G(FL)OP/s (measured now)\n", c->read_gbs,
                c->peak_what ? c->peak_what : "peak", c->peak_gops);
    else if (c->read_gbs > 0) /* a device whose compute peak was not measured */
        fprintf(out, "\nroofline: read %.1f GB/s (measured now); compute peak not measured\n",
                c->read_gbs);
}
