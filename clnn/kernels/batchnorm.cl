## batchnorm.cl: batch normalisation over (N, C, HW) arrays (HW = 1 for BatchNorm1d).
## Parameters:  dtype  float32 | float64 | float16 | bfloat16
##              act    the activation fused after the affine map (clnn.ACTIVATIONS)
##              wg     work-items per channel in the per-channel reductions (a power of 2;
##                     1 on CPUs: a work-item per channel, see below)
## Used by clnn/ops/batchnorm.py. Statistics (mean, biased variance) and the running
## statistics are kept in acc_t, the arithmetic type (float32 for float16 storage).
<%include file="_common.cl"/>
<%include file="_activation.cl" args="act=act, vector=cpu_lanes if wg == 1 else 0"/>
// element m = n * HW + p of channel c lies at n * C * HW + c * HW + p
#define CLNN_AT(m) (((m) / HW) * (C * HW) + c * HW + (m) % HW)
<% accv = f"{acc}{cpu_lanes}" %>
// CPUs (wg = 1). A work-group of 64 per channel with a tree between barriers is a
// GPU's shape; PoCL runs a group as loops split at each barrier, and the element
// index's division per element kept it from vectorising (3.5 GB/s forward, 1.8 for
// the statistics, on a 32 x 64 x 56 x 56 batch). Here a work-item takes a whole
// channel for the sums, walking each image's plane of HW contiguous elements ${cpu_lanes} at
// a time (${cpu_lanes} partial sums side by side, added up in a fixed order at the end), and
// the element-wise passes take whole planes, whose channel (so mean, scale and shift) is
// one per plane. Inputs with planes shorter than ${cpu_lanes} (BatchNorm1d) take the tails.

<%def name="tree(buf)">
    barrier(CLK_LOCAL_MEM_FENCE);
% for s in [wg >> (j + 1) for j in range(wg.bit_length() - 1)]:
    if (l < ${s})
        ${buf}[l] += ${buf}[l + ${s}];
    barrier(CLK_LOCAL_MEM_FENCE);
% endfor
</%def>

// One work-group per channel: the mean, then the mean squared deviation from it (two
// passes over the channel, as accurate as a float64 one-pass sum would not be in
// float32). Work-item l folds m = l, l + wg, ...; the wg partial sums meet in a tree
// in fixed pairs, so the result is bitwise the same on every run.
//   stats[s_off + c] = mean,  stats[s_off + C + c] = biased variance
__kernel __attribute__((reqd_work_group_size(${wg}, 1, 1)))
void clnn_bn_stats(const int N, const int C, const int HW,
                   __global const real_t *x, const int x_off,
                   __global acc_t *stats, const int s_off)
{
% if wg == 1:
    const int c = (int)get_group_id(0);
    const acc_t M = (acc_t)(N * HW);
    ${accv} sv = (${accv})0;
    acc_t s1 = (acc_t)0;
    for (int n = 0; n < N; ++n) {
        __global const real_t *px = x + x_off + (n * C + c) * HW;
        int j = 0;
        for (; j + ${cpu_lanes} <= HW; j += ${cpu_lanes})
            sv += CLNN_LOADV(${cpu_lanes}, px + j);
        for (; j < HW; ++j)
            s1 += CLNN_LOAD(px, j);
    }
    const acc_t mean = (clnn_lanes_sum${cpu_lanes}(sv) + s1) / M;
    sv = (${accv})0;
    s1 = (acc_t)0;
    for (int n = 0; n < N; ++n) {
        __global const real_t *px = x + x_off + (n * C + c) * HW;
        int j = 0;
        for (; j + ${cpu_lanes} <= HW; j += ${cpu_lanes}) {
            const ${accv} d = CLNN_LOADV(${cpu_lanes}, px + j) - mean;
            sv += d * d;
        }
        for (; j < HW; ++j) {
            const acc_t d = CLNN_LOAD(px, j) - mean;
            s1 += d * d;
        }
    }
    stats[s_off + c] = mean;
    stats[s_off + C + c] = (clnn_lanes_sum${cpu_lanes}(sv) + s1) / M;
% else:
    __local acc_t part[${wg}];
    const int c = (int)get_group_id(0), l = (int)get_local_id(0);
    const int M = N * HW;
    acc_t acc = (acc_t)0;
    for (int m = l; m < M; m += ${wg})
        acc += CLNN_LOAD(x, x_off + CLNN_AT(m));
    part[l] = acc;
${tree("part")}
    const acc_t mean = part[0] / (acc_t)M;
    barrier(CLK_LOCAL_MEM_FENCE);            // everyone has read part[0]
    acc = (acc_t)0;
    for (int m = l; m < M; m += ${wg}) {
        const acc_t d = CLNN_LOAD(x, x_off + CLNN_AT(m)) - mean;
        acc += d * d;
    }
    part[l] = acc;
${tree("part")}
    if (l == 0) {
        stats[s_off + c] = mean;
        stats[s_off + C + c] = part[0] / (acc_t)M;
    }
% endif
}

