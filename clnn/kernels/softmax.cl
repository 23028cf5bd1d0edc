## softmax.cl: row-wise softmax, log-softmax and softmax cross-entropy with its gradient.
## Parameters:  dtype  float32 | float64 | float16 | bfloat16
##              wg     0: a work-item per row (CPUs, and rows too short to share)
##                     WG: a work-group of WG work-items per row (GPUs), entries *_wg
##              dscale 1: the cross-entropy's gradient also times scale_by[sb_off], a float
##                     on the device (a mixed-precision step's loss scale, nn/amp.py)
##              head   0, or WG: also clnn_softmax_xent_head, a small batch's cross-entropy
##                     in one work-group of WG (_head.cl); lossout acc | real, the type
##                     its mean loss is stored in
## Used by clnn/ops/softmax.py.
<%include file="_common.cl"/>
//
// Rows of cols elements ``inner`` apart (softmax along any axis of an array seen as
// (outer, cols, inner): row r = o * inner + i starts at o * cols * inner + i; the
// last axis is inner = 1), one work-item per row: three passes over the row
// (max, sum of exponentials, write), so exp never sees a positive argument and rows
// of 1e4 do not overflow. A row is summed in one fixed order: results are bitwise
// reproducible.
//
#define CLNN_FOR_EACH_ROW(r, rows) for (int r = (int)get_global_id(0); r < (rows); r += (int)get_global_size(0))

// max and log(sum(exp(x - max))) of one row, its elements ``step`` apart
inline void clnn_row_stats(__global const real_t *x, const int base, const int cols,
                           const int step, acc_t *m_out, acc_t *lse_out)
{
    acc_t m = (acc_t)(-INFINITY);
    for (int j = 0; j < cols; ++j)
        m = fmax(m, CLNN_LOAD(x, base + j * step));
    acc_t s = (acc_t)0;
    for (int j = 0; j < cols; ++j)
        s += exp(CLNN_LOAD(x, base + j * step) - m);
    *m_out = m;
    *lse_out = log(s);
}

