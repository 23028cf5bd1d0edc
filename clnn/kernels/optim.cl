## optim.cl: one fused update kernel per optimizer, applied to one parameter buffer.
## Parameters:  dtype  float32 | float64 | float16 | bfloat16
##              gated  1: SGD and Adam read a mixed-precision step's loss-scale state on
##                     the device (below) and skip or unscale by it; Adam its step count
##                     there too
##              copy   none | float16 | bfloat16: the kernel also stores each updated
##                     weight in a 16-bit copy, rounded as clnn.cast rounds it (a
##                     mixed-precision step's weights for its next step, without the
##                     cast's launch and pass); a skipped step leaves the copy as it was
## Used by clnn/ops/optim.py. The arithmetic follows torch.optim's single-tensor code
## step by step, so results match it to rounding.
<%include file="_common.cl"/>
% if copy == "float16":
<%include file="_half.cl"/>
% elif copy == "bfloat16":
<%include file="_bf16.cl"/>
% endif
<%
    copy_t = {"float16": "half", "bfloat16": "ushort"}.get(copy)
%>
## the kernel's arguments for the copy, and the store of an updated weight to it
<%def name="copy_args()">\
% if copy_t:
                            __global ${copy_t} *wc, const int wc_off,
% endif
</%def>
<%def name="store(v, i)">\
% if copy_t:
        {
            const acc_t wn = ${v};       // computed once: the copy is the stored weight's
            CLNN_STORE(wn, w, w_off + ${i});
%   if copy == "float16":
            CLNN_HALF_STORE(wn, wc, wc_off + ${i});
%   else:
            CLNN_BF16_STORE_AT(__global, wn, wc, wc_off + ${i});
%   endif
        }
% else:
        CLNN_STORE(${v}, w, w_off + ${i});
% endif
</%def>

<%include file="_lossscale.cl"/>

// ---- Dynamic loss scaling on the device (_lossscale.cl has the state): updated by
// one work-item after each step from bad[bad_off], the count of its non-finite
// gradients (a reduction's), or the state's own CLNN_LS_MARK, which a mixed-precision
// step's gradient cast sets; either is 0 again afterwards. (cast.cl's checked cast can
// apply the same update itself, in its last work-group: one launch fewer.)
__kernel void clnn_loss_scale_update(__global float *bad, const int bad_off,
                                     __global float *state, const int st_off,
                                     __global int *count, const int count_off,
                                     const float growth, const float backoff,
                                     const int interval)
{
    if (get_global_id(0) != 0)
        return;
    const float found = bad[bad_off];
    bad[bad_off] = 0.0f;
    clnn_loss_scale_apply(state + st_off, found != 0.0f, count + count_off, growth,
                          backoff, interval);
}

## gs, the gradient's factor, and the gated kernels' skip (clnn_sgd_step's comment)
<%def name="gate_scale()">\
% if gated:
    if (state[st_off + CLNN_LS_FOUND] != 0.0f)
        return;
    const acc_t gs = scale / (acc_t)state[st_off + CLNN_LS_USED];
% else:
    const acc_t gs = scale;
% endif
</%def>
// torch.optim.SGD (dampening 0) on the gradient g = scale * grad + wd * w:
//   buf = momentum * buf + g;  d = nesterov ? g + momentum * buf : buf;  w -= lr * d
// (with momentum 0, buf is g: the plain step). Gated: nothing changes after a step
// whose gradients overflowed, and the others' factor is divided by the loss scale they
// were computed with (the host's own grad_scale / S, bitwise for a power-of-two S).
__kernel void clnn_sgd_step(const int n, const acc_t lr, const acc_t momentum,
                            const acc_t wd, const acc_t scale, const int nesterov,
% if gated:
                            __global const float *state, const int st_off,
% endif
                            __global const real_t *grad, const int g_off,
                            __global real_t *buf, const int b_off,
${copy_args()}\
                            __global real_t *w, const int w_off)
{
${gate_scale()}\
    CLNN_FOR_EACH(i, n) {
        const acc_t wi = CLNN_LOAD(w, w_off + i);
        acc_t g = gs * CLNN_LOAD(grad, g_off + i);
        if (wd != (acc_t)0)
            g += wd * wi;
        const acc_t b = momentum * CLNN_LOAD(buf, b_off + i) + g;
        CLNN_STORE(b, buf, b_off + i);
        const acc_t d = nesterov ? g + momentum * b : b;
${store("wi - lr * d", "i")}\
    }
}

// torch.optim.Adam / AdamW on the gradient g = scale * grad (+ wd * w for Adam):
//   AdamW first decays w *= 1 - lr wd;  m += (1 - beta1) (g - m);
//   v = beta2 v + (1 - beta2) g g;  w -= step_size * m / (sqrt(v) / bc2_sqrt + eps)
// with step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t) from the host.
// Gated: skipped or unscaled as SGD, t read from ``count`` (the loss-scale update
// counted this step in), and the bias corrections 1 - beta^t computed here as
// -expm1(t log beta) from the host's logarithms (1 - pown(beta2, t) in float would
// cancel: 0.999f is 2.4e-8 off 0.999, 2.4e-5 of 1 - beta2).
__kernel void clnn_adam_step(const int n, const acc_t lr, const acc_t beta1,
                             const acc_t beta2, const acc_t eps, const acc_t wd,
                             const acc_t scale, const int decoupled,
% if gated:
                             const acc_t log_beta1, const acc_t log_beta2,
                             __global const float *state, const int st_off,
                             __global const int *count, const int count_off,
% else:
                             const acc_t step_size, const acc_t bc2_sqrt,
% endif
                             __global const real_t *grad, const int g_off,
                             __global real_t *m, const int m_off,
                             __global real_t *v, const int v_off,
${copy_args()}\
                             __global real_t *w, const int w_off)
{
${gate_scale()}\
% if gated:
    const acc_t t = (acc_t)count[count_off];
    const acc_t step_size = lr / -expm1(t * log_beta1);
    const acc_t bc2_sqrt = sqrt(-expm1(t * log_beta2));
% endif
    CLNN_FOR_EACH(i, n) {
        acc_t wi = CLNN_LOAD(w, w_off + i);
        acc_t g = gs * CLNN_LOAD(grad, g_off + i);
        if (wd != (acc_t)0) {
            if (decoupled)
                wi *= (acc_t)1 - lr * wd;
            else
                g += wd * wi;
        }
        acc_t mi = CLNN_LOAD(m, m_off + i);
        mi += ((acc_t)1 - beta1) * (g - mi);
        const acc_t vi = beta2 * CLNN_LOAD(v, v_off + i) + ((acc_t)1 - beta2) * g * g;
        CLNN_STORE(mi, m, m_off + i);
        CLNN_STORE(vi, v, v_off + i);
        const acc_t denom = sqrt(vi) / bc2_sqrt + eps;
${store("wi - step_size * (mi / denom)", "i")}\
    }
}