// out = f(gamma (x - mean) / sqrt(var + eps) + beta), mean and var per channel
// (the batch's in training, the running statistics in evaluation); affine = 0 is
// gamma = 1, beta = 0 (w and b are not read).
__kernel void clnn_bn_forward(const int n, const int C, const int HW, const acc_t eps,
                              const acc_t p, const acc_t q, const int affine,
                              __global const real_t *x, const int x_off,
                              __global const acc_t *mean, const int m_off,
                              __global const acc_t *var, const int v_off,
                              __global const real_t *w, const int w_off,
                              __global const real_t *b, const int b_off,
                              __global real_t *out, const int out_off)
{
% if wg == 1:
    if (HW >= ${cpu_lanes}) {               // (CPUs: a plane of one channel per step, see above)
        CLNN_FOR_EACH(t, n / HW) {
            const int c = t % C;
            const acc_t m = mean[m_off + c], inv = (acc_t)1 / sqrt(var[v_off + c] + eps);
            const acc_t g = affine ? CLNN_LOAD(w, w_off + c) : (acc_t)1;
            const acc_t sh = affine ? CLNN_LOAD(b, b_off + c) : (acc_t)0;
            __global const real_t *px = x + x_off + t * HW;
            __global real_t *po = out + out_off + t * HW;
            int j = 0;
            for (; j + ${cpu_lanes} <= HW; j += ${cpu_lanes})
                CLNN_STOREV(${cpu_lanes}, clnn_f${cpu_lanes}(g * ((CLNN_LOADV(${cpu_lanes}, px + j) - m) * inv) + sh, p, q),
                            po + j);
            for (; j < HW; ++j)
                CLNN_STORE(clnn_f(g * ((CLNN_LOAD(px, j) - m) * inv) + sh, p, q), po, j);
        }
        return;
    }
% endif
    CLNN_FOR_EACH(i, n) {
        const int c = (i / HW) % C;
        acc_t y = (CLNN_LOAD(x, x_off + i) - mean[m_off + c]) / sqrt(var[v_off + c] + eps);
        if (affine)
            y = CLNN_LOAD(w, w_off + c) * y + CLNN_LOAD(b, b_off + c);
        CLNN_STORE(clnn_f(y, p, q), out, out_off + i);
    }
}