#ifdef CLNN_CPU
// A contiguous row on a CPU, ${cpu_lanes} elements at a time, so exp runs in its vector form
// (PoCL calls the scalar one once per element): the max and the sum of exponentials
// in ${cpu_lanes} lanes, folded in a fixed order (neighbouring lanes first), then the last
// cols % ${cpu_lanes} elements.
<%
    L = cpu_lanes
    vL = f"{acc}{L}"
    def fold(v, op, lo=0, n=L):
        # lanes lo .. lo + n - 1 of v, neighbours first: ((s0 op s1) op (s2 op s3)) ...
        if n == 1:
            return f"{v}.s{lo}"
        a, b = fold(v, op, lo, n // 2), fold(v, op, lo + n // 2, n // 2)
        return f"{op}({a}, {b})" if op else f"({a} + {b})"
%>
inline void clnn_row_stats_v(__global const real_t *x, const int base, const int cols,
                             acc_t *m_out, acc_t *lse_out)
{
    const int cv = cols / ${L} * ${L};
    ${vL} mv = (${vL})(-INFINITY);
    for (int j = 0; j < cv; j += ${L})
        mv = fmax(mv, CLNN_LOADV(${L}, x + base + j));
    acc_t m = ${fold("mv", "fmax")};
    for (int j = cv; j < cols; ++j)
        m = fmax(m, CLNN_LOAD(x, base + j));
    ${vL} sv = (${vL})0;
    for (int j = 0; j < cv; j += ${L})
        sv += exp(CLNN_LOADV(${L}, x + base + j) - m);
    acc_t s = ${fold("sv", None)};
    for (int j = cv; j < cols; ++j)
        s += exp(CLNN_LOAD(x, base + j) - m);
    *m_out = m;
    *lse_out = log(s);
}
#endif

<%def name="rowwise(entry, value)">
__kernel void ${entry}(const int rows, const int cols, const int inner,
                       __global const real_t *x, const int x_off,
                       __global real_t *out, const int out_off)
{
    CLNN_FOR_EACH_ROW(r, rows) {
        const int base = (r / inner) * cols * inner + r % inner;
        acc_t m, lse;
#ifdef CLNN_CPU
        if (inner == 1 && cols >= 16) {       // a contiguous row: vectors of ${cpu_lanes}
            clnn_row_stats_v(x, x_off + base, cols, &m, &lse);
            const int cv = cols / ${cpu_lanes} * ${cpu_lanes};
            for (int j = 0; j < cv; j += ${cpu_lanes}) {
                const ${acc}${cpu_lanes} v = CLNN_LOADV(${cpu_lanes}, x + x_off + base + j);
                CLNN_STOREV(${cpu_lanes}, ${value}, out + out_off + base + j);
            }
            for (int j = cv; j < cols; ++j) {
                const acc_t v = CLNN_LOAD(x, x_off + base + j);
                CLNN_STORE(${value}, out, out_off + base + j);
            }
            continue;
        }
#endif
        clnn_row_stats(x, x_off + base, cols, inner, &m, &lse);
        for (int j = 0; j < cols; ++j) {
            const acc_t v = CLNN_LOAD(x, x_off + base + j * inner);
            CLNN_STORE(${value}, out, out_off + base + j * inner);
        }
    }
}
</%def>
// out = exp(x - max) / sum(exp(x - max)) along each row
${rowwise("clnn_softmax", "exp(v - m - lse)")}
// out = x - max - log(sum(exp(x - max))) along each row
${rowwise("clnn_log_softmax", "v - m - lse")}
// Softmax cross-entropy of logits z against target distributions y, fused with its
// gradient:  loss_row[r] = sum_j y[r,j] * (logsumexp(z[r]) - z[r,j])
//            dz[r,j]     = (softmax(z[r])_j * sum(y[r]) - y[r,j]) * grad_scale
// (grad_scale is 1/batch for a mean). sum(y[r]) is 1 for a distribution, but targets
// need not be one (PyTorch takes any); without it dz is not the loss's gradient.
// The routine sums loss_row (kept in acc_t) into the mean loss.
<%def name="xent_row()">\
        acc_t m, lse;
        clnn_row_stats(z, z_off + r * cols, cols, 1, &m, &lse);
        acc_t loss_r = (acc_t)0, sy = (acc_t)0;
        for (int j = 0; j < cols; ++j)
            sy += CLNN_LOAD(y, y_off + r * cols + j);
        for (int j = 0; j < cols; ++j) {
            const acc_t zj = CLNN_LOAD(z, z_off + r * cols + j) - m - lse;
            const acc_t yj = CLNN_LOAD(y, y_off + r * cols + j);
            // 0 * log(0) is 0 for a target that puts no mass on j
            loss_r -= yj != (acc_t)0 ? yj * zj : (acc_t)0;
            CLNN_STORE((exp(zj) * sy - yj) * gs, dz, dz_off + r * cols + j);
        }
</%def>
__kernel void clnn_softmax_xent(const int rows, const int cols, const acc_t grad_scale,
% if dscale:
                                __global const float *scale_by, const int sb_off,
% endif
                                __global const real_t *z, const int z_off,
                                __global const real_t *y, const int y_off,
                                __global real_t *dz, const int dz_off,
                                __global acc_t *loss_row)
{
    const acc_t gs = grad_scale${" * (acc_t)scale_by[sb_off]" if dscale else ""};
    CLNN_FOR_EACH_ROW(r, rows) {
${xent_row()}\
        loss_row[r] = loss_r;
    }
}
% if head:

// ---- a small batch: the rows, the mean loss and the bias gradient in one launch
<%include file="_wg.cl" args="wg=head"/>
<%namespace name="hd" file="_head.cl"/>
${hd.head_kernel("clnn_softmax_xent", "z", "dz", xent_row)}
% endif
% if wg:

// ---- GPUs: a work-group of ${wg} per row. Each work-item strides over the row (so
// neighbours read neighbouring addresses), and the row's max and sum of exponentials
// come from work-group reductions in a fixed order (_wg.cl).
<%include file="_wg.cl" args="wg=wg"/>
#define CLNN_FOR_EACH_ROW_WG(r, rows) for (int r = (int)get_group_id(0); r < (rows); r += (int)get_num_groups(0))
#define CLNN_FOR_EACH_COL(j, cols) for (int j = (int)get_local_id(0); j < (cols); j += CLNN_WG)

inline void clnn_row_stats_wg(__local acc_t *scratch, __global const real_t *x,
                              const int base, const int cols, const int step,
                              acc_t *m_out, acc_t *lse_out)
{
    acc_t m = (acc_t)(-INFINITY);
    CLNN_FOR_EACH_COL(j, cols)
        m = fmax(m, CLNN_LOAD(x, base + j * step));
    m = clnn_wg_max(scratch, m);
    acc_t s = (acc_t)0;
    CLNN_FOR_EACH_COL(j, cols)
        s += exp(CLNN_LOAD(x, base + j * step) - m);
    *m_out = m;
    *lse_out = log(clnn_wg_sum(scratch, s));
}

<%def name="rowwise_wg(entry, value)">
__kernel __attribute__((reqd_work_group_size(CLNN_WG, 1, 1)))
void ${entry}(const int rows, const int cols, const int inner,
              __global const real_t *x, const int x_off,
              __global real_t *out, const int out_off)
{
    __local acc_t scratch[CLNN_WG];
    CLNN_FOR_EACH_ROW_WG(r, rows) {
        const int base = (r / inner) * cols * inner + r % inner;
        acc_t m, lse;
        clnn_row_stats_wg(scratch, x, x_off + base, cols, inner, &m, &lse);
        CLNN_FOR_EACH_COL(j, cols) {
            const acc_t v = CLNN_LOAD(x, x_off + base + j * inner);
            CLNN_STORE(${value}, out, out_off + base + j * inner);
        }
    }
}
</%def>
${rowwise_wg("clnn_softmax_wg", "exp(v - m - lse)")}
${rowwise_wg("clnn_log_softmax_wg", "v - m - lse")}
__kernel __attribute__((reqd_work_group_size(CLNN_WG, 1, 1)))
void clnn_softmax_xent_wg(const int rows, const int cols, const acc_t grad_scale,
% if dscale:
                          __global const float *scale_by, const int sb_off,
% endif
                          __global const real_t *z, const int z_off,
                          __global const real_t *y, const int y_off,
                          __global real_t *dz, const int dz_off,
                          __global acc_t *loss_row)
{
    __local acc_t scratch[CLNN_WG];
    const acc_t gs = grad_scale${" * (acc_t)scale_by[sb_off]" if dscale else ""};
    CLNN_FOR_EACH_ROW_WG(r, rows) {
        acc_t m, lse;
        clnn_row_stats_wg(scratch, z, z_off + r * cols, cols, 1, &m, &lse);
        acc_t loss = (acc_t)0, sy = (acc_t)0;
        CLNN_FOR_EACH_COL(j, cols)
            sy += CLNN_LOAD(y, y_off + r * cols + j);
        sy = clnn_wg_sum(scratch, sy);
        CLNN_FOR_EACH_COL(j, cols) {
            const acc_t zj = CLNN_LOAD(z, z_off + r * cols + j) - m - lse;
            const acc_t yj = CLNN_LOAD(y, y_off + r * cols + j);
            loss -= yj != (acc_t)0 ? yj * zj : (acc_t)0;
            CLNN_STORE((exp(zj) * sy - yj) * gs, dz, dz_off + r * cols + j);
        }
        loss = clnn_wg_sum(scratch, loss);
        if (get_local_id(0) == 0)
            loss_row[r] = loss;
    }
}
% endif