// The backward pass's two sums per channel, one work-group each, from dy = dL/dy
// (before the affine map's input) and x-hat = (x - mean) / sqrt(var + eps):
//   sums[c] = sum dy  (= dL/dbeta),  sums[C + c] = sum dy x-hat  (= dL/dgamma)
// and, when affine, the same into the parameters' gradients gw[c] and gb[c].
__kernel __attribute__((reqd_work_group_size(${wg}, 1, 1)))
void clnn_bn_backward_sums(const int N, const int C, const int HW, const acc_t eps,
                           const int affine,
                           __global const real_t *dy, const int dy_off,
                           __global const real_t *x, const int x_off,
                           __global const acc_t *stats, const int s_off,
                           __global acc_t *sums, const int sums_off,
                           __global real_t *gw, const int gw_off,
                           __global real_t *gb, const int gb_off)
{
% if wg == 1:
    const int c = (int)get_group_id(0);
    const acc_t mean = stats[s_off + c];
    ${accv} av = (${accv})0, axv = (${accv})0;
    acc_t a1 = (acc_t)0, ax1 = (acc_t)0;
    for (int n = 0; n < N; ++n) {
        __global const real_t *pd = dy + dy_off + (n * C + c) * HW;
        __global const real_t *px = x + x_off + (n * C + c) * HW;
        int j = 0;
        for (; j + ${cpu_lanes} <= HW; j += ${cpu_lanes}) {
            const ${accv} d = CLNN_LOADV(${cpu_lanes}, pd + j);
            av += d;
            axv += d * (CLNN_LOADV(${cpu_lanes}, px + j) - mean);
        }
        for (; j < HW; ++j) {
            const acc_t d = CLNN_LOAD(pd, j);
            a1 += d;
            ax1 += d * (CLNN_LOAD(px, j) - mean);
        }
    }
    const acc_t sum_dy = clnn_lanes_sum${cpu_lanes}(av) + a1;
    const acc_t sum_dyx = (clnn_lanes_sum${cpu_lanes}(axv) + ax1) / sqrt(stats[s_off + C + c] + eps);
    sums[sums_off + c] = sum_dy;
    sums[sums_off + C + c] = sum_dyx;
    if (affine) {
        CLNN_STORE(sum_dyx, gw, gw_off + c);
        CLNN_STORE(sum_dy, gb, gb_off + c);
    }
% else:
    __local acc_t part_dy[${wg}];
    __local acc_t part_dyx[${wg}];
    const int c = (int)get_group_id(0), l = (int)get_local_id(0);
    const int M = N * HW;
    const acc_t mean = stats[s_off + c];
    acc_t a = (acc_t)0, ax = (acc_t)0;
    for (int m = l; m < M; m += ${wg}) {
        const int k = CLNN_AT(m);
        const acc_t d = CLNN_LOAD(dy, dy_off + k);
        a += d;
        ax += d * (CLNN_LOAD(x, x_off + k) - mean);
    }
    part_dy[l] = a;
    part_dyx[l] = ax;
    barrier(CLK_LOCAL_MEM_FENCE);
% for s in [wg >> (j + 1) for j in range(wg.bit_length() - 1)]:
    if (l < ${s}) {
        part_dy[l] += part_dy[l + ${s}];
        part_dyx[l] += part_dyx[l + ${s}];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
% endfor
    if (l == 0) {
        const acc_t sum_dy = part_dy[0];
        const acc_t sum_dyx = part_dyx[0] / sqrt(stats[s_off + C + c] + eps);
        sums[sums_off + c] = sum_dy;
        sums[sums_off + C + c] = sum_dyx;
        if (affine) {
            CLNN_STORE(sum_dyx, gw, gw_off + c);
            CLNN_STORE(sum_dy, gb, gb_off + c);
        }
    }
% endif
}

// dx from dy = dL/dy with the batch statistics (training mode):
//   dx = gamma / sqrt(var + eps) (dy - sum dy / M - x-hat sum(dy x-hat) / M)
__kernel void clnn_bn_backward_data(const int n, const int C, const int HW, const int M,
                                    const acc_t eps, const int affine,
                                    __global const real_t *dy, const int dy_off,
                                    __global const real_t *x, const int x_off,
                                    __global const acc_t *stats, const int s_off,
                                    __global const acc_t *sums, const int sums_off,
                                    __global const real_t *w, const int w_off,
                                    __global real_t *dx, const int dx_off)
{
% if wg == 1:
    if (HW >= ${cpu_lanes}) {               // (CPUs: a plane of one channel per step, see above)
        CLNN_FOR_EACH(t, n / HW) {
            const int c = t % C;
            const acc_t invstd = (acc_t)1 / sqrt(stats[s_off + C + c] + eps);
            const acc_t mean = stats[s_off + c];
            const acc_t g = (affine ? CLNN_LOAD(w, w_off + c) : (acc_t)1) * invstd;
            const acc_t mdy = sums[sums_off + c] / (acc_t)M;
            const acc_t mdyx = sums[sums_off + C + c] / (acc_t)M;
            __global const real_t *pd = dy + dy_off + t * HW;
            __global const real_t *px = x + x_off + t * HW;
            __global real_t *po = dx + dx_off + t * HW;
            int j = 0;
            for (; j + ${cpu_lanes} <= HW; j += ${cpu_lanes}) {
                const ${accv} xhat = (CLNN_LOADV(${cpu_lanes}, px + j) - mean) * invstd;
                CLNN_STOREV(${cpu_lanes}, g * (CLNN_LOADV(${cpu_lanes}, pd + j) - mdy - xhat * mdyx), po + j);
            }
            for (; j < HW; ++j) {
                const acc_t xhat = (CLNN_LOAD(px, j) - mean) * invstd;
                CLNN_STORE(g * (CLNN_LOAD(pd, j) - mdy - xhat * mdyx), po, j);
            }
        }
        return;
    }
% endif
    CLNN_FOR_EACH(i, n) {
        const int c = (i / HW) % C;
        const acc_t invstd = (acc_t)1 / sqrt(stats[s_off + C + c] + eps);
        const acc_t xhat = (CLNN_LOAD(x, x_off + i) - stats[s_off + c]) * invstd;
        const acc_t g = affine ? CLNN_LOAD(w, w_off + c) : (acc_t)1;
        const acc_t d = CLNN_LOAD(dy, dy_off + i) - sums[sums_off + c] / (acc_t)M
                        - xhat * (sums[sums_off + C + c] / (acc_t)M);
        CLNN_STORE(g * invstd * d, dx, dx_off + i);
    }
}

// The running statistics, PyTorch's convention: r = (1 - f) r + f batch statistic,
// the variance's unbiased (times M / (M - 1)).
__kernel void clnn_bn_update_running(const int n, const acc_t f, const acc_t unbias,
                                     __global const acc_t *stats, const int s_off,
                                     __global acc_t *rmean, const int rm_off,
                                     __global acc_t *rvar, const int rv_off)
{
    CLNN_FOR_EACH(c, n) {
        rmean[rm_off + c] = ((acc_t)1 - f) * rmean[rm_off + c] + f * stats[s_off + c];
        rvar[rv_off + c] = ((acc_t)1 - f) * rvar[rv_off + c] + f * unbias * stats[s_off + n + c];
    }
}
